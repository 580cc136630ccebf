"""Workload environments (venv, conda prefix, container image) and GPU masks."""
