"""The ssh engine, in one folder: engine.py (BACKEND: checks, render, submit; one node
agent per host over the system ssh), script.py (the ssh command line and the node script
each session runs on its host), run.py (the supervisor on the submitting machine: the
sessions, driven by the one job controller; `python -m trebuchet.backends.ssh.run RUN_DIR`
is a detached run's), options.py (the `ssh:` block).

Empty on purpose: the registry imports engine.py or options.py, each only when needed.
"""
