"""Node sensors, one module per source (see registry.py)."""
