"""DeepCoder: the env (env.py), its problems (problems.py) and the sandbox that runs the
candidates (sandbox.py, _seccomp.py)."""
