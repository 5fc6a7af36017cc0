"""Envs over HTTP: the server (``python -m envs.serving.serve``), its limits (limits.py) and
the ``ragen/Remote-v0`` client (remote.py)."""
