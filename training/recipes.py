"""The `--model` registry of `training/pretrain.py`: one `Recipe` per pretraining method or baseline.

A recipe names the model family, its size presets, how to build the collator (the pretraining objective's data side),
which model outputs to log, and the paper metadata the model card needs. Families add their recipes in
`training/recipes_<family>.py` and list them in `_RECIPE_MODULES` below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Paper:
    """What a model card cites."""

    title: str
    authors: str
    year: int
    url: str
    bibtex: str


@dataclass(frozen=True)
class Recipe:
    """How `training/pretrain.py` builds, feeds, logs and exports one `--model`.

    Attributes:
        name: the `--model` value.
        family: folder under `models/` whose `AutoModelForPreTraining` class is trained.
        summary: one paragraph for `--help` and the model card.
        sizes: `--model_size` -> config keyword arguments (vocab size and special-token ids come from the tokenizer).
        config_overrides: fixed config arguments that make this recipe (e.g. the BERT baseline turns SBO off).
        build_collator: `(tokenizer, args) -> collator`, with `args` the parsed `PretrainArguments`.
        build_dataset: optional `(texts: datasets.Dataset with a "text" column, tokenizer, args) -> tokenized
            Dataset`; the default packs `[CLS] x [SEP]` blocks from one document (`training.data.pack_blocks`).
        logged_outputs: scalar `ModelOutput` fields averaged over each logging interval (e.g. `mlm_loss`).
        perplexity_of: loss fields whose exp() is logged as `<name>_ppl`.
        default_masking_scheme: the collator scheme this recipe uses unless `--masking_scheme` says otherwise.
        paper: citation for the card; `None` for plain baselines.
        hyperparameters: the paper's recipe (lr, warmup, ...) shown on the card as reference.
        train_tokenizer: optional `(texts, args, config_kwargs) -> PreTrainedTokenizerFast` for a run without
            `--tokenizer_name` (config_kwargs: the size preset with the overrides); default: a cased WordPiece.
        prepare_model: optional `(model, tokenizer) -> None` run on the new model before training.
    """

    name: str
    family: str
    summary: str
    sizes: dict[str, dict[str, Any]]
    build_collator: Callable[..., Any]
    config_overrides: dict[str, Any] = field(default_factory=dict)
    build_dataset: Callable[..., Any] | None = None
    logged_outputs: tuple[str, ...] = ()
    perplexity_of: tuple[str, ...] = ()
    default_masking_scheme: str | None = None
    paper: Paper | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    train_tokenizer: Callable[..., Any] | None = None
    prepare_model: Callable[..., Any] | None = None


# Each module defines RECIPES: dict[str, Recipe].
_RECIPE_MODULES = ("training.recipes_spanbert", "training.recipes_teams", "training.recipes_cloze")


def all_recipes() -> dict[str, Recipe]:
    recipes: dict[str, Recipe] = {}
    for module_name in _RECIPE_MODULES:
        recipes.update(importlib.import_module(module_name).RECIPES)
    return recipes


def get_recipe(name: str) -> Recipe:
    recipes = all_recipes()
    if name not in recipes:
        raise ValueError(f"Unknown --model {name!r}. Available: {', '.join(sorted(recipes))}.")
    return recipes[name]
