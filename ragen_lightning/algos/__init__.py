"""Pure tensor math of StarPO / StarPO-S: advantages, losses and rollout filtering.

Imports torch and the standard library only (no lightning, no vllm, no config objects; a test checks
this), so the training module orchestrates these functions and every equation is unit-tested on
hand-computed numbers.
"""

from .advantages import (
    adaptive_kl_coef,
    apply_kl_in_reward,
    arpo,
    broadcast_to_tokens,
    brpo,
    drgrpo,
    filter_loss_scaling,
    gae,
    group_centre,
    group_std,
    grpo,
    length_weight,
    soft_advantage_reweight,
    turn_ends_from_mask,
    turn_level_gae,
    zero_task_advantage,
)
from .filtering import (
    filter_metrics,
    group_scores,
    in_group_std,
    kept_sample_mask,
    select_groups,
)
from .logits import entropy_from_logits, logprobs_from_logits
from .losses import (
    AGG_MODES,
    KL_KINDS,
    actor_loss,
    agg_normalizer,
    aggregate,
    kl_penalty,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    ppo_policy_loss,
    tis_weights,
    value_loss,
)

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "actor_loss",
    "adaptive_kl_coef",
    "agg_normalizer",
    "aggregate",
    "apply_kl_in_reward",
    "arpo",
    "broadcast_to_tokens",
    "brpo",
    "drgrpo",
    "entropy_from_logits",
    "filter_loss_scaling",
    "filter_metrics",
    "gae",
    "group_centre",
    "group_scores",
    "group_std",
    "grpo",
    "in_group_std",
    "kept_sample_mask",
    "kl_penalty",
    "length_weight",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "ppo_policy_loss",
    "select_groups",
    "soft_advantage_reweight",
    "tis_weights",
    "turn_ends_from_mask",
    "turn_level_gae",
    "value_loss",
    "zero_task_advantage",
]
