"""SpanBERT (self-contained: travels with every checkpoint)."""

# What clients outside this folder need to know of its modules, per model type (collected by models/__init__.py).
# LoRA's default targets: the attention query and value projections, as PEFT's own defaults for BERT/ELECTRA.
PEFT_TARGET_MODULES = {"spanbert": ["query", "value"]}
# The transformer layer that FSDP shards as one unit (training/run/sharding.py).
FSDP_LAYER_CLASSES = {"spanbert": "BertLayer"}
