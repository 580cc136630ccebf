"""The Kubernetes engine, in one folder. Empty on purpose: the registry imports engine.py or
options.py, each only when needed."""
