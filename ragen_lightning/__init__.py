"""ragen_lightning: multi-turn RL for LLM agents (StarPO, StarPO-S / RAGEN-2) on PyTorch Lightning.

This top-level module stays import-light: ``ragen_lightning.algos`` is pure torch math and must be
importable without lightning or vllm.
"""

__version__ = "0.1.0"
