"""The command line's filter of third-party warnings known to be harmless: the texts the libraries
print are silenced, anything else still shows."""

from __future__ import annotations

import logging
import warnings

from ragen_lightning.errors import HARMLESS_WARNINGS, filter_harmless_warnings

# The texts as Lightning 2.6.6 / vLLM 0.32 / jsonargparse 4.53 print them on a `main.py fit` (copied
# from a run).
PRINTED = [
    (
        "You are using the `dataloader_iter` step flavor. If you consume the iterator more than once per step, ...",
        UserWarning,
    ),
    (
        "Found `dataloader_iter` argument in the `training_step`. Note that the support for this signature is "
        "experimental and the behavior is subject to change.",
        UserWarning,
    ),
    (
        "Your `IterableDataset` has `__len__` defined. In combination with multi-process data loading ...",
        UserWarning,
    ),
    (
        "It is recommended to use `self.log('val/success', ..., sync_dist=True)` when logging on epoch level in "
        "distributed setting to accumulate the metric across devices.",
        UserWarning,
    ),
    (
        "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) and treespec.is_leaf()` "
        "instead.",
        DeprecationWarning,
    ),
    (
        "`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead",
        FutureWarning,
    ),
    (
        "\n    By default only one JsonargparseDeprecationWarning per type is shown. To see all warnings set ...",
        DeprecationWarning,
    ),
    (
        "\n    ``instantiate_classes`` was deprecated in v4.49.0 and will be removed in v5.0.0. Instead use ``instantiate``.",
        DeprecationWarning,
    ),
    (
        "\n    skip_none parameter was deprecated in v4.49.0 and will be removed in v5.0.0. Instead use skip_unset.",
        DeprecationWarning,
    ),
]


def test_every_listed_warning_says_why():
    assert all(why.strip() for _, _, why in HARMLESS_WARNINGS)


def test_the_printed_texts_are_silenced_and_others_still_show():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filter_harmless_warnings()
        for text, category in PRINTED:
            warnings.warn(text, category)  # noqa: B028 (as the libraries warn)
        warnings.warn("It is recommended to use `self.log('train/x', ...)`", UserWarning)  # noqa: B028 (not a val/ metric)
        warnings.warn("rollout filter kept no group at iteration 3", UserWarning)  # noqa: B028 (the project's own)
    assert [str(w.message) for w in caught] == [
        "It is recommended to use `self.log('train/x', ...)`",
        "rollout filter kept no group at iteration 3",
    ]


def test_lightning_logger_advert_is_dropped(caplog):
    filter_harmless_warnings()
    log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger=log.name):
        log.info(
            "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger](https://...)"
        )
        log.info("GPU available: False, used: False")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False"]
