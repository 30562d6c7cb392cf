"""The ports resource: addresses of sandbox ports and the local port-forward relay."""
