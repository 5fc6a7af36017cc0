"""A scripted engine shared by the integration tests and the 2-process worker (no model
sampling)."""

from __future__ import annotations

from ragen_lightning.rollout.engine import Generation


class SeededBanditEngine:
    """Answers each Bandit request with one of the two arm names, chosen by the request seed (reward
    variance)."""

    needs_envs = True

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def generate(self, prompts, params, seeds=None, **kw):
        outs = []
        for seed, env in zip(seeds, kw["envs"]):
            arm = env.action_names[seed % 2]
            ids = self.tok.encode(f"pick</think><answer>{arm}</answer>", add_special_tokens=False)
            ids.append(self.tok.eos_token_id)
            outs.append(Generation(ids, [-0.7] * len(ids), "stop"))
        return outs

    def sync_weights(self):
        pass
