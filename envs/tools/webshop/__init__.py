"""WebShop: the env (env.py), its catalogue (catalogue.py) and purchase reward (reward.py)."""
