"""A stack: several SAEs trained at once on the same batches, one backward and one optimiser step.

On small problems the work of a step is mostly the loop around it (Lightning's hooks, logging,
the data path, Python), not arithmetic. A stack pays that loop once for N models. Its members
are ordinary training modules (:class:`sae.training.module.SAETraining`), each with its own λ, k,
temperature, dead-unit tracker, guards and ``--target-l0`` controller; the stack

- sums their losses, so one backward gives each member's parameters exactly the gradient of
  its own loss (the other terms do not depend on them);
- steps one Adam over every member's parameter groups, each group with its member's learning
  rate and schedule (Adam's arithmetic is per element: the same as the member's own Adam);
- keeps a torch generator state per member, so a member's random draws (dead-unit resampling)
  are the ones it would make alone;
- sends each member's logged values to that member's own loggers, and writes each member's
  checkpoints into its own run folder as a single run's (:func:`member_checkpoint`), so a
  member is resumed, loaded and exported alone like any run.

A member trained in a stack therefore gives the model the same run trained alone gives, up to
float rounding. A member whose loss goes non-finite stops (its last good checkpoint is kept)
while the others go on; with ``--until-converged`` a member that has settled stops training and
is no longer written, as a single run stops.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn

from sae.training.checkpoints import SafeCheckpointIO, write_checkpoint
from sae.training.convergence import last_epoch_change
from sae.training.guards import NonFiniteLossError
from sae.training.module import PREFIX, TRAINING_BUFFERS, SAETraining

# the values a stack shows on its progress bar and epoch lines: the members' mean
SHOWN = ("train/loss", "train/l0", "val/fvu", "val/l0", "val/dead_fraction", "val/loss")


class MemberRecord:
    """What one member logs, sent to its own loggers: values gathered during a step or a
    validation and written as one row at its end (the rows a single run's CSV holds)."""

    def __init__(self, loggers: list) -> None:
        self.loggers = loggers
        self.pending: dict[str, float] = {}
        self.shown: dict[str, Tensor] = {}

    def __call__(self, name: str, value, prog_bar: bool = False) -> None:
        self.pending[name] = value
        if name in SHOWN:
            self.shown[name] = torch.as_tensor(value).detach().float()

    def flush(self, step: int, epoch: int, save: bool = False) -> None:
        """Write the pending values as one row at ``step``; ``save`` writes the loggers' files
        too (after a validation, as Lightning saves its loggers)."""
        if self.pending:
            row = {k: float(torch.as_tensor(v).detach()) for k, v in self.pending.items()}
            row["epoch"] = epoch
            for logger in self.loggers:
                logger.log_metrics(row, step=step)
            self.pending = {}
        if save:
            for logger in self.loggers:
                logger.save()


class StackTraining(L.LightningModule):
    """Trains ``members`` (training modules of one input shape) together; ``folders`` are their
    run folders, ``loggers`` each member's loggers."""

    def __init__(self, members: list[SAETraining], folders: list[Path], loggers: list[list]):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.folders = [Path(f) for f in folders]
        self.records = [MemberRecord(lg) for lg in loggers]
        for member, record in zip(members, self.records, strict=True):
            member.log_sink = record
        n = len(members)
        self.finished: list[tuple[int, int] | None] = [None] * n  # (step, epoch) it stopped at
        self.failures: list[NonFiniteLossError | None] = [None] * n
        self.rng_states: list[Tensor | None] = [None] * n
        self.best: list[float | None] = [None] * n  # each member's best val/loss so far
        self.improved = [False] * n
        self.settle_rows: list[list[dict]] = [[] for _ in range(n)]
        self.until_converged = False

    # ---- who trains --------------------------------------------------------------------------
    def live(self) -> list[int]:
        """The members still training (not settled, not failed)."""
        return [i for i in range(len(self.members))
                if self.finished[i] is None and self.failures[i] is None]

    def fail(self, i: int, error: NonFiniteLossError) -> None:
        self.failures[i] = error

    @contextmanager
    def member_rng(self, i: int):
        """Member ``i``'s own torch generator state while its code runs."""
        state = self.rng_states[i]
        if state is None:
            yield
            return
        outer = torch.get_rng_state()
        torch.set_rng_state(state)
        try:
            yield
        finally:
            self.rng_states[i] = torch.get_rng_state()
            torch.set_rng_state(outer)

    # ---- the fit's hooks, passed on to each member -------------------------------------------
    def setup(self, stage: str) -> None:
        for member in self.members:
            member.trainer = self.trainer
            member.setup(stage)

    def teardown(self, stage: str) -> None:
        for member in self.members:
            member.trainer = None

    def on_train_start(self) -> None:
        for member in self.members:
            member.on_train_start()

    def on_train_end(self) -> None:
        for member in self.members:
            member.on_train_end()

    def on_train_epoch_start(self) -> None:
        # after EpochSeed seeded the generator: every member starts the epoch from that state
        state = torch.get_rng_state()
        self.rng_states = [state.clone() for _ in self.members]

    def training_step(self, batch, batch_idx: int):
        live = self.live()
        if not live:
            self.trainer.should_stop = True
            return None
        total = None
        for i in live:
            with self.member_rng(i):
                loss = self.members[i].training_step(batch, batch_idx)
            total = loss if total is None else total + loss
        self._show("train/loss", "train/l0")
        return total

    def on_before_optimizer_step(self, optimizer) -> None:
        for i in self.live():
            self.members[i].on_before_optimizer_step(optimizer)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None) -> None:
        """``--grad-clip``: each member's gradient norm clipped alone, over its own parameters
        in its own order, as its single run clips it (not one norm over the whole stack)."""
        if not gradient_clip_val:
            return
        groups = optimizer.param_groups
        for i in self.live():
            params = [p for g in self.group_range(i) for p in groups[g]["params"]]
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        optimizer.step(closure=optimizer_closure)
        for i in self.live():
            self.members[i].renormalise()

    def flush_train_logs(self) -> None:
        step, epoch = max(self.trainer.global_step - 1, 0), self.trainer.current_epoch
        for record in self.records:
            record.flush(step, epoch)

    # ---- validation --------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        for i in self.live():
            self.members[i].on_validation_epoch_start()

    def validation_step(self, batch, batch_idx: int) -> None:
        for i in self.live():
            self.members[i].validation_step(batch, batch_idx)

    def on_validation_epoch_end(self) -> None:
        step, epoch = max(self.trainer.global_step - 1, 0), self.trainer.current_epoch
        for i in self.live():
            self.members[i].on_validation_epoch_end()
            record = self.records[i]
            loss = record.pending.get("val/loss")
            if loss is not None and not self.trainer.sanity_checking:
                loss = float(loss)
                self.improved[i] = self.best[i] is None or loss < self.best[i]
                self.best[i] = min(loss, self.best[i]) if self.best[i] is not None else loss
                if self.until_converged:
                    self._settle(i, record)
            record.flush(step, epoch, save=True)
        self._show("val/fvu", "val/l0", "val/dead_fraction", "val/loss")

    def _settle(self, i: int, record: MemberRecord) -> None:
        """``--until-converged`` for member ``i`` (``StopWhenSettled``'s rule): it stops once an
        epoch moved its validation FVU and L0 less than the rule's tolerances."""
        member = self.members[i]
        if member.controls_l0 and member.in_control_window():
            self.settle_rows[i] = []
            return
        rows = self.settle_rows[i]
        pending = record.pending
        rows.append({"fvu": float(pending["val/fvu"]), "l0": float(pending["val/l0"])})
        if last_epoch_change(rows[-2:])["converged"]:
            self.finished[i] = (-1, -1)  # stopped at this validation; set once it is written

    def _show(self, *names: str) -> None:
        """The members' mean of ``names`` on the progress bar and epoch lines."""
        for name in names:
            values = [r.shown.pop(name) for r in self.records if name in r.shown]
            if values:
                self.log(name, torch.stack(values).mean(), prog_bar=name in ("train/loss",
                                                                             "train/l0"))

    # ---- the optimiser -------------------------------------------------------------------------
    def configure_optimizers(self):
        groups, schedules = [], []
        self.group_counts = []
        for member in self.members:
            own = member.sae.param_groups()
            self.group_counts.append(len(own))
            for group in own:
                groups.append({**group, "lr": group.get("lr", member.config.lr)})
                schedules.append(member.lr_schedule())
        opt = torch.optim.Adam(groups)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedules)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def group_range(self, i: int) -> range:
        start = sum(self.group_counts[:i])
        return range(start, start + self.group_counts[i])


