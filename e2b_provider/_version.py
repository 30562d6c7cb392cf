"""The package version, and nothing else."""

__version__ = "0.1.0"
