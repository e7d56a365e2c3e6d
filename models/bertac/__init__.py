"""BERTAC: the GAN-pretrained CNN (`bertac_cnn`) (self-contained: travels with every checkpoint)."""

# What clients outside this folder need to know of its modules, per model type (collected by models/__init__.py).
# LoRA's default targets: the attention query and value projections, as PEFT's own defaults for BERT/ELECTRA.
PEFT_TARGET_MODULES = {"bertac": ["query", "value"]}  # the encoder's and the TIER layers' attention
