"""One-answer text tasks: Bandit, Countdown, MetaMathQA (an arm name or the answer is the
action)."""
