"""``logged_step``: the callbacks log at the step Lightning logs the module's ``self.log`` values of
the same iteration at, read from the fit loop's public batch index (checked against a real fit)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from callbacks._common import logged_step


class _Manual(pl.LightningModule):
    """Manual optimization, as StarPOModule: one optimizer step per batch, a validation every 2."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward((self.w - batch.sum()).pow(2).sum())
        opt.step()
        self.log("train_value", float(batch.sum()))

    def validation_step(self, batch):
        self.log("val_value", float(batch.sum()))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Record(pl.Callback):
    def __init__(self):
        self.pairs: list[tuple[str, int, int]] = []

    def _note(self, hook, trainer):
        # the private counter Lightning's logger connector logs at: read here to check the public
        # one, never in the library
        private = trainer.fit_loop.epoch_loop._batches_that_stepped
        self.pairs.append((hook, logged_step(trainer), private))

    def on_train_batch_end(self, trainer, *args):
        self._note("train", trainer)

    def on_validation_end(self, trainer, *args):
        if not trainer.sanity_checking:
            self._note("val", trainer)


def test_logged_step_is_the_step_lightning_logs_the_iteration_at(tmp_path):
    data = DataLoader(torch.arange(5.0).view(5, 1), batch_size=1)
    rec = _Record()
    trainer = pl.Trainer(
        max_epochs=2,
        val_check_interval=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        callbacks=[rec],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(_Manual(), data, data)
    train = [(public, private) for hook, public, private in rec.pairs if hook == "train"]
    assert [public for public, _ in train] == list(range(10))  # 5 batches x 2 epochs, 0-based
    assert all(public == private for _, public, private in rec.pairs)
    assert [public for hook, public, _ in rec.pairs if hook == "val"] == [
        1,
        3,
        6,
        8,
    ]  # every 2nd batch of each epoch
