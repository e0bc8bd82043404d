"""What lasts: the conversation store (store, over the SQLite file of database and the SQL of
rows), the checkpoint store in RAM and on disk (checkpoints), import and export (transfer,
formats) and the installation's key that signs session files and checkpoints (keyfile)."""
