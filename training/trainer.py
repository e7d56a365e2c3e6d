"""Trainer additions for pretraining: per-objective logging (training and held-out), tokens/s, masks keyed by
epoch, checkpoints that are complete or invisible, and a checkpoint on SIGTERM/SIGINT."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

# Checkpoints are written here and renamed to OUTPUT_DIR/checkpoint-N once every file is on disk: a save killed
# half-way leaves no checkpoint-N that `--resume_from_checkpoint` or the save_total_limit rotation could pick.
STAGING_DIR = ".checkpoint-staging"
# Tests only: the step whose checkpoint, once written, waits 10 minutes before it is published (to be killed there).
SAVE_PAUSE_ENV = "ENCODER_ZOO_TEST_PAUSE_SAVE_AT_STEP"


class PretrainingTrainer(Trainer):
    """Trainer that also logs the mean of chosen scalar model outputs (e.g. `mlm_loss`, `sbo_loss`, `rtd_accuracy`)
    over each logging interval and over the held-out set, their perplexities, and training throughput in
    non-padding tokens per second."""

    def __init__(self, *args, logged_outputs=(), perplexity_of=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.logged_outputs = tuple(logged_outputs)
        self.perplexity_of = tuple(perplexity_of)
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0
        self._tokens = 0
        self._eval_sums: dict[str, torch.Tensor] = {}
        self._eval_count = 0
        self._interval_start = time.perf_counter()
        self._staging_root: str | None = None
        if hasattr(self.data_collator, "set_epoch"):
            self.add_callback(CollatorEpoch(self.data_collator))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        if model.training:
            self._tokens += int(inputs["attention_mask"].sum()) if "attention_mask" in inputs else inputs["input_ids"].numel()
            self._count += 1
            sums, weight = self._sums, 1
        else:  # weighted by batch size, as Trainer weighs eval_loss
            weight = inputs["input_ids"].shape[0]
            self._eval_count += weight
            sums = self._eval_sums
        for name in self.logged_outputs:
            value = outputs.get(name) if hasattr(outputs, "get") else None
            if value is not None:
                sums[name] = sums.get(name, 0.0) + value.detach().float() * weight
        loss = outputs["loss"]
        return (loss, outputs) if return_outputs else loss

    def _reduced_means(self, sums: dict, count: float, *extra: float) -> tuple[dict[str, float], list[float]]:
        """Means of `sums` over `count` across processes (every rank logs at the same steps), and `extra` summed."""
        device = self.args.device
        names = sorted(sums)
        stacked = torch.stack([torch.as_tensor(sums[n], device=device, dtype=torch.float32) for n in names] +
                              [torch.tensor(float(v), device=device) for v in (count, *extra)])
        stacked = self.accelerator.reduce(stacked, reduction="sum") if self.args.world_size > 1 else stacked
        total = max(stacked[len(names)].item(), 1e-12)
        means = {}
        for index, name in enumerate(names):
            means[name] = round(stacked[index].item() / total, 4)
            if name in self.perplexity_of:
                means[name.removesuffix("_loss") + "_ppl"] = round(math.exp(min(means[name], 50.0)), 2)
        return means, [v.item() for v in stacked[len(names) + 1 :]]

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._count:
            means, (tokens,) = self._reduced_means(self._sums, self._count, self._tokens)
            logs.update(means)
            elapsed = time.perf_counter() - self._interval_start
            logs["tokens_per_second"] = round(tokens / max(elapsed, 1e-9), 1)
            self._sums, self._count, self._tokens = {}, 0, 0
            self._interval_start = time.perf_counter()
        super().log(logs, start_time)

    # ------------------------------------------------------------------ data loaders
    def get_train_dataloader(self):
        return workers_ignore_stop_signals(super().get_train_dataloader())

    def get_eval_dataloader(self, eval_dataset=None):
        """Held-out batches get the collator's evaluation copy: masks fixed per example, whatever the epoch."""
        collator = self.data_collator
        if hasattr(collator, "for_evaluation"):
            self.data_collator = collator.for_evaluation()
        try:
            return workers_ignore_stop_signals(super().get_eval_dataloader(eval_dataset))
        finally:
            self.data_collator = collator

    # ------------------------------------------------------------------ held-out evaluation
    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"):
        """Adds each objective's held-out loss (and perplexity) to the metrics. Runs under a forked, fixed torch
        RNG: in-model sampling (TEAMS's generator) scores the same every time and leaves training's stream alone."""
        self._eval_sums, self._eval_count = {}, 0
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.args.seed)
            output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        if self._eval_sums:
            means, _ = self._reduced_means(self._eval_sums, self._eval_count)
            output.metrics.update({f"{metric_key_prefix}_{name}": value for name, value in means.items()})
        self._eval_sums, self._eval_count = {}, 0
        return output

    # ------------------------------------------------------------------ checkpoints: complete or invisible
    def _get_output_dir(self, trial) -> str:
        return self._staging_root or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        run_dir = Path(super()._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging, final = run_dir / STAGING_DIR, run_dir / name
        if self.args.should_save:
            shutil.rmtree(staging / name, ignore_errors=True)
        self.accelerator.wait_for_everyone()  # no rank writes into the folder before it is cleared
        self._staging_root = str(staging)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_root = None
        if os.environ.get(SAVE_PAUSE_ENV) == str(self.state.global_step):
            time.sleep(600)
        self.accelerator.wait_for_everyone()  # every rank's files (rng_state_N.pth) are written
        if not self.args.should_save:
            return
        best_step = self.state.best_global_step
        if best_step:  # Trainer looked for the best checkpoint under the staging folder
            best = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{best_step}"
            self.state.best_model_checkpoint = str(best) if best.exists() or best == final else None
            self.state.save_to_json(str(staging / name / "trainer_state.json"))
        superseded = staging / f"superseded-{name}"
        if final.exists():  # a rerun of a step (resumed from an older checkpoint): the newer save replaces it
            os.replace(final, superseded)
        os.replace(staging / name, final)
        shutil.rmtree(superseded, ignore_errors=True)
        if not any(staging.iterdir()):
            staging.rmdir()
        rotate_checkpoints(output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,
                           best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)


def _ignore_stop_signals(worker_id, init=None):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if init is not None:
        init(worker_id)


def workers_ignore_stop_signals(loader):
    """DataLoader workers leave SIGTERM/SIGINT to the main process, which saves and stops: a scheduler signals the
    whole process group, and a worker killed by it would crash the run before the save."""
    base = getattr(loader, "base_dataloader", loader)  # accelerate's wrapper reads worker_init_fn from its loader
    init = base.worker_init_fn
    if base.num_workers > 0 and getattr(init, "func", None) is not _ignore_stop_signals:
        base.worker_init_fn = functools.partial(_ignore_stop_signals, init=init)
    return loader


class CollatorEpoch(TrainerCallback):
    """Hands the training epoch to the collator before each epoch's batches are drawn.

    How the epoch reaches the masks: `on_epoch_begin` runs in the main process before Trainer iterates the epoch's
    DataLoader; the collator stores the epoch in a shared-memory tensor, which DataLoader workers read whether they
    are forked afresh each epoch or persistent. `state.epoch` is `epoch + step / steps_in_epoch` (exactly `epoch`
    at an epoch start, a fraction below the next when resuming), so its floor is the epoch being trained.
    """

    def __init__(self, collator):
        self.collator = collator

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.collator.set_epoch(math.floor(state.epoch or 0))


class TrainingStopped(Exception):
    """Training stopped by a signal after saving its checkpoint; `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int, step: int, checkpoint: str | None):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name} at step {step}" + (f" after saving {checkpoint}" if checkpoint else "")
                         + "; resume with --resume_from_checkpoint true.")


class SaveOnSignal(TrainerCallback):
    """On SIGTERM/SIGINT (preemption, Ctrl-C) finish the current step, save a checkpoint and stop, so
    `--resume_from_checkpoint` continues from there and nothing already trained is lost. `signum` is the signal
    that stopped training (None if none did). A second signal aborts at once."""

    def __init__(self):
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def on_train_begin(self, args, state, control, **kwargs):
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._request)

    def _request(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.signum = signum

    def on_step_end(self, args, state, control, **kwargs):
        if args.world_size > 1 and torch.distributed.is_initialized():  # all ranks stop at the same step
            flag = torch.tensor([self.signum or 0], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            self.signum = int(flag.item()) or None
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control


def checkpoint_is_complete(folder: Path) -> bool:
    """A checkpoint folder Trainer can resume from: its state and weights are there."""
    has_weights = any((folder / name).exists() for name in (
        "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"))
    if not (folder / "trainer_state.json").is_file() or not has_weights:
        return False
    try:
        json.loads((folder / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return True