class MemberCallbacks(L.Callback):
    """Each member's own guard callbacks (``sae.training.guards``), run on that member with its
    own generator state; a member whose loss goes non-finite stops alone."""

    def __init__(self, per_member: list[list[L.Callback]]) -> None:
        self.per_member = per_member

    def _each(self, trainer, stack: StackTraining, hook: str, *args) -> None:
        for i in stack.live():
            with stack.member_rng(i):
                for callback in self.per_member[i]:
                    try:
                        getattr(callback, hook)(trainer, stack.members[i], *args)
                    except NonFiniteLossError as e:
                        stack.fail(i, e)
                        break

    def on_train_batch_end(self, trainer, stack, outputs, batch, batch_idx) -> None:
        self._each(trainer, stack, "on_train_batch_end", outputs, batch, batch_idx)
        stack.flush_train_logs()

    def on_train_epoch_end(self, trainer, stack) -> None:
        self._each(trainer, stack, "on_train_epoch_end")

    def on_validation_epoch_start(self, trainer, stack) -> None:
        self._each(trainer, stack, "on_validation_epoch_start")

    def on_save_checkpoint(self, trainer, stack, checkpoint) -> None:
        self._each(trainer, stack, "on_save_checkpoint", checkpoint)


class StackCheckpoints(L.Callback):
    """After every validation, each live member's ``last.ckpt`` (and ``best.ckpt`` when its
    validation loss improved), written by :class:`StackCheckpointIO` when a single run's
    ModelCheckpoint writes it (at the training epoch's end when validation closes each epoch,
    else at the validation's end: the loop state a resume reads differs); a member that settled
    at this validation is written once more and then left as it is."""

    def __init__(self) -> None:
        self._saved_step = -1

    @staticmethod
    def _at_epoch_end(trainer) -> bool:
        return trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1

    def on_train_epoch_end(self, trainer, stack) -> None:
        if self._at_epoch_end(trainer):
            self._save(trainer, stack)

    def on_validation_end(self, trainer, stack) -> None:
        if not trainer.sanity_checking and not self._at_epoch_end(trainer):
            self._save(trainer, stack)

    def _save(self, trainer, stack) -> None:
        if self._saved_step == trainer.global_step:
            return
        trainer.save_checkpoint(stack.folders[0] / "checkpoints" / "last.ckpt")
        self._saved_step = trainer.global_step
        for i, done in enumerate(stack.finished):
            if done == (-1, -1):
                # the step and the epoch count a single run stopped here reports
                stack.finished[i] = (trainer.global_step, trainer.current_epoch + 1)
        if not stack.live():
            trainer.should_stop = True


