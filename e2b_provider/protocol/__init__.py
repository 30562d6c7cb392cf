"""The sans-IO core: wire formats, plans and scripts as pure values; no sockets, no threads."""
