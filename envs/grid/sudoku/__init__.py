"""Sudoku: the env (env.py) and its solver and puzzle generator (solver.py)."""
