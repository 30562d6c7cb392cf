"""Conformance tests: the official e2b SDK against the local emulator."""
