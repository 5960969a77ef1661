"""What a lean training step still promises: the non-finite stop within a step on CPU, the step
count each fit computes its schedules from, logged values that are the step's own, the dead-unit
mask, and the progress line off a terminal."""

import csv
import math

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from sae.models import SAEConfig
from sae.models.schedules import lr_factor, resolve_steps
from sae.training.guards import NonFiniteLossError, training_callbacks
from sae.training.module import training_module
from sae.training.progress import EpochLines


def small_module(mnist_small, **settings):
    torch.manual_seed(0)
    config = SAEConfig(model=settings.pop("model", "l1"), hidden=32, **settings)
    return training_module(config, mnist_small.train_mean, 50.0)


def trainer(**kw) -> L.Trainer:
    kw.setdefault("logger", False)
    return L.Trainer(accelerator="cpu", devices=1, enable_progress_bar=False,
                     enable_checkpointing=False, enable_model_summary=False,
                     num_sanity_val_steps=0, limit_val_batches=0, **kw)


class Spoil(L.Callback):
    """Before the training batch of global step ``at``: W_enc made NaN, or W_dec scaled so far
    up that the batch FVU is finite but above the divergence bound."""

    def __init__(self, at: int, how: str):
        self.at, self.how = at, how

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.at:
            with torch.no_grad():
                if self.how == "nan":
                    pl_module.sae.W_enc.fill_(math.nan)
                else:
                    pl_module.sae.W_dec.mul_(1e4)


@pytest.mark.parametrize("how", ["nan", "diverge"])
def test_a_bad_step_stops_training_right_after_it_on_cpu(mnist_small, how):
    module = small_module(mnist_small)
    seen = []

    class Steps(L.Callback):  # after the guard: a step it let through
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(trainer.global_step)

    fit = trainer(max_steps=12, callbacks=[Spoil(5, how), *training_callbacks(module.config),
                                           Steps()])
    with pytest.raises(NonFiniteLossError, match="at step 6"):
        fit.fit(module, datamodule=mnist_small)
    assert seen == [1, 2, 3, 4, 5]  # the bad sixth step ended no batch past the guard
    # diverged, the weights stay finite: the bound on the batch FVU, not a NaN, stopped it
    assert bool(torch.isfinite(module.sae.W_dec).all()) == (how == "diverge")


class StepCount(L.Callback):
    def __init__(self):
        self.counts: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.counts.append(pl_module.total_steps())


def test_each_fit_counts_its_own_steps_also_after_a_fit_stopped_by_an_error(mnist_small):
    module = small_module(mnist_small)
    first = StepCount()
    with pytest.raises(NonFiniteLossError):  # stopped before its end: no on_train_end
        trainer(max_steps=8, callbacks=[Spoil(2, "nan"), first,
                                        *training_callbacks(module.config)]).fit(
            module, datamodule=mnist_small)
    assert first.counts == [8, 8, 8]
    # a new model (the first is NaN) whose learning rate decays over the fit's steps
    module = small_module(mnist_small, lr_decay="cosine")
    second = StepCount()
    fit = trainer(max_steps=5, callbacks=[second])
    fit.fit(module, datamodule=mnist_small)
    assert second.counts == [5] * 5
    # the learning-rate schedule was built from this fit's count, not the stopped fit's
    (config,) = fit.lr_scheduler_configs
    warm = resolve_steps(module.config.lr_warmup, 5)
    assert config.scheduler.lr_lambdas[0](3) == lr_factor(3, warm, 5, "cosine") != lr_factor(
        3, resolve_steps(module.config.lr_warmup, 8), 8, "cosine")
    assert module.total_steps() == int(fit.estimated_stepping_batches) == 5
    again = StepCount()
    trainer(max_steps=3, callbacks=[again]).fit(module, datamodule=mnist_small)
    assert again.counts == [3, 3, 3]


class Losses(L.Callback):
    def __init__(self):
        self.loss: dict[int, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.loss[trainer.global_step - 1] = float(outputs["loss"])


def test_logged_steps_hold_that_steps_values(mnist_small, tmp_path):
    module = small_module(mnist_small, lam=0.01)
    losses = Losses()
    fit = trainer(max_steps=10, log_every_n_steps=3, callbacks=[losses],
                  logger=CSVLogger(tmp_path, name="", version=""))
    fit.fit(module, datamodule=mnist_small)
    rows = [r for r in csv.DictReader(open(tmp_path / "metrics.csv")) if r.get("train/loss")]
    logged = {int(r["step"]): r for r in rows}
    assert sorted(logged) == [2, 5, 8]  # every third step: the others log nothing
    for step, row in logged.items():
        assert float(row["train/loss"]) == pytest.approx(losses.loss[step], rel=1e-6)
        assert float(row["train/recon"]) + float(row["train/lambda"]) * float(
            row["train/penalty"]) == pytest.approx(float(row["train/loss"]), rel=1e-5)
        assert 0 <= float(row["train/l0"]) <= 32
        assert 0 <= float(row["train/dead_fraction"]) <= 1


def test_dead_mask_in_one_process_is_the_window_rule(mnist_small):
    module = small_module(mnist_small, model="topk", k=4, dead_window=1000)
    module.samples_since_fired.copy_(torch.arange(32) * 50)  # units 20.. at or past 1 000
    expected = torch.arange(32) >= 20
    assert torch.equal(module.dead_mask(), expected)
    assert torch.equal(module.dead_mask(reduce=False), expected)


@pytest.mark.parametrize("every, lines", [(0.0, True), (1e9, False)])
def test_progress_lines_off_a_terminal_follow_the_clock(mnist_small, capsys, every, lines):
    module = small_module(mnist_small)
    trainer(max_steps=4, callbacks=[EpochLines(every=every)]).fit(module, datamodule=mnist_small)
    out = [line for line in capsys.readouterr().out.splitlines() if "ms a step" in line]
    assert bool(out) == lines
    if lines:  # one a step after the first (each with a step count that moved)
        assert [line.split(" · ")[1:3] for line in out] == [[f"step {s}", f"{s + 1} of 4 done"]
                                                            for s in (0, 1, 2, 3)]
