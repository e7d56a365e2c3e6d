"""Trainer additions for pretraining: per-objective logging, tokens/s, a checkpoint on SIGTERM/SIGINT, and the
alternating two-player step of GANs."""

from __future__ import annotations

import math
import os
import signal
import time

import torch
from transformers import Trainer, TrainerCallback


class PretrainingTrainer(Trainer):
    """Trainer that also logs the mean of chosen scalar model outputs (e.g. `mlm_loss`, `sbo_loss`, `rtd_accuracy`)
    over each logging interval, their perplexities, and training throughput in non-padding tokens per second.
    `decay_norms_and_biases=True` applies weight decay to every parameter, as SpanBERT's fairseq code did."""

    def __init__(self, *args, logged_outputs=(), perplexity_of=(), decay_norms_and_biases=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.logged_outputs = tuple(logged_outputs)
        self.perplexity_of = tuple(perplexity_of)
        self.decay_norms_and_biases = decay_norms_and_biases
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0
        self._units: dict[str, int] = {}
        self._interval_start = time.perf_counter()

    def get_decay_parameter_names(self, model) -> list[str]:
        if self.decay_norms_and_biases:
            return [name for name, _ in model.named_parameters()]
        return super().get_decay_parameter_names(model)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        if model.training:
            self.record(outputs, inputs)
        loss = outputs["loss"]
        return (loss, outputs) if return_outputs else loss

    def throughput(self, inputs) -> dict[str, int]:
        """What one training batch counts towards the logged `<unit>_per_second`: its non-padding tokens."""
        return {"tokens": int(inputs["attention_mask"].sum()) if "attention_mask" in inputs else inputs["input_ids"].numel()}

    def record(self, outputs, inputs) -> None:
        """Add one training batch's logged outputs and throughput to the current logging interval."""
        for unit, count in self.throughput(inputs).items():
            self._units[unit] = self._units.get(unit, 0) + count
        self._count += 1
        for name in self.logged_outputs:
            value = outputs.get(name) if hasattr(outputs, "get") else None
            if value is not None:
                self._sums[name] = self._sums.get(name, 0.0) + value.detach().float()

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._count:
            device = self.args.device
            names, units = sorted(self._sums), sorted(self._units)
            # Reduce across processes: every rank logs at the same steps.
            stacked = torch.stack([torch.as_tensor(self._sums[n], device=device, dtype=torch.float32) for n in names] +
                                  [torch.tensor(float(self._units[u]), device=device) for u in units] +
                                  [torch.tensor(float(self._count), device=device)])
            stacked = self.accelerator.reduce(stacked, reduction="sum") if self.args.world_size > 1 else stacked
            count = stacked[-1].item()
            for index, name in enumerate(names):
                logs[name] = round(stacked[index].item() / count, 4)
                if name in self.perplexity_of:
                    logs[name.removesuffix("_loss") + "_ppl"] = round(math.exp(min(logs[name], 50.0)), 2)
            elapsed = time.perf_counter() - self._interval_start
            for index, unit in enumerate(units):
                logs[f"{unit}_per_second"] = round(stacked[len(names) + index].item() / max(elapsed, 1e-9), 1)
            self._sums, self._count, self._units = {}, 0, {}
            self._interval_start = time.perf_counter()
        super().log(logs, start_time)


class SaveOnSignal(TrainerCallback):
    """On SIGTERM/SIGINT (preemption, Ctrl-C) finish the current step, save a checkpoint and stop cleanly, so
    `--resume_from_checkpoint` continues from there and nothing already trained is lost."""

    def __init__(self):
        self.requested = False

    def on_train_begin(self, args, state, control, **kwargs):
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._request)

    def _request(self, signum, frame):
        if self.requested:  # a second signal aborts at once
            raise KeyboardInterrupt
        self.requested = True

    def on_step_end(self, args, state, control, **kwargs):
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control


class NonFiniteLossError(ValueError):
    """A loss or gradient became NaN or infinite. Raised before the update that would use it, so nothing bad is
    applied or saved: the last checkpoint stays the last good state."""