class StackCheckpointIO(SafeCheckpointIO):
    """Writes a stack's checkpoint as one single-run checkpoint per member, in its own folder
    (the path Lightning passes is not written); reads the checkpoint to resume from the
    members' (``preloaded``, made by :func:`stack_checkpoint`)."""

    def __init__(self, stack: StackTraining, preloaded=None) -> None:
        super().__init__(preloaded)
        self.stack = stack

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        stack = self.stack
        for i in range(len(stack.members)):
            writing = stack.failures[i] is None and stack.finished[i] in (None, (-1, -1))
            if not writing:
                continue
            state = member_checkpoint(checkpoint, stack, i)
            folder = stack.folders[i] / "checkpoints"
            if stack.improved[i]:
                write_checkpoint(state, folder / "best.ckpt")
                stack.improved[i] = False
            write_checkpoint(state, folder / "last.ckpt")


# ---- a stack's checkpoint as its members' -------------------------------------------------------
def checkpoint_keys(folder: Path) -> tuple[str, str]:
    """The state keys of a single run's two ModelCheckpoints (best on val/loss, and last), as
    ``sae.training.engine.run_callbacks`` makes them."""
    best = ModelCheckpoint(dirpath=folder, filename="best", monitor="val/loss", mode="min",
                           save_top_k=1, enable_version_counter=False)
    last = ModelCheckpoint(dirpath=folder, filename="last", monitor=None, save_top_k=1,
                           enable_version_counter=False)
    return best.state_key, last.state_key


