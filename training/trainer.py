"""Trainer additions for pretraining: per-objective logging, tokens/s, and a checkpoint on SIGTERM/SIGINT."""

from __future__ import annotations

import math
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
        self._tokens = 0
        self._interval_start = time.perf_counter()

    def get_decay_parameter_names(self, model) -> list[str]:
        if self.decay_norms_and_biases:
            return [name for name, _ in model.named_parameters()]
        return super().get_decay_parameter_names(model)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        if model.training:
            self._tokens += int(inputs["attention_mask"].sum()) if "attention_mask" in inputs else inputs["input_ids"].numel()
            self._count += 1
            for name in self.logged_outputs:
                value = outputs.get(name) if hasattr(outputs, "get") else None
                if value is not None:
                    self._sums[name] = self._sums.get(name, 0.0) + value.detach().float()
        loss = outputs["loss"]
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._count:
            device = self.args.device
            names = sorted(self._sums)
            # Reduce across processes: every rank logs at the same steps.
            stacked = torch.stack([torch.as_tensor(self._sums[n], device=device, dtype=torch.float32) for n in names] +
                                  [torch.tensor(float(self._count), device=device), torch.tensor(float(self._tokens), device=device)])
            stacked = self.accelerator.reduce(stacked, reduction="sum") if self.args.world_size > 1 else stacked
            count, tokens = stacked[-2].item(), stacked[-1].item()
            for index, name in enumerate(names):
                logs[name] = round(stacked[index].item() / count, 4)
                if name in self.perplexity_of:
                    logs[name.removesuffix("_loss") + "_ppl"] = round(math.exp(min(logs[name], 50.0)), 2)
            elapsed = time.perf_counter() - self._interval_start
            logs["tokens_per_second"] = round(tokens / max(elapsed, 1e-9), 1)
            self._sums, self._count, self._tokens = {}, 0, 0
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
