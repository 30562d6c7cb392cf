"""The code-interpreter server a code-interpreter sandbox runs on port 49999 (E2B's API)."""