def _member_callbacks(callbacks: dict, stack: StackTraining, i: int) -> dict:
    folder = stack.folders[i] / "checkpoints"
    best_key, last_key = checkpoint_keys(folder)
    out = {k: v for k, v in callbacks.items() if k in ("Timer", "EpochSeed")}
    if "EpochSeed" in out and stack.rng_states[i] is not None:
        out["EpochSeed"] = {**out["EpochSeed"], "rng": stack.rng_states[i].clone()}
    best = torch.tensor(stack.best[i]) if stack.best[i] is not None else None
    best_path = str(folder / "best.ckpt")
    out[best_key] = {"monitor": "val/loss", "best_model_score": best,
                     "best_model_path": best_path if best is not None else "",
                     "current_score": best, "dirpath": str(folder),
                     "best_k_models": {best_path: best} if best is not None else {},
                     "kth_best_model_path": best_path if best is not None else "",
                     "kth_value": best if best is not None else torch.tensor(float("inf")),
                     "last_model_path": ""}
    out[last_key] = {"monitor": None, "best_model_score": None,
                     "best_model_path": str(folder / "last.ckpt"), "current_score": None,
                     "dirpath": str(folder), "best_k_models": {}, "kth_best_model_path": "",
                     "kth_value": torch.tensor(float("inf")), "last_model_path": ""}
    return out


def _member_optimizer(state: dict, groups: range) -> dict:
    """Member's part of the stack's Adam state: its groups, parameters renumbered from 0."""
    chosen = [state["param_groups"][g] for g in groups]
    order = [p for group in chosen for p in group["params"]]
    index = {old: new for new, old in enumerate(order)}
    return {"state": {index[p]: s for p, s in state["state"].items() if p in index},
            "param_groups": [{**g, "params": [index[p] for p in g["params"]]} for g in chosen]}


def _member_schedule(state: dict, groups: range) -> dict:
    picked = {k: [state[k][g] for g in groups] for k in ("base_lrs", "_last_lr", "lr_lambdas")
              if k in state}
    return {**state, **picked}


def member_checkpoint(checkpoint: dict, stack: StackTraining, i: int) -> dict:
    """Member ``i``'s single-run checkpoint out of the stack's (as Lightning dumps it)."""
    member, groups = stack.members[i], stack.group_range(i)
    return {
        "epoch": checkpoint["epoch"], "global_step": checkpoint["global_step"],
        "pytorch-lightning_version": checkpoint["pytorch-lightning_version"],
        "state_dict": member.state_dict(), "loops": checkpoint["loops"],
        "callbacks": _member_callbacks(checkpoint.get("callbacks", {}), stack, i),
        "optimizer_states": [_member_optimizer(checkpoint["optimizer_states"][0], groups)],
        "lr_schedulers": [_member_schedule(checkpoint["lr_schedulers"][0], groups)],
        "hparams_name": None, "hyper_parameters": dict(member.hparams),
    }


def stack_checkpoint(states: list[dict]) -> dict:
    """The stack's checkpoint made of its members' last checkpoints (the inverse of
    :func:`member_checkpoint`): what a stack resumes from. The members must stand at the same
    step (ValueError otherwise: resume them alone)."""
    steps = {int(s["global_step"]) for s in states}
    if len(steps) != 1:
        raise ValueError(f"the stack's runs stand at different steps ({sorted(steps)}); "
                         "resume each alone")
    first = states[0]
    state_dict, groups, opt_state, offset = {}, [], {}, 0
    schedule = {**first["lr_schedulers"][0], "base_lrs": [], "_last_lr": [], "lr_lambdas": []}
    for i, s in enumerate(states):
        for k, v in s["state_dict"].items():
            state_dict[f"members.{i}.{k if k in TRAINING_BUFFERS else PREFIX + k}"] = v
        opt = s["optimizer_states"][0]
        for group in opt["param_groups"]:
            groups.append({**group, "params": [p + offset for p in group["params"]]})
        opt_state.update({p + offset: v for p, v in opt["state"].items()})
        offset += sum(len(g["params"]) for g in opt["param_groups"])
        for k in ("base_lrs", "_last_lr", "lr_lambdas"):
            schedule[k].extend(s["lr_schedulers"][0].get(k, []))
    callbacks = {k: v for k, v in first.get("callbacks", {}).items() if k in ("Timer",
                                                                                 "EpochSeed")}
    return {"epoch": first["epoch"], "global_step": first["global_step"],
            "pytorch-lightning_version": first["pytorch-lightning_version"],
            "state_dict": state_dict, "loops": first["loops"], "callbacks": callbacks,
            "optimizer_states": [{"state": opt_state, "param_groups": groups}],
            "lr_schedulers": [schedule], "hparams_name": None, "hyper_parameters": {}}
