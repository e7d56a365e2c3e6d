"""Model FLOPs of a pretraining train step: the numerator of `bench/bench_gpu.py`'s MFU, and what a pretraining run
adds up into trainer_state.json's `total_flos` (`PretrainingTrainer.floating_point_ops`).

Model FLOPs are counted as in the PaLM paper (appendix B; the same count as nanoGPT's `estimate_mfu`): 6 FLOPs per
multiply-accumulate of every weight matrix for each row it processes (forward, and backward for inputs and weights),
plus 12 x width x length per token and layer for attention, for the work each model really does: real tokens only
(padding is waste, not model FLOPs), each sequence attending over its own length, vocabulary logits only where a model
computes them (at the targets), feed-forward blocks only where they run. Embedding lookups, normalisations,
activations and sampling are not counted. `tests/test_bench_gpu.py` checks the count against torch's FlopCounterMode.
"""

from __future__ import annotations

import torch

# What `train_step_flops` counts, per kind: SpanBERT with SBO, the BERT baselines (SpanBERT's model without SBO),
# TEAMS and ELECTRA (TeamsForPreTraining), the two-tower cloze model.
KINDS = ("spanbert", "bert", "teams", "electra", "cloze")


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


def pretraining_kind(model, inputs: dict) -> str | None:
    """The kind of `train_step_flops` that counts a train step of the zoo's pretraining `model` on `inputs`, or None
    where there is none (BERTAC, any other model, a batch without `labels`)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if "labels" not in inputs:
        return None
    if model_type == "spanbert":
        # The SBO head runs when the model has one and the batch carries span boundaries. The NSP head of the
        # two-segment baselines (bert_2seq_nsp: pooler and a 2-way classifier on [CLS], plus [CLS]'s row of the last
        # feed-forward block) is a few rows per sequence against all the tokens: not counted.
        return "spanbert" if config.use_span_boundary_objective and "span_left" in inputs else "bert"
    if model_type == "teams":  # one count for both: the model's own heads and task layers decide what is added
        return "electra" if config.pretraining_tasks == "rtd" else "teams"
    if model_type == "cloze":  # train_step_flops raises on the settings it does not cover (adaptive softmax, ...)
        return "cloze"
    return None


def train_step_flops(kind: str, model, inputs: dict) -> int:
    """Model FLOPs of one train step of `model` (of `kind`, one of `KINDS`) on `inputs` (see the module docstring).
    Raises ValueError for a kind or a configuration the count does not cover."""
    lengths = sequence_lengths(inputs)
    tokens, squared = int(lengths.sum()), int((lengths * lengths).sum())
    labels = inputs["labels"]
    targets = int((labels != -100).sum())
    config = model.config if hasattr(model, "config") else None
    if kind in ("spanbert", "bert"):
        d, ff, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
        read = labels != -100
        flops = dense(targets, d, d) + dense(targets, d, vocab)
        if kind == "spanbert":
            rows, cols, left, right = model.sbo_targets(inputs["span_left"], inputs["span_right"])
            read[rows, left] = read[rows, right] = True
            n = rows.numel()
            flops += dense(n, 2 * d + config.sbo_position_embedding_size, d) + dense(n, d, d) + dense(n, d, vocab)
        flops += (config.num_hidden_layers - 1) * layer(tokens, squared, d, ff)
        return flops + layer(tokens, squared, d, ff, feed_forward_rows=int(read.sum()))
    if kind in ("teams", "electra"):
        e, d, ff, vocab = config.embedding_size, config.hidden_size, config.intermediate_size, config.vocab_size
        dg, ffg = config.generator_hidden_size, config.generator_intermediate_size
        flops = dense(tokens, e, dg) if e != dg else 0
        flops += (config.generator_num_hidden_layers - 1) * layer(tokens, squared, dg, ffg)
        flops += layer(tokens, squared, dg, ffg, feed_forward_rows=targets)
        flops += dense(targets, dg, e) + dense(targets, e, vocab)
        flops += dense(tokens, e, d) if e != d else 0
        flops += config.num_hidden_layers * layer(tokens, squared, d, ff)
        if model.teams.rtd_layer is not None:
            flops += layer(tokens, squared, d, ff)
        if model.rtd_head is not None:
            flops += dense(tokens, d, d) + dense(tokens, d, 1)
        if model.mws_head is not None:
            if model.teams.mws_layer is not None:
                flops += layer(tokens, squared, d, ff, feed_forward_rows=targets)
            flops += dense(targets, d, e) + dense(targets, config.num_negatives + 1, e)
        return flops
    if kind == "cloze":
        if config.use_adaptive_softmax:
            raise ValueError("the model-FLOP count covers the flat output layer, not the adaptive softmax")
        if config.loss_type != "cloze":
            raise ValueError(f"the model-FLOP count covers loss_type 'cloze' only, not {config.loss_type!r}")
        if config.input_representation != "embedding":
            raise ValueError("the model-FLOP count covers embedding inputs, not the character CNN")
        d, ff, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
        # Each tower's keys start with one zero state: a query attends over its length + 1.
        tower = layer(tokens, squared + tokens, d, ff)
        flops = 2 * config.num_hidden_layers * tower
        # Combination: queries at every token, keys/values = both towers' states (2 per token) plus the zero state.
        flops += dense(tokens, 2 * d, d) if config.query_combination == "concat" else 0
        flops += dense(tokens, d, d) + 2 * dense(2 * tokens, d, d) + dense(tokens, d, d)
        flops += attention(2 * squared + tokens, d) + dense(tokens, d, ff) + dense(tokens, ff, d)
        return flops + dense(targets, d, vocab)
    raise ValueError(f"unknown kind {kind!r}")
