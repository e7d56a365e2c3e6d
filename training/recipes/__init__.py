"""The `--model` registry of `training/pretrain.py` and the family registry (`registry`: `Recipe`, `TrainingDefaults`,
`get_recipe`; `Family`, `families`, ...), and one module per family with its recipes, the paper's optimisation per
size and what the family declares (`FAMILY`): `spanbert` (also BERT baselines), `teams` (also ELECTRA), `cloze`,
`bertac` (the GAN-trained CNN), `hire` (no pretraining recipe)."""

from encoder_zoo.training.recipes.registry import (
    CLIENTS,
    ENCODER_CLIENTS,
    FILL_MASK,
    PRETRAINING_HEAD,
    TINY_EXPORT,
    ClientColumn,
    CommonTests,
    Family,
    FineTuningPreset,
    Recipe,
    StartingWeights,
    TinyExport,
    TrainingDefaults,
    all_recipes,
    client_columns,
    encoder_fields,
    families,
    family_of_model_type,
    flop_kinds,
    get_recipe,
    glue_presets,
    pretraining_export,
    pretraining_kind,
    save_tiny_export,
    train_step_flops,
)

__all__ = ["CLIENTS", "ENCODER_CLIENTS", "FILL_MASK", "PRETRAINING_HEAD", "TINY_EXPORT", "ClientColumn", "CommonTests",
           "Family", "FineTuningPreset", "Recipe", "StartingWeights", "TinyExport", "TrainingDefaults", "all_recipes",
           "client_columns", "encoder_fields", "families", "family_of_model_type", "flop_kinds", "get_recipe",
           "glue_presets", "pretraining_export", "pretraining_kind", "save_tiny_export", "train_step_flops"]
