"""The run directory as the runtime reads and writes it: whole records, regular files only."""
