"""`arbor-engine`: the command line (main)."""
