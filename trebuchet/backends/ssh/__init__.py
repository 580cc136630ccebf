"""The ssh engine, in one folder: engine.py (BACKEND: one node agent per host over the
system ssh, supervised on the submitting machine; `python -m
trebuchet.backends.ssh.engine RUN_DIR` is a detached run's supervisor), options.py (the
`ssh:` block).

Empty on purpose: the registry imports engine.py or options.py, each only when needed.
"""
