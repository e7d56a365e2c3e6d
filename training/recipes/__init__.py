"""The `--model` registry of `training/pretrain.py` and the family registry (`registry`: `Recipe`, `TrainingDefaults`,
`get_recipe`; `Family`, `families`, ...), and one module per family with its recipes, the paper's optimisation per
size and what the family declares (`FAMILY`): `spanbert` (also BERT baselines), `teams` (also ELECTRA), `cloze`,
`bertac` (the GAN-trained CNN), `hire` (no pretraining recipe)."""

from encoder_zoo.training.recipes.registry import (
    CommonTests,
    Family,
    FineTuningPreset,
    Recipe,
    StartingWeights,
    TrainingDefaults,
    all_recipes,
    encoder_fields,
    families,
    family_of_model_type,
    flop_kinds,
    get_recipe,
    glue_presets,
    pretraining_kind,
    train_step_flops,
)

__all__ = ["CommonTests", "Family", "FineTuningPreset", "Recipe", "StartingWeights", "TrainingDefaults", "all_recipes",
           "encoder_fields", "families", "family_of_model_type", "flop_kinds", "get_recipe", "glue_presets",
           "pretraining_kind", "train_step_flops"]
