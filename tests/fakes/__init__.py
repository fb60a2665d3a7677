"""Stand-ins for hardware libraries that cannot run here, behind their real Python wrappers."""
