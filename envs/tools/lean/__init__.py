"""Lean: the env (env.py) and the Lean servers that check its proofs (backends.py)."""
