"""Sokoban: the env (env.py), its level generators (generate.py, ragen.py), its board text
(text.py)."""
