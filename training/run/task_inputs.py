"""Model inputs some zoo models need beyond their tokenizer's, added by the fine-tuning scripts (`glue/`, `qa/`).

`extra_inputs_for(config)` returns None for a model that needs nothing more, or a callable
`(encoded, texts) -> dict of new columns` for a fast tokenizer's output made with `return_offsets_mapping=True`
(`texts`: the one or two lists of strings given to the tokenizer, in its argument order). The columns are named in
the model's `forward`, so Trainer keeps them.

- BERTAC (`model_type` "bertac"): `entity_spans`, the noun phrase each segment's CNN sees as `[EM]`
  (`training/masking/entity_spans.py`, spaCy).
"""

from __future__ import annotations


def extra_inputs_for(config):
    if getattr(config, "model_type", None) == "bertac" and getattr(config, "use_cnn_and_tier", False):
        from encoder_zoo.training.masking.entity_spans import EntitySpanBuilder

        return EntitySpanBuilder(max_segments=config.max_segments)
    return None
