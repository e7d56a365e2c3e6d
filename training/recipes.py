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
        training_defaults: `pretrain.py` flag -> value defaults of this recipe (its paper's optimiser, schedule,
            default size, ...), applied after the generic pretraining defaults and before the user's own flags.
        load_corpus: optional `(args) -> Dataset`, the recipe's own corpus of documents (default:
            `training.data.load_corpus`, one text per row); the validation documents are split off it.
        corpus_description: what the embedded default corpus is, for the card (default: the lead sections).
        build_tokenizer: optional `(train_docs, args) -> PreTrainedTokenizerFast` trained when no `--tokenizer_name`
            is given and OUTPUT_DIR holds none (default: a cased WordPiece).
        init_model: optional `(model, tokenizer, train_docs, args, training_args) -> None`, run once on the new model
            before training (e.g. frozen pretrained word vectors; a resumed run then loads its checkpoint over it).
        trainer_class: the Trainer subclass that runs the recipe (default `PretrainingTrainer`).
        describe_training: optional `(trainer, args) -> dict` of rows added to (or replacing) the card's training table.
        card_plots: extra card figures, file name -> logged keys drawn in it.
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
    training_defaults: dict[str, Any] = field(default_factory=dict)
    load_corpus: Callable[..., Any] | None = None
    corpus_description: str | None = None
    build_tokenizer: Callable[..., Any] | None = None
    init_model: Callable[..., None] | None = None
    trainer_class: type | None = None
    describe_training: Callable[..., dict[str, Any]] | None = None
    card_plots: dict[str, tuple[str, ...]] = field(default_factory=dict)


# Each module defines RECIPES: dict[str, Recipe].
_RECIPE_MODULES = ("training.recipes_spanbert", "training.recipes_teams", "training.recipes_cloze", "training.recipes_bertac")


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
