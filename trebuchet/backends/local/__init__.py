"""The local engine, in one folder. Empty on purpose: the registry imports engine.py only
when needed."""
