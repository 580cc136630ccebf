"""The job's life above its node agents, decided once for every engine."""
