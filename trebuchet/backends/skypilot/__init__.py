"""The SkyPilot engine, in one folder: engine.py (BACKEND: the task YAML, hand-over to
SkyPilot's API, logs), options.py (the `skypilot:` block), state.py (runs' states from
SkyPilot's API, in batches).

Empty on purpose: the registry imports engine.py or options.py, each only when needed.
"""
