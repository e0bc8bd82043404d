"""What lasts: the conversation store (store, SQLite), the checkpoint store in RAM and on
disk (checkpoints), import and export (transfer, formats) and the installation's key that
signs session files and checkpoints (keyfile)."""
