"""The local engine, in one folder: engine.py (BACKEND: simulated nodes on this machine,
supervised by cli/supervise.py), sweep.py (a sweep: at most sweep_parallel runs at once,
and its driver, `python -m trebuchet.backends.local.sweep SWEEP_FILE`). It has no spec block.

Empty on purpose: the registry imports engine.py only when needed.
"""
