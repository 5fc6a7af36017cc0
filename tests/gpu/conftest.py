"""Shared pieces of the CUDA checks."""

from __future__ import annotations

import lightning as L
import pytest


class TrainingDevices(L.Callback):
    """The device types of the actor's and critic's parameters while the update runs. After ``fit``
    Lightning's single-device teardown moves the module back to the CPU, so a check of the
    parameters afterwards says nothing about where training ran."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for net in (pl_module.actor, getattr(pl_module, "critic", None)):
            if net is not None:
                self.seen |= {p.device.type for p in net.parameters()}


@pytest.fixture
def training_devices() -> TrainingDevices:
    return TrainingDevices()
