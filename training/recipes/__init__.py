"""The `--model` registry of `training/pretrain.py` (`registry`: `Recipe`, `TrainingDefaults`, `get_recipe`) and one
module per family with its recipes and the paper's optimisation per size: `spanbert` (also BERT baselines), `teams`
(also ELECTRA), `cloze`, `bertac` (the GAN-trained CNN)."""

from encoder_zoo.training.recipes.registry import Recipe, TrainingDefaults, all_recipes, get_recipe

__all__ = ["Recipe", "TrainingDefaults", "all_recipes", "get_recipe"]
