"""Turning a spec into processes: plans, the supervisor, log following."""
