"""Trainer additions for pretraining: per-objective logging (training and held-out), throughput, masks keyed by
epoch, checkpoints that are complete or invisible, a checkpoint on SIGTERM/SIGINT, a stop on divergence (every
entry point), and the alternating two-player step of GANs."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
import signal
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from encoder_zoo.training.run import DIVERGED_EXIT_CODE

logger = logging.getLogger(__name__)

# Checkpoints are written here and renamed to OUTPUT_DIR/checkpoint-N once every file is on disk: a save killed
# half-way leaves no checkpoint-N that `--resume_from_checkpoint` or the save_total_limit rotation could pick.
STAGING_DIR = ".checkpoint-staging"
# Tests only: the step whose checkpoint, once written, waits 10 minutes before it is published (to be killed there).
SAVE_PAUSE_ENV = "ENCODER_ZOO_TEST_PAUSE_SAVE_AT_STEP"
# Micro-batches whose model FLOPs wait to be counted (`PretrainingTrainer.floating_point_ops`): counted at the next log
# or save, or once this many have gathered.
PENDING_FLOP_BATCHES = 64
# Held-out MLM figures over the targets replaced by [MASK] only (`PretrainingTrainer.add_masked_only`), logged as
# eval_<name> beside the model's own `mlm_loss`, which averages every 80/10/10 target.
MASKED_LOSS, MASKED_ACCURACY, MASKED_TARGETS = "mlm_masked_loss", "mlm_masked_accuracy", "mlm_masked_targets"


class ExactResume:
    """Trainer additions for a resumed run (pretraining and fine-tuning alike).

    - A run resumed from a checkpoint that already reached `max_steps` trains nothing. Trainer's loop takes a step
      before it checks the end, so such a run would train step `max_steps + 1` (and save checkpoint-`max_steps + 1`).
      Its session logs no summary (Trainer's would report a training loss of 0 over 0 steps).
    - Weights a checkpoint leaves out because they are tied to others (a decoder tied to the word embeddings) are not
      reported as missing; any other missing or unexpected key still is.
    - A resumed run that logs, evaluates or saves at other intervals than its checkpoint recorded is told so as
      INFO (what is trained does not change); Trainer's warning stays for any other mismatch (the batch size).
    """

    def _run_epoch(self, *args, **kwargs):
        if self.state.max_steps > 0 and self.state.global_step >= self.state.max_steps:
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "train_runtime" in logs and getattr(self, "_initial_global_step", None) == self.state.global_step > 0:
            return  # the summary of a resumed session that trained nothing: its zeros describe no training
        super().log(logs, *args, **kwargs)

    def _issue_warnings_after_load(self, load_result) -> None:
        model = self.accelerator.unwrap_model(self.model)
        tied = set(getattr(model, "all_tied_weights_keys", None) or {})
        missing = [key for key in load_result.missing_keys if key not in tied]
        if len(missing) < len(load_result.missing_keys):
            model.tie_weights()
        if missing or load_result.unexpected_keys:
            super()._issue_warnings_after_load(type(load_result)(missing, list(load_result.unexpected_keys)))

    def train(self, *args, **kwargs):
        trainer_utils_logger = logging.getLogger("transformers.trainer_utils")
        # A resume that kept the run's global batch (`training.run.elastic`) may split it otherwise: said there.
        interval_filter = _IntervalMismatch(INTERVAL_ARGUMENTS + (("per_device_train_batch_size",)
                                                                  if getattr(self, "global_batch_kept", False) else ()))
        trainer_utils_logger.addFilter(interval_filter)
        try:
            return super().train(*args, **kwargs)
        finally:
            trainer_utils_logger.removeFilter(interval_filter)


INTERVAL_ARGUMENTS = ("logging_steps", "eval_steps", "save_steps")


class _IntervalMismatch(logging.Filter):
    """Turns Trainer's resume warning into an INFO line when only the logging/eval/save intervals differ (and the
    per-device batch, where the global batch was kept)."""

    def __init__(self, allowed: tuple[str, ...] = INTERVAL_ARGUMENTS):
        super().__init__()
        self.allowed = allowed

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Warning: The following arguments do not match"):
            return True
        lines = [line.strip() for line in message.splitlines()[1:] if line.strip()]
        if not lines or any(line.split(":", 1)[0] not in self.allowed for line in lines):
            return True
        logger.info("Resumed with other intervals or per-device batch than the checkpoint recorded (%s): only when "
                    "logs, evaluations and checkpoints happen, or how the kept global batch is split, changes.",
                    "; ".join(lines))
        return False


class PretrainingTrainer(ExactResume, Trainer):
    """Trainer that also logs the mean of chosen scalar model outputs (e.g. `mlm_loss`, `sbo_loss`, `rtd_accuracy`)
    over each logging interval and over the held-out set, their perplexities, the held-out MLM loss and accuracy at
    [MASK]ed targets only (`add_masked_only`), and training throughput in non-padding tokens per second.
    `decay_norms_and_biases=True` applies weight decay to every parameter, as SpanBERT's fairseq code did."""

    def __init__(self, *args, logged_outputs=(), perplexity_of=(), decay_norms_and_biases=False,
                 max_nonfinite_steps: int | None = None, default_learning_rate: float | None = None,
                 model_flops=None, loss_terms=None, **kwargs):
        super().__init__(*args, **kwargs)
        # `--loss_normalization update` (or a recipe whose authors weigh per update): each term's sum over the
        # update's targets, counted on all processes before its first forward (`training.run.elastic`).
        self.update_normalization = None
        if loss_terms is not None:
            from encoder_zoo.training.run.elastic import UpdateNormalization

            config = getattr(self.accelerator.unwrap_model(self.model), "config", None)
            self.update_normalization = UpdateNormalization(loss_terms, config, self.args.world_size)
            self.loss_is_scaled_for_ga = True  # the counts span the accumulation steps: no division by them
        # Counted on the device and read (one sync) only when logged or saved: no host sync per micro-batch.
        self._pending_tokens: torch.Tensor | int = 0
        self._pending_flop_batches: list = []
        # The family's model-FLOP count (`training.run.flops.FlopCount`, its `Family.flops`); None: Trainer's estimate.
        self.model_flops = model_flops
        if self.args.label_names is None:
            # A batch has targets when it has `labels`; Trainer would also demand every other forward argument named
            # "*label*" (SpanBERT's `next_sentence_label`, fed by NSP runs only) and report no held-out loss without it.
            self.label_names = ["labels"]
        self.logged_outputs = tuple(logged_outputs)
        self.perplexity_of = tuple(perplexity_of)
        self.decay_norms_and_biases = decay_norms_and_biases
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0
        self._units: dict[str, int] = {}
        self._eval_sums: dict[str, torch.Tensor] = {}
        self._eval_count = 0
        self._masked_sums: dict[str, torch.Tensor] = {}  # `add_masked_only`: summed over [MASK]ed targets
        self._masked_count = 0
        self._interval_start = time.perf_counter()
        self._staging_root: str | None = None
        self.flop_count: str | None = None  # what `floating_point_ops` counts, once the first batch decided it
        self._flop_kind: str | None = None
        from encoder_zoo.training.run.timing import TimeShares

        self.clock = TimeShares()  # where the time goes, logged per interval (`training.run.timing`)
        self.add_callback(ClockMarks(self.clock))
        if hasattr(self.data_collator, "set_epoch"):
            self.add_callback(CollatorEpoch(self.data_collator))
        self.add_callback(LogAtCheckpoints())  # after SaveOnSignal, whose save it logs too
        add_divergence_guard(self, max_nonfinite_steps, resumable=True, default_learning_rate=default_learning_rate)

    def create_optimizer(self, model=None):
        from encoder_zoo.training.run.sharding import is_fsdp2, shard_model

        if self.optimizer is not None or not is_fsdp2(self):
            return super().create_optimizer(model)
        shard_model(self.model, self.accelerator)  # the zoo's FSDP2 plan, before the optimizer takes the parameters
        optimizer = super().create_optimizer(model)
        self._sharded_parameter_groups = [list(group["params"]) for group in optimizer.param_groups]
        return optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        # Called right after accelerate prepared the model and optimizer. accelerate re-maps the optimizer's parameters
        # by data pointer, which the empty shards of small parameters (a bias of size 1 on rank 1) share: give the
        # optimizer back the sharded parameters it was built with.
        groups = getattr(self, "_sharded_parameter_groups", None)
        if groups is not None:
            for group, params in zip(self.optimizer.param_groups, groups):
                group["params"] = params
            self._sharded_parameter_groups = None
        if self.lr_scheduler is None:  # each recipe keeps its paper's warmup fraction: say what this run gets
            logger.info("Learning-rate warmup: %d of %d updates (--warmup_steps %g)",
                        self.args.get_warmup_steps(num_training_steps), num_training_steps, self.args.warmup_steps)
        return super().create_scheduler(num_training_steps, optimizer)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """A resumed run trains at its own --learning_rate: the checkpoint's optimizer and schedule carry the rate
        they were made with, rescaled here to this run's (the schedule's shape and position kept). The same rate
        changes nothing, so an interrupted run still resumes bitwise."""
        scheduler = getattr(self.lr_scheduler, "scheduler", self.lr_scheduler)  # accelerate may wrap it
        wanted = list(getattr(scheduler, "base_lrs", None) or [])
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.clock.load(Path(checkpoint))  # the run's time totals continue
        loaded = list(getattr(scheduler, "base_lrs", None) or [])
        if checkpoint is None or not wanted or len(wanted) != len(loaded) or wanted == loaded or 0 in loaded:
            return
        for index, group in enumerate(self.optimizer.param_groups):
            ratio = wanted[index] / loaded[index]
            group["lr"] *= ratio
            group["initial_lr"] = wanted[index]
        scheduler.base_lrs = wanted
        scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]
        logger.warning("Resuming %s at --learning_rate %g; it was trained at %g: the schedule continues at the new "
                       "rate.", checkpoint, self.args.learning_rate, loaded[0] * self.args.learning_rate / wanted[0])

    def get_decay_parameter_names(self, model) -> list[str]:
        if self.decay_norms_and_biases:
            return [name for name, _ in model.named_parameters()]
        return super().get_decay_parameter_names(model)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            torch.manual_seed(self.dropout_seed())
        outputs = model(**inputs)
        if model.training:
            self.record(outputs, inputs)
        else:
            self.record_eval(outputs, inputs)
        loss = outputs["loss"]
        if model.training and self.update_normalization is not None:
            loss = self.update_normalization.loss(outputs, inputs)
        return (loss, outputs) if return_outputs else loss

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """An update's micro-batches; under update normalisation, their target counts summed over the processes."""
        self.clock.begin("data")
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        self.clock.end("data")
        self._micro_batch = 0  # this process's micro-batches of the update, counted by `dropout_seed`
        self.clock.begin("forward_backward", device=True)
        if self.update_normalization is not None:
            self.update_normalization.count(batch_samples, device,
                                            reduce=lambda counts: self.accelerator.reduce(counts, reduction="sum"))
        return batch_samples, num_items_in_batch

    def dropout_seed(self) -> int:
        """The seed of this micro-batch's dropout (and any other draw of the torch RNG in its forward): a function of
        (seed, update, the micro-batch's place in the global batch), as the masks are of their example. A micro-batch
        then draws the same dropout however the global batch is split into processes x accumulation steps, and after
        any resume. Place: a partitioned stream gives process p micro-batches p A .. p A + A - 1 of an update;
        Trainer's sampler, and the older streams, give it p, p + P, ... (batches dealt round the processes)."""
        from encoder_zoo.training.data.streaming import PartitionedExamples

        processes, accumulation = self.args.world_size, self.args.gradient_accumulation_steps
        rank, micro = self.args.process_index, getattr(self, "_micro_batch", 0)
        self._micro_batch = micro + 1
        if isinstance(self.train_dataset, PartitionedExamples):
            place = rank * accumulation + micro
        else:
            place = micro * processes + rank
        key = np.random.SeedSequence([self.args.seed, self.state.global_step, place])
        return int(key.generate_state(1, dtype=np.uint64)[0])

    def _get_train_sampler(self, train_dataset=None):
        """Trainer's shuffled order, cut to whole global batches per epoch: update k of an epoch trains examples
        [k x global, (k + 1) x global) of its permutation whatever the split into processes x per-device batch x
        accumulation (Trainer's own would end an epoch on a partial update that differs between splits)."""
        sampler = super()._get_train_sampler(train_dataset)
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if type(sampler) is not torch.utils.data.RandomSampler or sampler.replacement:
            return sampler
        from encoder_zoo.training.run.elastic import global_batch

        total = global_batch(self.args)
        whole = len(dataset) // total * total
        if not whole or whole == len(dataset):
            return sampler
        return torch.utils.data.RandomSampler(dataset, num_samples=whole, generator=sampler.generator)

    def floating_point_ops(self, inputs) -> int:
        """Model FLOPs of one forward + backward on a training batch, summed by Trainer into `state.total_flos`
        (trainer_state.json): the family's model-FLOP count (`model_flops`, on `training/run/flops.py`'s formulas;
        bench_gpu.py's MFU numerator) where it has one, else Trainer's estimate (6 x non-embedding parameters x input
        tokens). Which count this run uses is decided at its first batch, logged once and kept as `flop_count`."""
        model = self.accelerator.unwrap_model(self.model)
        if self.flop_count is not None:
            if not self._flop_kind:
                return super().floating_point_ops(inputs)
            # The count reads data-dependent sizes (real tokens, targets): kept until the next log or save, counted
            # then in one go, so no micro-batch waits for the device.
            self._pending_flop_batches.append(inputs)
            if len(self._pending_flop_batches) >= PENDING_FLOP_BATCHES:
                self._count_pending_flops()
            return 0
        kind = self.model_flops.kind(model, inputs) if self.model_flops is not None else None
        flops, reason = None, "no model-FLOP count for this model"
        if kind is not None:
            try:
                flops = self.model_flops.count(kind, model, inputs)
            except ValueError as error:
                kind, reason = None, str(error)
        self._flop_kind = kind
        self.flop_count = f"model FLOPs, counted as {kind!r}" if kind else "Trainer's estimate"
        if self.args.should_log:
            if kind:
                logger.info("total_flos: model FLOPs of each train step, counted as %r by %s.%s.", kind,
                            self.model_flops.count.__module__, self.model_flops.count.__qualname__)
            else:
                logger.info("total_flos: Trainer's estimate, 6 x non-embedding parameters x input tokens (%s).", reason)
        return flops if kind else super().floating_point_ops(inputs)

    def _count_pending_flops(self) -> None:
        if self._pending_flop_batches:
            model = self.accelerator.unwrap_model(self.model)
            self.current_flos += float(sum(self.model_flops.count(self._flop_kind, model, inputs)
                                           for inputs in self._pending_flop_batches))
            self._pending_flop_batches = []

    def store_flos(self) -> None:
        self._count_pending_flops()
        super().store_flos()

    def _track_num_input_tokens(self, inputs) -> None:
        """Trainer's count of the tokens seen, kept on the device until the next log or save (Trainer gathers and
        reads it at every micro-batch)."""
        mode = self.args.include_num_input_tokens_seen
        if mode == "no" or "input_ids" not in inputs:
            return super()._track_num_input_tokens(inputs)
        if mode == "non_padding" and "attention_mask" in inputs:
            tokens = inputs["attention_mask"].sum()
        elif mode == "non_padding" and getattr(self.processing_class, "pad_token_id", None) is not None:
            tokens = (inputs["input_ids"] != self.processing_class.pad_token_id).sum()
        else:
            tokens = inputs["input_ids"].numel()
        self._pending_tokens = self._pending_tokens + tokens

    def _add_pending_tokens(self) -> None:
        """Every process calls this at the same points (log, save): the pending counts are summed over them."""
        pending = torch.as_tensor(self._pending_tokens, device=self.args.device, dtype=torch.int64)
        self._pending_tokens = 0
        if self.args.include_num_input_tokens_seen == "no":
            return
        if self.args.world_size > 1:
            pending = self.accelerator.reduce(pending, reduction="sum")
        self.state.num_input_tokens_seen += int(pending.item())

    def throughput(self, inputs) -> dict[str, torch.Tensor | int]:
        """What one training batch counts towards the logged `<unit>_per_second`: its non-padding tokens (a device
        tensor, read when logged)."""
        return {"tokens": (inputs["attention_mask"].sum() if "attention_mask" in inputs
                           else inputs["input_ids"].numel())}

    def record(self, outputs, inputs) -> None:
        """Add one training batch's logged outputs and throughput to the current logging interval."""
        for unit, count in self.throughput(inputs).items():
            self._units[unit] = self._units.get(unit, 0) + count
        self._count += 1
        self._add(self._sums, outputs, 1)

    def record_eval(self, outputs, inputs) -> None:
        """Add one held-out batch's logged outputs, weighted by its size as Trainer weighs eval_loss, and its
        masked-only MLM figures (`add_masked_only`)."""
        weight = inputs["input_ids"].shape[0]
        self._eval_count += weight
        self._add(self._eval_sums, outputs, weight)
        self.add_masked_only(outputs, inputs)

    def add_masked_only(self, outputs, inputs) -> None:
        """Add one held-out batch's MLM loss and top-1 hits at the targets replaced by [MASK] (`labels != -100` and
        `input_ids == mask_token_id`), summed per target. The model's `mlm_loss` averages every target of BERT's
        80/10/10, a tenth of which are left unchanged and copied from the input; only a [MASK]ed target is predicted
        unseen. Reads the `mlm_logits` a masked-LM head returns, one row per target in row-major order (SpanBERT's and
        TEAMS's generator's), so no second forward; a model without them (cloze, BERTAC) adds nothing."""
        logits = outputs.get("mlm_logits") if hasattr(outputs, "get") else None
        labels, mask_id = inputs.get("labels"), getattr(self.processing_class, "mask_token_id", None)
        if logits is None or labels is None or mask_id is None or logits.dim() != 2:
            return
        targets = labels != -100
        if logits.shape[0] != targets.sum().item():
            raise ValueError(f"mlm_logits has {logits.shape[0]} rows for {targets.sum().item()} targets: the "
                             "masked-only held-out loss reads one row per `labels != -100` position, row-major")
        at_mask = inputs["input_ids"][targets] == mask_id
        logits, gold = logits[at_mask].float(), labels[targets][at_mask]
        sums = self._masked_sums
        sums[MASKED_LOSS] = sums.get(MASKED_LOSS, 0.0) + F.cross_entropy(logits, gold, reduction="sum").detach()
        sums[MASKED_ACCURACY] = sums.get(MASKED_ACCURACY, 0.0) + (logits.argmax(-1) == gold).sum().float()
        self._masked_count += int(at_mask.sum())

    def _add(self, sums: dict, outputs, weight: int) -> None:
        for name in self.logged_outputs:
            value = outputs.get(name) if hasattr(outputs, "get") else None
            if value is not None:
                sums[name] = sums.get(name, 0.0) + value.detach().float() * weight

    def _reduced_means(self, sums: dict, count: float, *extra: float,
                       across_processes: bool = True) -> tuple[dict[str, float], list[float]]:
        """Means of `sums` over `count` across processes (every rank logs at the same steps), and `extra` summed;
        `across_processes=False`: this process's alone (each held the whole of it)."""
        device = self.args.device
        names = sorted(sums)
        stacked = torch.stack([torch.as_tensor(sums[n], device=device, dtype=torch.float32) for n in names] +
                              [torch.as_tensor(v, device=device).float() for v in (count, *extra)])
        if across_processes and self.args.world_size > 1:
            stacked = self.accelerator.reduce(stacked, reduction="sum")
        total = max(stacked[len(names)].item(), 1e-12)
        means = {}
        for index, name in enumerate(names):
            means[name] = round(stacked[index].item() / total, 4)
            if name in self.perplexity_of:
                means[name.removesuffix("_loss") + "_ppl"] = round(math.exp(min(means[name], 50.0)), 2)
        return means, [v.item() for v in stacked[len(names) + 1 :]]

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        self._add_pending_tokens()  # every process logs at the same points; Trainer's log reports the total
        if "loss" in logs and self._count:
            units = sorted(self._units)
            means, totals = self._reduced_means(self._sums, self._count, *(self._units[u] for u in units))
            logs.update(means)
            elapsed = time.perf_counter() - self._interval_start
            for unit, total in zip(units, totals):
                logs[f"{unit}_per_second"] = round(total / max(elapsed, 1e-9), 1)
            self._sums, self._count, self._units = {}, 0, {}
            self._interval_start = time.perf_counter()
            seconds = self.clock.interval()
            if self.args.should_log:  # this process's clock: its own wait for data
                from encoder_zoo.training.run.timing import shares_text

                logger.info("Step %d, time since the last log: %s.", self.state.global_step, shares_text(seconds))
        # No start time (Trainer passes it with each step's log): with --include_num_input_tokens_seen, Trainer would
        # add the session's train_runtime and train_tokens_per_second to every step's log, timings that make two equal
        # runs' logs differ (the interval's tokens_per_second above says the same); num_input_tokens_seen stays.
        super().log(logs)

    # ------------------------------------------------------------------ data loaders
    def get_train_dataloader(self):
        from encoder_zoo.training.data.streaming import ExampleStream

        if isinstance(self.train_dataset, ExampleStream):
            # Each process streams its own part already: accelerate must neither re-shard nor dispatch it, and the
            # position saved with a checkpoint must be that of the batches trained on, so the examples are handed out
            # in this process, one batch at a time (a stream packs in its own pool, --dataloader_num_workers). Its own
            # generator: creating the iterator must not draw from the global RNG that a resumed run has just restored
            # (dropout, in-model sampling).
            return torch.utils.data.DataLoader(self.train_dataset, batch_size=self._train_batch_size,
                                               collate_fn=self.data_collator,
                                               pin_memory=self.args.dataloader_pin_memory,
                                               generator=torch.Generator().manual_seed(self.args.seed))
        return workers_ignore_stop_signals(super().get_train_dataloader())

    def get_eval_dataloader(self, eval_dataset=None):
        """Held-out batches get the collator's evaluation copy: masks fixed per example, whatever the epoch. Every
        process evaluates every held-out example, in the same batches as one process does: held-out sets are small,
        and a split over the processes would pad its last batches with repeated examples (accelerate's even batches),
        counted twice, so that the numbers changed with the number of processes."""
        collator = self.data_collator
        if hasattr(collator, "for_evaluation"):
            collator = collator.for_evaluation()
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, str):
            dataset = self.eval_dataset[dataset]
        loader = torch.utils.data.DataLoader(dataset, batch_size=self.args.eval_batch_size, collate_fn=collator,
                                             num_workers=self.args.dataloader_num_workers,
                                             pin_memory=self.args.dataloader_pin_memory)
        return workers_ignore_stop_signals(loader)

    # ------------------------------------------------------------------ held-out evaluation
    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):
        """Adds each objective's held-out loss (and perplexity) to the metrics. Runs under a forked, fixed torch
        RNG: in-model sampling (TEAMS's generator) scores the same every time and leaves training's stream alone."""
        self._eval_sums, self._eval_count = {}, 0
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.args.seed)
            output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                             metric_key_prefix)
        if self._eval_sums:  # each process evaluated the whole set (`get_eval_dataloader`): no sum across them
            means, _ = self._reduced_means(self._eval_sums, self._eval_count, across_processes=False)
            output.metrics.update({f"{metric_key_prefix}_{name}": value for name, value in means.items()})
        if self._masked_sums:
            self._report_masked_only(output.metrics, metric_key_prefix)
        self._eval_sums, self._eval_count = {}, 0
        self._masked_sums, self._masked_count = {}, 0
        return output

    def _report_masked_only(self, metrics: dict, prefix: str) -> None:
        """The masked-only MLM loss and accuracy (per target, over every process) into `metrics`, and the log's
        headline line: they, not the 80/10/10 mean, say how well the model predicts a word it does not see."""
        means, (count,) = self._reduced_means(self._masked_sums, self._masked_count, self._masked_count,
                                              across_processes=False)
        if not count:
            return
        metrics.update({f"{prefix}_{MASKED_LOSS}": means[MASKED_LOSS], f"{prefix}_{MASKED_ACCURACY}":
                        means[MASKED_ACCURACY], f"{prefix}_{MASKED_TARGETS}": int(count)})
        if self.args.should_log:
            mixed = metrics.get(f"{prefix}_mlm_loss")
            logger.info("Held-out MLM loss at [MASK] targets only: %.4f nats, top-1 accuracy %.2f points "
                        "(%d targets)%s.", means[MASKED_LOSS], 100 * means[MASKED_ACCURACY], count,
                        "" if mixed is None else f"; over all 80/10/10 targets (mlm_loss): {mixed:.4f}")

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
        self._add_pending_tokens()  # every process saves: the tokens seen so far go into trainer_state.json
        self.store_flos()
        from encoder_zoo.training.data.streaming import ExampleStream

        self.clock.begin("checkpoint")
        try:
            super()._save_checkpoint(model, trial)
            if self.args.should_save:
                self.clock.save(staging / name)
                if getattr(self, "batch_record", None) is not None:  # the global batch this checkpoint trained with
                    from encoder_zoo.training.run.elastic import write_batch_record

                    write_batch_record(staging / name, self.batch_record)
            if isinstance(self.train_dataset, ExampleStream):  # where the stream stands: steps x global batch
                from encoder_zoo.training.run.elastic import global_batch

                self.train_dataset.save(staging / name, consumed=self.state.global_step * global_batch(self.args))
        except OSError as error:  # disk full, folder made read-only: the checkpoints already published stay as they are
            if self.args.should_save:
                shutil.rmtree(staging / name, ignore_errors=True)
            raise SaveFailed.of(error, name, run_dir) from error
        finally:
            self._staging_root = None
        if os.environ.get(SAVE_PAUSE_ENV) == str(self.state.global_step):
            time.sleep(600)
        self.accelerator.wait_for_everyone()  # every rank's files (rng_state_N.pth) are written
        self.clock.end("checkpoint")
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


