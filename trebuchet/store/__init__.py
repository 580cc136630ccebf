"""Where runs are recorded: the SQLite index and the run directories."""
