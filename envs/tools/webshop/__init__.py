"""WebShop: the env (env.py), its catalogue (catalogue.py, the generated one's words in
vocabulary.py) and purchase reward (reward.py)."""