class GanTrainer(PretrainingTrainer):
    """Alternating two-player training (BERTAC's Algorithm 1) for a model whose forward takes `gan_step`:
    "discriminator" returns the loss of D and R (F untouched), "generator" the loss of F (D untouched). A model
    whose `config.pretraining_objective` is not "gan" (e.g. the self-supervised ablation) trains with one update.

    Logs what the model outputs of both calls (`logged_outputs`), pairs and words per second; evaluation reports
    the mean of the same outputs on the held-out pairs as `eval_<name>`. A NaN/inf loss or gradient stops the run
    with `NonFiniteLossError` before the update that would apply it.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.args.gradient_accumulation_steps != 1:
            raise ValueError("The GAN updates D and R, then F, on every batch: gradient accumulation would reorder that. "
                             "Drop --gradient_accumulation_steps and raise --per_device_train_batch_size instead.")
        if self.args.fp16:
            raise ValueError("The GAN trains in fp32 (its outputs are unnormalised and grow): drop --fp16.")
        if self.args.ddp_find_unused_parameters is False:
            raise ValueError("Each GAN call trains only some networks: drop --ddp_find_unused_parameters false.")
        # The frozen word table is a buffer, the same on every rank: never re-broadcast it at each forward.
        self.args.ddp_broadcast_buffers = False
        config = getattr(self.model, "config", None)
        self.alternating = getattr(config, "pretraining_objective", "gan") == "gan"
        self._discriminator_outputs: dict[str, torch.Tensor] = {}
        self._eval_sums: dict[str, torch.Tensor] = {}
        self._eval_count = 0

    def throughput(self, inputs) -> dict[str, int]:
        words = int(inputs["attention_mask"].sum()) + int(inputs["entity_attention_mask"].sum())
        return {"pairs": int(inputs["input_ids"].shape[0]), "words": words}

    def training_step(self, model, inputs, num_items_in_batch=None):
        if not self.alternating:
            loss = super().training_step(model, inputs, num_items_in_batch)
            self._stop_if_not_finite("training", loss, model)
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
        self._stop_if_not_finite("discriminator (D and R)", outputs.loss, model)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._discriminator_outputs = {name: value for name, value in outputs.items() if value.dim() == 0}
        loss = super().training_step(model, inputs, num_items_in_batch)  # F: compute_loss below, then backward
        self._stop_if_not_finite("generator (F)", loss, model)
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and self.alternating:
            outputs = model(**inputs, gan_step="generator")
            self.record({**self._discriminator_outputs, **outputs}, inputs)
        else:
            outputs = model(**inputs)
            if model.training:
                self.record(outputs, inputs)
        return (outputs["loss"], outputs) if return_outputs else outputs["loss"]

    def _stop_if_not_finite(self, which: str, loss: torch.Tensor, model) -> None:
        gradients = [p.grad for p in model.parameters() if p.grad is not None]
        values = torch.stack([loss.detach().float().reshape(()),
                              torch.nn.utils.get_total_norm(gradients).float() if gradients else loss.new_zeros((), dtype=torch.float32)])
        bad = (~torch.isfinite(values)).any().float()
        if self.args.world_size > 1:  # every rank must stop together
            bad = self.accelerator.reduce(bad, reduction="sum")
        if bad.item():
            from transformers.trainer_utils import get_last_checkpoint

            last = get_last_checkpoint(self.args.output_dir) if os.path.isdir(self.args.output_dir) else None
            raise NonFiniteLossError(
                f"the {which} loss became {values[0].item():.4g} (gradient norm {values[1].item():.4g}) at step "
                f"{self.state.global_step + 1}; training stopped before that update. "
                + (f"The last good checkpoint, {last}, is kept. " if last else "No checkpoint was saved yet. ")
                + "Start a new run with a lower --learning_rate (a resumed run keeps its old rate) or try "
                "--config_overrides generator_loss=non_saturating."
            )

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            outputs = model(**inputs)
        for name in self.logged_outputs:
            if outputs.get(name) is not None:
                self._eval_sums[name] = self._eval_sums.get(name, 0.0) + outputs[name].detach().float()
        self._eval_count += 1
        return outputs["loss"].detach(), None, None

    def evaluation_loop(self, *args, metric_key_prefix: str = "eval", **kwargs):
        self._eval_sums, self._eval_count = {}, 0
        output = super().evaluation_loop(*args, metric_key_prefix=metric_key_prefix, **kwargs)
        if self._eval_count:
            names = sorted(self._eval_sums)
            stacked = torch.stack([torch.as_tensor(self._eval_sums[n], device=self.args.device) for n in names]
                                  + [torch.tensor(float(self._eval_count), device=self.args.device)])
            stacked = self.accelerator.reduce(stacked, reduction="sum") if self.args.world_size > 1 else stacked
            for index, name in enumerate(names):
                output.metrics[f"{metric_key_prefix}_{name}"] = round(stacked[index].item() / stacked[-1].item(), 4)
        return output