class ClockMarks(TrainerCallback):
    """Marks the trainer's clock (`training.run.timing`) where Trainer's loop calls back: forward and backward end
    before the optimizer step (gradient clipping included), which ends at `on_optimizer_step`."""

    def __init__(self, clock):
        self.clock = clock

    def on_train_begin(self, args, state, control, **kwargs):
        self.clock.restart()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.clock.end("forward_backward", device=True)
        self.clock.begin("optimizer", device=True)

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.clock.end("optimizer", device=True)


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
    that stopped training (None if none did). A second signal aborts at once, unless it comes within
    `SAME_REQUEST_SECONDS` of the first: a launcher passing on the signal that reached every process of the job
    (Slurm's --signal, Ctrl-C in a terminal) is the same request, not a second one."""

    SAME_REQUEST_SECONDS = 5.0

    def __init__(self):
        self.signum: int | None = None
        self._first_at: float | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def on_train_begin(self, args, state, control, **kwargs):
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._request)

    def _request(self, signum, frame):
        now = time.monotonic()
        if self._first_at is None:
            self._first_at = now
        elif now - self._first_at > self.SAME_REQUEST_SECONDS:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def on_step_end(self, args, state, control, **kwargs):
        if args.world_size > 1 and torch.distributed.is_initialized():  # all ranks stop at the same step
            flag = torch.tensor([self.signum or 0], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            self.signum = int(flag.item()) or None
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control


class LogAtCheckpoints(TrainerCallback):
    """Logs the training loss (and each objective's interval mean) at every checkpoint and at the run's last step, as
    well as every --logging_steps. A resumed run starts a new logging interval at its checkpoint: were the checkpoint
    inside an interval, its first log would average the steps after the checkpoint only, and Trainer's `train_loss`
    those of the session. With a log at each checkpoint nothing is pending when one is saved, so a resumed run logs
    what the uninterrupted run logs, and the logs reach the last step, from which the run's mean loss is computed
    (`training.run.export.mean_logged_loss`). A stop by signal (`SaveOnSignal`) saves and so logs at its step: a
    run resumed from there has that log entry more than an uninterrupted one. Must run after every callback that
    asks for a save."""

    def on_step_end(self, args, state, control, **kwargs):
        if args.logging_strategy != "no" and (control.should_save or control.should_training_stop):
            control.should_log = True
        return control

    on_epoch_end = on_step_end  # a save at each epoch's end (--save_strategy epoch)


class SaveFailed(OSError):
    """Writing a checkpoint or an export failed (disk full, read-only folder); what was saved before is intact."""

    @classmethod
    def of(cls, error: OSError, what: str, run_dir: Path) -> "SaveFailed":
        from transformers.trainer_utils import get_last_checkpoint

        cause = error.strerror or str(error) or type(error).__name__
        where = f" writing {error.filename}" if error.filename else ""
        last = get_last_checkpoint(str(run_dir)) if run_dir.is_dir() else None
        kept = f"the newest checkpoint, {last}, is intact" if last else "no earlier checkpoint was lost"
        return cls(error.errno, f"could not save {what} ({cause}{where}); nothing of it was published and {kept}. Free "
                   f"space (or make {run_dir} writable), then rerun with --resume_from_checkpoint true.")


class TrainingDiverged(RuntimeError):
    """Training stopped because a loss, an objective, a gradient norm or the parameters became NaN or infinite, before
    the bad step was applied or saved. `exit_code`: `DIVERGED_EXIT_CODE`."""

    exit_code = DIVERGED_EXIT_CODE


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor shard (FSDP2): its local part


class DivergenceGuard(TrainerCallback):
    """Stops a run whose training diverged, at the step it happened, before the optimizer applies it.

    Each training forward's `loss` and every `*_loss` the model returns (the objectives, e.g. `mlm_loss`, `sbo_loss`)
    are recorded by a forward hook; before each optimizer step the gradient norm joins them. A non-finite value on any
    process makes the step non-finite on every process. After `max_nonfinite_steps` such steps in a row the run stops
    with `TrainingDiverged`, naming the step, the value and the newest checkpoint (nothing of the bad step is applied
    or saved); below that the step is skipped (its gradients dropped), as fp16 loss scaling skips overflowing steps.
    The parameters are checked as well before each save and after the last step, so no checkpoint or export ever
    holds a non-finite weight. Default limit: 1, or 20 with --fp16. (DeepSpeed keeps gradients out of `.grad`: there
    the losses are checked, not the gradient norm.)

    The stop message names the likely cause: weights that were already non-finite or huge when training began (a
    damaged input model, NaN or overflowing word vectors), else the learning rate, with a rate to try: at least 10x
    lower, and never above `default_learning_rate` (the recipe's) when one is given.
    """

    def __init__(self, max_nonfinite_steps: int | None = None, resumable: bool = False,
                 default_learning_rate: float | None = None):
        if max_nonfinite_steps is not None and max_nonfinite_steps < 1:
            raise ValueError(f"--max_nonfinite_steps {max_nonfinite_steps}: pass at least 1 (1 stops at the first "
                             "non-finite step).")
        self.max_nonfinite_steps = max_nonfinite_steps
        self.resumable = resumable
        self.default_learning_rate = default_learning_rate
        self.consecutive = 0
        self.input_problem: str | None = None  # what was wrong with the weights training began from, if anything
        self._values: list[tuple[str, torch.Tensor]] = []
        self._hook = None

    def limit(self, args) -> int:
        return self.max_nonfinite_steps or (20 if args.fp16 else 1)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._remove_hook()
        self.consecutive, self._values = 0, []
        if model is not None:
            self.input_problem = starting_weights_problem(model)
            self._hook = model.register_forward_hook(self._record)

    def on_train_end(self, args, state, control, **kwargs):
        self._remove_hook()

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _record(self, module, inputs, output) -> None:
        if not module.training or not isinstance(output, Mapping):
            return
        for name, value in output.items():
            if (name == "loss" or name.endswith("_loss")) and isinstance(value, torch.Tensor) and value.numel() == 1:
                self._values.append((name, value.detach().reshape(())))

    def _any_bad(self, args, values: list[torch.Tensor]) -> tuple[int, list[bool]]:
        """(1 if a value of any process is non-finite, else 0; which of this process's values are)."""
        finite = torch.stack([torch.isfinite(v).all().to(args.device) for v in values]) if values else None
        bad = ((~finite).any().int().reshape(1) if finite is not None
               else torch.zeros(1, dtype=torch.int, device=args.device))
        if args.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        return int(bad.item()), ([] if finite is None else (~finite).tolist())

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        named, self._values = self._values, []
        grads = [_local(p.grad) for p in model.parameters() if p.grad is not None] if model is not None else []
        if grads:
            named.append(("gradient norm", torch.nn.utils.get_total_norm(grads).float()))
        bad, which = self._any_bad(args, [value for _, value in named])
        if not bad:
            self.consecutive = 0
            return
        self.consecutive += 1
        step = state.global_step + 1  # its loss came from the weights of the step before the streak began
        seen: dict[str, torch.Tensor] = {}  # each non-finite name with its first value, the objectives first
        for (name, value), is_bad in sorted(zip(named, which),
                                            key=lambda item: item[0][0] in ("loss", "gradient norm")):
            if is_bad:
                seen.setdefault(name, value)
        what = (f"{', '.join(seen)} became non-finite ({', '.join(f'{n} {v.item():.4g}' for n, v in seen.items())})"
                if seen else "a loss or the gradient norm of another process became non-finite")
        limit = self.limit(args)
        if self.consecutive >= limit:
            if limit > 1:
                what = f"{limit} steps in a row were non-finite (--max_nonfinite_steps {limit}); at the last, {what}"
            raise TrainingDiverged(self._stop_message(args, step, what, "training stopped before that update",
                                                      bad_weights_step=step - self.consecutive))
        logger.warning("Step %d skipped: %s (%d of %d non-finite steps in a row allowed).", step, what,
                       self.consecutive, limit)
        model.zero_grad(set_to_none=True)  # the optimizer skips parameters without gradients: nothing is applied

    def on_step_end(self, args, state, control, model=None, **kwargs):
        last = state.max_steps and state.global_step >= state.max_steps
        if model is None or not (control.should_save or control.should_training_stop or last):
            return
        bad, _ = self._any_bad(args, [_local(p.detach()) for p in model.parameters()])
        if bad:
            raise TrainingDiverged(self._stop_message(
                args, state.global_step, "the update of that step made parameters non-finite",
                "training stopped before saving them", bad_weights_step=state.global_step))

    def _stop_message(self, args, step: int, what: str, stopped: str, bad_weights_step: int, other_fix: str = "",
                      first_bad: str = "the first non-finite value") -> str:
        """The stop message. The weights after `bad_weights_step` updates gave the first bad value: a checkpoint of that
        step (saved when its values were finite, e.g. a huge learning rate's update) is not a good one."""
        saved = {int(p.name[len(PREFIX_CHECKPOINT_DIR) + 1:]): p
                 for p in Path(args.output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*")
                 if p.name[len(PREFIX_CHECKPOINT_DIR) + 1:].isdigit() and checkpoint_is_complete(p)}
        good = [saved[k] for k in sorted(saved) if k < bad_weights_step]
        lower = suggested_learning_rate(args.learning_rate, self.default_learning_rate)
        advice = (f"{saved[bad_weights_step]} holds the weights that gave {first_bad}. "
                  if bad_weights_step in saved else "")
        advice += self.cause(args)
        if self.input_problem:
            advice += (f"The last good checkpoint is {good[-1]}. " if good else "") + ("Fix the weights first; a lower "
                                                                                     "learning rate will not help.")
        elif good and self.resumable:
            advice += (f"The last good checkpoint is {good[-1]}: resume from it at a lower learning rate, e.g. "
                       f"--resume_from_checkpoint {good[-1]} --learning_rate {lower}{other_fix}.")
        elif good:
            advice += (f"The last good checkpoint is {good[-1]}. Rerun with a lower --learning_rate (e.g. {lower})"
                       f"{other_fix}.")
        else:
            advice += (f"No good checkpoint was saved before it. Rerun with a lower --learning_rate (e.g. {lower})"
                       f"{other_fix}.")
        return f"training diverged at step {step}: {what}; {stopped}, and no model was saved or exported. {advice}"

    def cause(self, args) -> str:
        """The likely cause, as a sentence: the starting weights if they were bad, else the learning rate."""
        if self.input_problem:
            return f"Likely cause: {self.input_problem}. "
        default = self.default_learning_rate
        ratio = (f", {args.learning_rate / default:.3g} times the recipe's default {default:g}"
                 if default and args.learning_rate > default else "")
        return f"Likely cause: the learning rate ({args.learning_rate:g}{ratio}) is too high for this run. "


def suggested_learning_rate(learning_rate: float, default: float | None = None) -> str:
    """A learning rate to retry with: at least 10x lower than `learning_rate`, and never above `default`."""
    lower = learning_rate / 10
    if default and default <= lower:
        return f"{default:g}"
    if not math.isfinite(lower) or lower <= 0:
        return f"{lower:g}"
    exponent = math.floor(math.log10(lower))
    mantissa = math.floor(lower / 10**exponent * 10 + 1e-9) / 10  # two digits, rounded down: never above the bound
    return f"{mantissa * 10**exponent:.2g}"


# Weights beyond this magnitude are not learnt values: fp32 overflows once a few such products are summed.
HUGE_WEIGHT = 1e6


def starting_weights_problem(model) -> str | None:
    """What is wrong with the weights a run starts from, in words (None if nothing): parameters (or the input
    embeddings, trainable or a frozen buffer) holding NaN/inf or values beyond `HUGE_WEIGHT`. Buffers other than the
    input embeddings are left alone: some models keep masks of -inf there by design."""
    tensors = dict(model.named_parameters())
    try:
        embeddings = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):  # not a transformers model, or one without word embeddings
        embeddings = None
    embedding_weight = getattr(embeddings, "weight", None) if embeddings is not None else None
    frozen_embeddings = None
    if isinstance(embedding_weight, torch.Tensor):
        frozen_embeddings = next((name for name, buffer in model.named_buffers() if buffer is embedding_weight), None)
        if frozen_embeddings:
            tensors[frozen_embeddings] = embedding_weight
    # Each process checks its own shard (FSDP): a shard may be empty, and empty ones are skipped.
    floating = {name: local for name, t in tensors.items() if t.is_floating_point()
                for local in [_local(t.detach())] if local.numel()}
    if not floating:
        return None
    names = list(floating)
    with torch.no_grad():
        finite = torch.stack([torch.isfinite(t).all() for t in floating.values()]).tolist()
        largest = torch.stack([t.abs().max().float() if f else t.new_zeros((), dtype=torch.float32)
                               for t, f in zip(floating.values(), finite)]).tolist()
    non_finite = [name for name, ok in zip(names, finite) if not ok]
    huge = [(name, value) for name, value in zip(names, largest) if value > HUGE_WEIGHT]
    if not non_finite and not huge:
        return None

    def label(name: str) -> str:
        if name == frozen_embeddings:
            return f"{name} (the frozen word vectors: bertac_cnn's --word_vectors)"
        if embedding_weight is not None and tensors.get(name) is embedding_weight:
            return f"{name} (the input word embeddings)"
        return name

    if non_finite:
        shown = ", ".join(label(n) for n in non_finite[:3]) + (", ..." if len(non_finite) > 3 else "")
        return (f"the weights training began from were already non-finite: {len(non_finite)} of {len(names)} weight "
                f"tensors hold NaN/inf ({shown}); the input model, checkpoint or word vectors are damaged")
    name, value = max(huge, key=lambda item: item[1])
    return (f"the weights training began from hold values up to {value:.3g} in magnitude ({label(name)}"
            + (f" and {len(huge) - 1} more" if len(huge) > 1 else "") + "), which overflow in fp32; the input model, "
            "checkpoint or word vectors are damaged")


def add_divergence_guard(trainer, max_nonfinite_steps: int | None = None, resumable: bool = False,
                         default_learning_rate: float | None = None) -> None:
    """Give `trainer` a `DivergenceGuard` unless its callbacks hold one already."""
    if not any(isinstance(c, DivergenceGuard) for c in trainer.callback_handler.callbacks):
        trainer.add_callback(DivergenceGuard(max_nonfinite_steps, resumable=resumable,
                                             default_learning_rate=default_learning_rate))


def divergence_guard(trainer) -> DivergenceGuard | None:
    return next((c for c in trainer.callback_handler.callbacks if isinstance(c, DivergenceGuard)), None)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
# FSDP's weights: a DCP folder pytorch_model_fsdp_N/ (SHARDED_STATE_DICT) or a .bin file (FULL_STATE_DICT).
FSDP_WEIGHTS = "pytorch_model_fsdp"


def checkpoint_is_complete(folder: Path) -> bool:
    """A checkpoint folder Trainer can resume from: its state and weights are there, its sharded (DCP) parts whole."""
    return checkpoint_problem(folder) is None


def checkpoint_problem(folder: Path, deep: bool = True) -> str | None:
    """Why `folder` is not a checkpoint Trainer can resume from, in words (None: it is one). Shallow (`deep` False):
    only whether its state and weights are there (what a save killed half-way lacks), not whether they are whole."""
    has_weights = any((folder / name).exists() for name in WEIGHT_FILES) or any(folder.glob(f"{FSDP_WEIGHTS}*"))
    if not (folder / "trainer_state.json").is_file() or not has_weights:
        return "incomplete: no trainer_state.json or weights"
    for record in ("trainer_state.json", "config.json")[:2 if deep else 1]:  # Trainer reads both on resuming
        try:
            if (folder / record).is_file():
                json.loads((folder / record).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            return f"its {record} is damaged ({error})"
    if not deep:
        return None
    from encoder_zoo.training.run.loading import damaged_weights

    weights = damaged_weights(str(folder))  # an empty or truncated model.safetensors, named
    if weights:
        return weights.replace(f"{folder}{os.sep}", "its ", 1)
    for part in sorted(p for p in folder.iterdir() if is_dcp_folder(p)):
        problem = dcp_problem(part)
        if problem:
            return f"its sharded {part.name}/ {problem}"
    return None


def is_dcp_folder(path: Path) -> bool:
    """A torch.distributed.checkpoint folder (FSDP's SHARDED_STATE_DICT saves: pytorch_model_fsdp_N/, optimizer_N/)."""
    if not path.is_dir():
        return False
    if path.name.startswith(f"{FSDP_WEIGHTS}_") or (path.name.startswith("optimizer_") and path.name[10:].isdigit()):
        return True
    return (path / ".metadata").exists() or any(path.glob("*.distcp"))


def dcp_problem(folder: Path) -> str | None:
    """What is wrong with a DCP folder, in words (None: whole): its `.metadata` must be readable and every file it
    lists present and as long as the data it places there (the check torch makes only while loading, on each rank)."""
    from torch.distributed.checkpoint import FileSystemReader

    if not (folder / ".metadata").is_file():
        return "has no .metadata (the index DCP writes last)"
    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
        ends: dict[str, int] = {}
        for info in metadata.storage_data.values():
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    except Exception as error:  # noqa: BLE001 - an unpickled index can fail in any way
        return f"has a damaged .metadata ({type(error).__name__})"
    for name, end in sorted(ends.items()):
        path = folder / name
        if not path.is_file():
            return f"lacks {name}, which its .metadata lists"
        if path.stat().st_size < end:
            return f"has {name} truncated ({path.stat().st_size} of {end} bytes)"
    return None


def engine_mismatch(checkpoint: Path, fsdp: bool) -> str | None:
    """Why a run under FSDP (`fsdp`) or not cannot load `checkpoint`'s weights (None: it can): FSDP loads only its own
    saves, and any other engine only plain weight files."""
    sharded = any(checkpoint.glob(f"{FSDP_WEIGHTS}*"))
    plain = any((checkpoint / name).exists() for name in WEIGHT_FILES)
    if fsdp and not sharded:
        return ("holds a DDP (unsharded) checkpoint, which an FSDP run cannot load; resume it with the engine that "
                "saved it (training/accelerate_configs/ddp.yaml)")
    if not fsdp and sharded and not plain:
        return ("holds an FSDP checkpoint, which only an FSDP run can load; resume it with the accelerate config that "
                "saved it (training/accelerate_configs/fsdp_*.yaml)")
    return None


class GanCollapsed(TrainingDiverged):
    """A GAN's losses and gradients collapsed to exactly 0 (or stopped changing): it learns nothing any more."""


class NonFiniteLossError(TrainingDiverged):
    """A loss or gradient became NaN or infinite. Raised before the update that would use it, so nothing bad is
    applied or saved: the last checkpoint stays the last good state."""


class GanTrainer(PretrainingTrainer):
    """Alternating two-player training (BERTAC's Algorithm 1) for a model whose forward takes `gan_step`:
    "discriminator" returns the loss of D and R (F untouched), "generator" the loss of F (D untouched). A model
    whose `config.pretraining_objective` is not "gan" (e.g. the self-supervised ablation) trains with one update.

    Logs what the model outputs of both calls (`logged_outputs`), pairs and words per second; evaluation reports
    the mean of the same outputs on the held-out pairs as `eval_<name>`. A NaN/inf loss or gradient stops the run
    with `NonFiniteLossError` before the update that would apply it. So does a collapse (`GanCollapsed`): a GAN whose
    gradients are all exactly 0 while its losses are 0 or repeat the step before learns nothing any more (a huge
    learning rate saturates D instead of making it NaN); after `--max_nonfinite_steps` such steps in a row the run
    stops as a diverged one does (status 3, nothing exported).
    """

    accumulates = False  # each batch is two updates: the global batch is split over the processes only

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.args.gradient_accumulation_steps != 1:
            raise ValueError("The GAN updates D and R, then F, on every batch: gradient accumulation would reorder "
                             "that. Drop --gradient_accumulation_steps and raise --per_device_train_batch_size "
                             "instead.")
        if self.args.fp16:
            raise ValueError("The GAN trains in fp32 (its outputs are unnormalised and grow): drop --fp16.")
        if self.args.ddp_find_unused_parameters is False:
            raise ValueError("Each GAN call trains only some networks: drop --ddp_find_unused_parameters false.")
        # The frozen word table is a buffer, the same on every rank: never re-broadcast it at each forward.
        self.args.ddp_broadcast_buffers = False
        config = getattr(self.model, "config", None)
        self.alternating = getattr(config, "pretraining_objective", "gan") == "gan"
        self.non_saturating = getattr(config, "generator_loss", None) == "non_saturating"
        self._discriminator_outputs: dict[str, torch.Tensor] = {}
        self._previous_values: torch.Tensor | None = None
        self._collapsed_steps = 0

    def throughput(self, inputs) -> dict[str, torch.Tensor | int]:
        words = inputs["attention_mask"].sum() + inputs["entity_attention_mask"].sum()
        return {"pairs": int(inputs["input_ids"].shape[0]), "words": words}

    def training_step(self, model, inputs, num_items_in_batch=None):
        if not self.alternating:
            loss = super().training_step(model, inputs, num_items_in_batch)
            self._stop_if_collapsed(self._stop_if_not_finite("training", loss, model), ("the MSE objective",))
            return loss
        model.train()
        inputs = self._prepare_inputs(inputs)
        # Two optimisers in one: Trainer's optimizer (built from --optim, so checkpointed, restored and scheduled by
        # Trainer) holds the parameters of R, D and F and is stepped twice per batch. torch optimizers skip every
        # parameter whose .grad is None, so the first step (here, after D and R's backward, F computed without
        # gradient) moves only D and R, and Trainer's own step after F's backward (D used through a detached copy)
        # moves only F, against the updated D: Algorithm 1's order. Each backward runs after its own forward through
        # the (DDP-)wrapped model, so every process all-reduces the gradients of the networks that call trains.
        with self.compute_loss_context_manager():
            outputs = model(**inputs, gan_step="discriminator")
        self.accelerator.backward(outputs.loss)
        discriminator = self._stop_if_not_finite("discriminator (D and R)", outputs.loss, model)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._discriminator_outputs = {name: value for name, value in outputs.items() if value.dim() == 0}
        loss = super().training_step(model, inputs, num_items_in_batch)  # F: compute_loss below, then backward
        generator = self._stop_if_not_finite("generator (F)", loss, model)
        self._stop_if_collapsed(torch.cat([discriminator, generator]), ("D and R", "F"))
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and self.alternating:
            outputs = model(**inputs, gan_step="generator")
            self.record({**self._discriminator_outputs, **outputs}, inputs)
        else:
            outputs = model(**inputs)
            if model.training:
                self.record(outputs, inputs)
            else:
                self.record_eval(outputs, inputs)
        return (outputs["loss"], outputs) if return_outputs else outputs["loss"]

    def _stop_if_not_finite(self, which: str, loss: torch.Tensor, model) -> torch.Tensor:
        """Stop on a non-finite loss or gradient; returns (loss, gradient norm), the same on every process."""
        gradients = [p.grad for p in model.parameters() if p.grad is not None]
        values = torch.stack([loss.detach().float().reshape(()),
                              torch.nn.utils.get_total_norm(gradients).float() if gradients
                              else loss.new_zeros((), dtype=torch.float32)])
        if self.args.world_size > 1:  # every rank must stop together, and judge a collapse on the same values
            values = self.accelerator.reduce(values, reduction="mean")
        if not torch.isfinite(values).all().item():
            from transformers.trainer_utils import get_last_checkpoint

            last = get_last_checkpoint(self.args.output_dir) if os.path.isdir(self.args.output_dir) else None
            raise NonFiniteLossError(
                f"the {which} loss became {values[0].item():.4g} (gradient norm {values[1].item():.4g}) at step "
                f"{self.state.global_step + 1}; training stopped before that update. "
                + (f"The last good checkpoint, {last}, is kept. " if last else "No checkpoint was saved yet. ")
                + self._gan_advice(last))
        return values

    def _gan_advice(self, last_checkpoint: str | None) -> str:
        guard = divergence_guard(self)
        cause = guard.cause(self.args) if guard else ""
        if guard and guard.input_problem:
            return cause + "Fix the weights first; a lower learning rate will not help."
        lower = suggested_learning_rate(self.args.learning_rate, guard.default_learning_rate if guard else None)
        fix = (f"Resume from it with a lower --learning_rate (e.g. --resume_from_checkpoint {last_checkpoint} "
               f"--learning_rate {lower})" if last_checkpoint else
               f"Start the run again with a lower --learning_rate (e.g. {lower})")
        if not self.non_saturating and self.alternating:
            fix += ", or try --config_overrides generator_loss=non_saturating"
        return cause + fix + "."

    def _stop_if_collapsed(self, values: torch.Tensor, networks: tuple[str, ...]) -> None:
        """`values`: (loss, gradient norm) of each network's update this step. Every gradient exactly 0 and every loss
        0 (or as in the step before) is a collapsed step; `--max_nonfinite_steps` of them in a row stop the run."""
        previous, self._previous_values = self._previous_values, values
        gradients_zero = bool((values[1::2] == 0).all().item())
        losses_zero = bool((values[0::2] == 0).all().item())
        repeated = previous is not None and previous.shape == values.shape and torch.equal(previous, values)
        if not gradients_zero or not (losses_zero or repeated):
            self._collapsed_steps = 0
            return
        self._collapsed_steps += 1
        guard = divergence_guard(self)
        limit = guard.limit(self.args) if guard else 1
        if self._collapsed_steps < limit:
            return
        step = self.state.global_step + 1
        what = ("losses and gradient norms all became exactly 0" if losses_zero else
                "gradient norms became exactly 0 and its losses stopped changing")
        names = " and of ".join(networks)
        steps = f"{self._collapsed_steps} step{'s' if self._collapsed_steps > 1 else ''}"
        message = (f"the {'GAN' if self.alternating else 'training'} collapsed: the {what} (of {names}) for {steps} in "
                   f"a row (--max_nonfinite_steps {limit}), so no network learns any more")
        fix = ("" if self.non_saturating or not self.alternating
               else ", or try --config_overrides generator_loss=non_saturating")
        if guard is None:
            raise GanCollapsed(f"training diverged at step {step}: {message}; training stopped before that update.")
        raise GanCollapsed(guard._stop_message(self.args, step, message, "training stopped before that update",
                                               bad_weights_step=step - self._collapsed_steps, other_fix=fix,
                                               first_bad="the first collapsed step"))

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        # The pairs carry no `labels`, so Trainer's own prediction_step would report no eval_loss.
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None


# The training arguments in the folders the fine-tuning scripts save: JSON, never Trainer's pickled training_args.bin.
TRAINING_ARGS_JSON = "training_args.json"


class FineTuningTrainer(ExactResume, Trainer):
    """Trainer for the fine-tuning scripts (`glue/`, `qa/`). The folders it saves, the final model that users publish
    and its checkpoints, hold the training arguments as JSON (`training_args.json`,
    `TrainingArguments.to_json_string()`, tokens masked) instead of Trainer's pickled `training_args.bin`: unpickling
    runs code, so no pickle goes into a folder meant to be shared. With `--push_to_hub` the model is pushed when it is
    saved (Trainer's push after each checkpoint would re-pickle the arguments into OUTPUT_DIR, and a checkpoint's
    optimizer and RNG states are pickles too)."""

    def __init__(self, *args, max_nonfinite_steps: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        add_divergence_guard(self, max_nonfinite_steps)
        if self.args.push_to_hub and self.args.hub_strategy != "end":
            logger.warning("--hub_strategy %s: the fine-tuned model is pushed once, when it is saved; checkpoints are "
                           "not pushed (they hold pickles).", self.args.hub_strategy)

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        super()._save(output_dir, state_dict)
        if self.args.should_save:
            write_training_args(self.args, Path(output_dir or self.args.output_dir))

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        return  # see the class docstring: pushes happen in save_model


def write_training_args(args, folder: Path) -> Path:
    """`args` as `folder/training_args.json`, replacing a pickled `training_args.bin` there. The folder is meant to be
    shared, so it names no folder of the machine that trained it (`portable_paths`): `output_dir` reads "." in the
    saved model's folder and ".." in a checkpoint's."""
    from transformers.trainer import TRAINING_ARGS_NAME

    path = folder / TRAINING_ARGS_JSON
    saved = portable_paths(args.to_dict(), Path(folder).resolve(), Path(args.output_dir).resolve())
    path.write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
    (folder / TRAINING_ARGS_NAME).unlink(missing_ok=True)
    return path


# TrainingArguments whose value is a path, also when it is relative (to the directory the run started in).
PATH_ARGUMENTS = ("output_dir", "logging_dir", "resume_from_checkpoint", "deepspeed", "fsdp_config")


def portable_paths(value, folder: Path, root: Path, key: str | None = None):
    """`value` (TrainingArguments.to_dict(), or any part of it) with each path made portable: one inside the run's
    `root` (its output_dir: the run itself, its checkpoints) relative to `folder`, where the file is written; any
    other (a DeepSpeed config, a checkpoint of another run) only its last component, its folders being this
    machine's. A `PATH_ARGUMENTS` value that names nothing on disk (resume_from_checkpoint "true") is kept."""
    if isinstance(value, dict):
        return {name: portable_paths(item, folder, root, name) for name, item in value.items()}
    if isinstance(value, list):
        return [portable_paths(item, folder, root, key) for item in value]
    if not isinstance(value, str) or not value:
        return value
    if not os.path.isabs(value) and (key not in PATH_ARGUMENTS or (key != "output_dir" and not Path(value).exists())):
        return value
    path = Path(value).resolve()
    if path == root or root in path.parents:
        return Path(os.path.relpath(path, folder)).as_posix()
    return path.name
