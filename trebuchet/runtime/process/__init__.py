"""Processes: identity, groups, signals, containment, and why one could not start."""
