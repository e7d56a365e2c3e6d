"""Model FLOPs of a pretraining train step: the numerator of `bench/bench_gpu.py`'s MFU, and what a pretraining run
adds up into trainer_state.json's `total_flos` (`PretrainingTrainer.floating_point_ops`).

Model FLOPs are counted as in the PaLM paper (appendix B; the same count as nanoGPT's `estimate_mfu`): 6 FLOPs per
multiply-accumulate of every weight matrix for each row it processes (forward, and backward for inputs and weights),
plus 12 x width x length per token and layer for attention, for the work each model really does: real tokens only
(padding is waste, not model FLOPs), each sequence attending over its own length, vocabulary logits only where a model
computes them (at the targets), feed-forward blocks only where they run. Embedding lookups, normalisations,
activations and sampling are not counted. `tests/test_bench_gpu.py` checks the count against torch's FlopCounterMode.

This module holds the shared formulas (a weight matrix, attention, a BERT layer) and `FlopCount`, the shape of a
family's count; each family's own formula lives beside its recipes (`Family.flops` in `training/recipes/<family>.py`),
and `training.recipes.pretraining_kind` / `train_step_flops` find the family of a model or a kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class FlopCount:
    """How a family counts the model FLOPs of one pretraining train step (its `Family.flops`).

    Attributes:
        kinds: the formulas it has, named for what they count (e.g. "spanbert" with SBO, "bert" without); unique across
            families.
        choose: `(model, inputs) -> kind or None`, the formula for a train step of `model` on a batch with targets
            (None: none applies).
        count: `(kind, model, inputs) -> int`, the model FLOPs of that step; raises ValueError for a configuration the
            formula does not cover (the run then sums Trainer's estimate instead).
    """

    kinds: tuple[str, ...]
    choose: Callable[[Any, dict], str | None]
    count: Callable[[str, Any, dict], int]

    def kind(self, model, inputs: dict) -> str | None:
        """The kind that counts a train step of `model` on `inputs`; None for a batch without targets (`labels`)."""
        return self.choose(model, inputs) if "labels" in inputs else None


def dense(rows, n_in: int, n_out: int) -> int:
    """Forward + backward FLOPs of a weight matrix `n_in x n_out` applied to `rows` rows: 3 matmuls of 2 FLOPs per
    multiply-accumulate (output; gradients for the input and for the weights)."""
    return 6 * int(rows) * n_in * n_out


def attention(squared_lengths, width: int) -> int:
    """Forward + backward FLOPs of the score and value products over sequences with sum of squared lengths
    `squared_lengths` (PaLM's 12 x width x length per token)."""
    return 12 * int(squared_lengths) * width


def layer(tokens, squared_lengths, width: int, intermediate: int, feed_forward_rows=None) -> int:
    """A BERT/ELECTRA layer; `feed_forward_rows`: where its feed-forward block runs (default every token)."""
    rows = tokens if feed_forward_rows is None else feed_forward_rows
    return (dense(tokens, width, 3 * width) + attention(squared_lengths, width) + dense(tokens, width, width)
            + dense(rows, width, intermediate) + dense(rows, intermediate, width))


def sequence_lengths(inputs: dict) -> torch.Tensor:
    """The real length of each sequence of a padded (`attention_mask`) or packed (`cu_seq_lens_q`) batch."""
    if "attention_mask" in inputs:
        return inputs["attention_mask"].sum(1)
    return inputs["cu_seq_lens_q"].diff().long()


def step_sizes(inputs: dict) -> tuple[int, int, int]:
    """Real tokens, the sum of squared sequence lengths, and targets (`labels` other than -100) of a training batch."""
    lengths = sequence_lengths(inputs)
    return int(lengths.sum()), int((lengths * lengths).sum()), int((inputs["labels"] != -100).sum())
