"""Third-party warnings that every run printed and that say nothing about the run, filtered by the command line
(:func:`filter_harmless_warnings`) and by the test suite (tests/conftest.py), each with the reason it is harmless.

Anything not listed still shows. Standard library only, so the test suite can import it without Lightning.
"""

from __future__ import annotations

import logging
import warnings

# (message regex matched at the start of the warning's text, category, why it is harmless)
HARMLESS_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    (r"You are using the `dataloader_iter` step flavor", UserWarning,
     "StarPOModule.training_step pulls exactly one rollout batch per step (the warning is about consuming it twice)"),
    (r"Found `dataloader_iter` argument in the `training_step`", UserWarning,
     "the dataloader_iter signature is deliberate (no pre-fetched stale rollouts); Lightning flags it experimental"),
    (r"Your `IterableDataset` has `__len__` defined", UserWarning,
     "the rollout stream always runs with num_workers=0, where its length is exact"),
    (r"It is recommended to use `self.log\('val", UserWarning,
     "validation metrics are logged with sync_dist=True; the warning fires because vLLM's in-process engine starts "
     "a one-process torch.distributed group, where there is nothing to sync"),
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", Warning,
     "Lightning 2.6 calls a torch API that torch 2.13 deprecated; behaviour unchanged"),
    (r"`torch.distributed.reduce_op` is deprecated", FutureWarning,
     "vLLM's triton dispatcher scans torch.distributed's attributes at import; nothing calls reduce_op"),
    (r"\s*By default only one JsonargparseDeprecationWarning per type is shown", Warning,
     "jsonargparse's preamble to the next entry"),
    (r"\s*[^\n]{0,80} was deprecated in v4\.49\.0", Warning,
     "LightningCLI 2.6 calls jsonargparse APIs (add_instantiator, instantiate_classes, skip_none) that jsonargparse "
     "4.49 deprecated for removal in 5.0; behaviour unchanged, and jsonargparse is kept below 5 by lightning"),
)
LIGHTNING_ADVERT = "try installing [litlogger]"  # Lightning's info line advertising its cloud logger on every fit


def _not_an_advert(record: logging.LogRecord) -> bool:
    return LIGHTNING_ADVERT not in record.getMessage()


def filter_harmless_warnings() -> None:
    """Silence :data:`HARMLESS_WARNINGS` in this process, and Lightning's logger advertisement (idempotent)."""
    for message, category, _why in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _not_an_advert not in logger.filters:
        logger.addFilter(_not_an_advert)
