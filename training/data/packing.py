"""Padding-free batches for pretraining (`pretrain.py --packing`): a masked batch flattened into one row.

The masking collator pads a batch to its longest example; packing then concatenates the real tokens of every example
into a single row, transformers' `DataCollatorWithFlattening` format: no `attention_mask`, `position_ids` restarting
at 0 at each example, and the flash-attention sequence boundaries `cu_seq_lens_q/k` and `max_length_q/k`. The models
keep each example to itself (a block-diagonal mask for eager/SDPA/flex attention, varlen kernels for flash
attention), so a packed batch gives the padded batch's loss without computing anything on padding.

Per-position targets move with their tokens (`labels`, `token_type_ids`), and SBO boundary positions (`span_left`,
`span_right`) are shifted by their example's offset in the row, so the relative span positions stay the same. The
masks are drawn before packing, so a packed run masks exactly as a padded one.
"""

from __future__ import annotations

from typing import Any

import torch

# Per-position columns that move with their tokens; the boundary columns also hold positions, shifted when packed.
POSITION_COLUMNS = ("input_ids", "labels", "token_type_ids", "span_left", "span_right", "sampler_uniforms")
BOUNDARY_COLUMNS = ("span_left", "span_right")
# The fixed-size target buffer (`SpanMaskingCollator(target_buffer=True)`): per row, not per token; its positions are
# shifted too and its rows laid end to end, so the packed buffer keeps a fixed size (batch x slots).
TARGET_COLUMNS = ("target_positions",)
# Attention implementations that skip the padding a packed row leaves out; eager/SDPA attend over the whole row
# under a block-diagonal mask instead (right, but quadratic in the row's length).
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention", "sdpa_varlen")
# Why a family's pretraining model has no unpadded path (`--unpad`), where there is more to say than that.
UNPAD_REFUSALS = {
    "cloze": "runs two causal towers (the forward one masks the future, the backward one the past) and a "
             "combination layer whose queries attend across both towers under their own two-tower mask: no "
             "padding-only mask to drop, so unpadding does not apply",
}


def pack_batch(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Flatten a right-padded batch (`attention_mask` of 1s then 0s per row) into one row without padding."""
    unsupported = set(batch) - {*POSITION_COLUMNS, *TARGET_COLUMNS, "attention_mask"}
    if unsupported:
        raise ValueError(f"--packing cannot pack {', '.join(sorted(unsupported))} (per-example, not per-token, "
                         "inputs such as next sentence labels): train this recipe without --packing.")
    real = batch["attention_mask"].bool()
    lengths = real.sum(1)
    if not torch.equal(real, torch.arange(real.shape[1])[None, :] < lengths[:, None]):
        raise ValueError("--packing needs right-padded batches (each row's tokens first, then its padding).")
    starts = lengths.cumsum(0) - lengths
    packed: dict[str, Any] = {}
    for key in POSITION_COLUMNS:
        if key not in batch:
            continue
        values = batch[key]
        if key in BOUNDARY_COLUMNS:
            values = torch.where(values >= 0, values + starts[:, None], values)
        packed[key] = values[real][None]
    for key in TARGET_COLUMNS:
        if key in batch:
            packed[key] = torch.where(batch[key] >= 0, batch[key] + starts[:, None], batch[key]).flatten()[None]
    packed["position_ids"] = (torch.arange(real.shape[1])[None, :].expand_as(real))[real][None]
    boundaries = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
    packed["cu_seq_lens_q"] = packed["cu_seq_lens_k"] = boundaries
    packed["max_length_q"] = packed["max_length_k"] = int(lengths.max())
    return packed


class PackedBatchCollator:
    """Wraps a pretraining collator: its training batches come out packed (`pack_batch`), its held-out batches
    padded as before (`for_evaluation`), so validation losses stay comparable with unpacked runs."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        return pack_batch(self.collator(examples))

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.collator, "set_epoch"):
            self.collator.set_epoch(epoch)

    def for_evaluation(self):
        return self.collator.for_evaluation() if hasattr(self.collator, "for_evaluation") else self.collator


def check_packing(model_class: type, config_kwargs: dict) -> None:
    """A clear error, before any data is read, when the model cannot train on packed batches."""
    if not getattr(model_class, "_supports_packed_sequences", False):
        raise ValueError(f"--packing: {model_class.__name__} cannot read packed sequences (its attention masks are "
                         "not block-diagonal); train it without --packing.")
    if config_kwargs.get("use_next_sentence_prediction"):
        raise ValueError("--packing: next sentence prediction classifies each row's first token, which a packed row "
                         "does not have per example; train this recipe without --packing.")


def check_unpad(config_class: type, model_class: type, config_kwargs: dict) -> None:
    """A clear error, before any data is read, when the model cannot run unpadded (`--unpad`): a model without the
    `unpad` config option, or one that cannot read packed rows (the unpadded batch is one)."""
    if "unpad" not in getattr(config_class, "__dataclass_fields__", {}):
        reason = UNPAD_REFUSALS.get(config_class.model_type, "has no unpadded path (no config.unpad)")
        raise ValueError(f"--unpad: {model_class.__name__} {reason}; train it without --unpad.")
    if config_kwargs.get("use_next_sentence_prediction"):
        raise ValueError("--unpad: next sentence prediction classifies each row's first token, which an unpadded "
                         "batch does not keep per row; train this recipe without --unpad.")


def with_target_buffer(collator):
    """`--target_buffer`: the masking collator adds its fixed-size target buffer (`target_positions`)."""
    if not hasattr(collator, "target_buffer"):
        raise ValueError(f"--target_buffer: {type(collator).__name__} makes no masked targets to buffer (this recipe "
                         "predicts every token, or pairs segments); train it without --target_buffer.")
    collator.target_buffer = True
    return collator
