"""Clients of E2B's two APIs: the control plane (REST) and envd (Connect RPC and /files)."""
