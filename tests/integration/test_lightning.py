"""``loader.torch.DataLoader`` under PyTorch Lightning's ``Trainer.fit``: the batches of each epoch, and resumes.

Lightning drives a dataloader in its own order: ``iter()`` once to check it is iterable (and drops it),
``len()``, the epoch's iterator made before ``dataloader.sampler.set_epoch(epoch)``, and a state loaded only
for a checkpoint taken mid-epoch. Each fit here is compared, batch by batch, with the adapter iterated by hand.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pl = pytest.importorskip("pytorch_lightning", reason="the test extra installs pytorch-lightning")
torch = pytest.importorskip("torch")

from loader.config import LoaderConfig  # noqa: E402
from loader.torch import DataLoader  # noqa: E402

pytestmark = pytest.mark.integration

EPOCHS = 3
BATCHES = 25  # 200 rows in batches of 8


@pytest.fixture(autouse=True)
def _quiet_lightning() -> None:
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


@pytest.fixture
def config(tmp_path: Path) -> LoaderConfig:
    np.save(tmp_path / "rows.npy", np.arange(1000, 1200, dtype=np.int64))
    return LoaderConfig.from_dict(
        {
            "source": {"files": [str(tmp_path / "rows.npy")]},
            "pipeline": {"batch_size": 8, "seed": 7, "shuffle_buffer": 16},
            "workers": {"count": 1},
        }
    )


@pytest.fixture
def by_hand(config: LoaderConfig) -> list[list[list[int]]]:
    """Each epoch's batches, iterating the adapter in a plain loop."""
    with DataLoader(config) as data:
        epochs = [[batch["data"].tolist() for batch in data] for _ in range(EPOCHS)]
    assert all(len(epoch) == BATCHES for epoch in epochs) and epochs[0] != epochs[1] != epochs[2]
    return epochs


class Recorder(pl.LightningModule):
    """Notes the batches its training steps get; ``train_dataloader()`` makes a new adapter each time it is asked."""

    def __init__(self, config: LoaderConfig) -> None:
        super().__init__()
        self.config = config
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, list[int]]] = []
        self.made: list[DataLoader] = []

    def train_dataloader(self) -> DataLoader:
        self.made.append(DataLoader(self.config))
        return self.made[-1]

    def training_step(self, batch: dict[str, Any], index: int) -> Any:
        self.seen.append((self.current_epoch, batch["data"].tolist()))
        return (self.weight * batch["data"].float().mean()) ** 2

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(config: LoaderConfig, root: Path, resume_from: Path | None = None, **trainer: Any) -> Recorder:
    model = Recorder(config)
    options: dict[str, Any] = {
        "max_epochs": EPOCHS,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "accelerator": "cpu",
        "devices": 1,
        "default_root_dir": str(root),
        **trainer,
    }
    try:
        pl.Trainer(**options).fit(model, ckpt_path=None if resume_from is None else str(resume_from))
    finally:
        for data in model.made:
            data.close()
    return model


def _epochs(model: Recorder) -> list[list[list[int]]]:
    return [[rows for epoch, rows in model.seen if epoch == number] for number in range(EPOCHS)]


def test_a_fit_gets_the_epochs_a_plain_loop_gets_also_with_dataloaders_made_anew_each_epoch(config, by_hand, tmp_path):
    # Lightning's iter() to check the dataloader used up epoch 0: every epoch of a fit ran one ahead, and a
    # dataloader made anew each epoch (reload_dataloaders_every_n_epochs) ran epoch 1 again and again.
    assert _epochs(_fit(config, tmp_path / "once")) == by_hand
    assert _epochs(_fit(config, tmp_path / "anew", reload_dataloaders_every_n_epochs=1)) == by_hand


def test_a_fit_resumed_from_an_epoch_end_checkpoint_goes_on_with_the_next_epoch(config, by_hand, tmp_path):
    # Lightning loads no dataloader state for a checkpoint taken at an epoch's end: it calls sampler.set_epoch.
    # Without a sampler, the resumed fit ran epoch 0's order again as its epoch 1.
    saved = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "checkpoints"), save_top_k=-1)
    first = _fit(config, tmp_path, max_epochs=1, callbacks=[saved], enable_checkpointing=True)
    (checkpoint,) = (tmp_path / "checkpoints").iterdir()
    rest = _fit(config, tmp_path, resume_from=checkpoint)
    assert _epochs(first)[0] == by_hand[0]
    assert _epochs(rest) == [[], *by_hand[1:]]


def test_a_fit_resumed_from_a_mid_epoch_checkpoint_goes_on_with_the_next_batch(config, by_hand, tmp_path):
    saved = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "checkpoints"), every_n_train_steps=32, save_top_k=-1)
    first = _fit(config, tmp_path, max_steps=32, callbacks=[saved], enable_checkpointing=True)
    (checkpoint,) = (tmp_path / "checkpoints").iterdir()
    rest = _fit(config, tmp_path, resume_from=checkpoint)
    assert len(first.seen) == 32 and len(rest.seen) == EPOCHS * BATCHES - 32
    assert [epoch for epoch, _ in first.seen + rest.seen] == [n for n in range(EPOCHS) for _ in range(BATCHES)]
    assert [rows for _, rows in first.seen + rest.seen] == [rows for epoch in by_hand for rows in epoch]


@pytest.fixture
def uncounted(tmp_path: Path) -> LoaderConfig:
    """A RecordIO file: the daemon cannot count its batches ahead, so len() is unknown to Lightning."""
    from loader.recordio import Writer

    with Writer(str(tmp_path / "rows.recordio"), max_num_records=16) as writer:
        for value in range(1000, 1200):
            writer.write({"data": np.int64(value)})
    return LoaderConfig.from_dict(
        {
            "source": {"files": [str(tmp_path / "rows.recordio")], "format": "recordio"},
            "pipeline": {"batch_size": 8, "seed": 7, "shuffle_buffer": 16},
            "workers": {"count": 1},
        }
    )


def test_with_len_unknown_an_epoch_end_resume_runs_the_next_epoch_after_one_batch_fetched_early(
    uncounted, tmp_path, caplog
):
    # Lightning fetches the first batch before set_epoch when len() is unknown: resumed from an epoch-end
    # checkpoint it trained on epoch 0 again as epoch 1, and epoch 1 never ran. Now epoch 1 runs whole, after
    # the one batch of epoch 0 Lightning took before asking for it, with a warning that says so.
    with DataLoader(uncounted) as data:
        by_hand = [[batch["data"].tolist() for batch in data] for _ in range(EPOCHS)]
    assert _epochs(_fit(uncounted, tmp_path / "whole")) == by_hand
    saved = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "checkpoints"), save_top_k=-1)
    _fit(uncounted, tmp_path, max_epochs=1, callbacks=[saved], enable_checkpointing=True)
    (checkpoint,) = (tmp_path / "checkpoints").iterdir()
    rest = _epochs(_fit(uncounted, tmp_path, resume_from=checkpoint))
    assert rest == [[], [by_hand[0][0], *by_hand[1]], by_hand[2]]
    assert "set_epoch(1) was called while an iteration of epoch 0 was under way" in caplog.text
