"""The Kubernetes engine, in one folder: engine.py (BACKEND: an indexed Job, a headless
Service and the agent's ConfigMap; hand-over, following the Job and its pods), options.py
(the `kubernetes:` block), code.py (the code snapshot as the ConfigMap's code.tar.gz).

Empty on purpose: the registry imports engine.py or options.py, each only when needed.
"""
