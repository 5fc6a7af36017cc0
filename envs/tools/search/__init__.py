"""SearchQA: the env (env.py), its encyclopaedia (encyclopedia.py), the retrievers
(retrieval.py) and their HTTP server (server.py)."""
