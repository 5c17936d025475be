"""Subcommands of ``python -m bridge_ray``."""
