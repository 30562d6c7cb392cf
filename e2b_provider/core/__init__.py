"""What every part shares: the provider context, the run engine, leases, file agents, reboots."""
