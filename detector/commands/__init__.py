"""Sub-commands of the hpcsec command line, one module each."""
