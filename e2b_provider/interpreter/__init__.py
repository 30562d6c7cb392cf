"""The code interpreter: stateful Python and Bash kernels in a sandbox, with rich results."""
