"""What trebuchet's processes hand each other: the job file, the records, the rank's
environment, secrets."""
