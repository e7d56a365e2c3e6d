"""A recipe's model started from published weights (`training/pretrain.py --init_from`): which checkpoints a family
takes (its own exports name for name, other architectures through its `StartingWeights`), the architecture they
give, the `--model_size` whose training defaults the run keeps, and the plan of which tensor each parameter loads
(`training.run.init_from`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from encoder_zoo.training.recipes.registry import Recipe, family_of_model_type
from encoder_zoo.training.run.init_from import (
    BOOKKEEPING_KEYS,
    GENERATOR,
    MAIN,
    Checkpoint,
    InitPlan,
    find_checkpoint,
    plan,
)


@dataclass
class StartingPoint:
    """The checkpoints a run starts from (flag -> `Checkpoint`), the config arguments they give (`architecture`), the
    size preset whose training defaults the run keeps (`size`; `size_matches`: the checkpoint is that preset), and
    whether the checkpoint is another architecture's (`foreign`: BERT, ELECTRA, mapped by the family's
    `StartingWeights`) rather than one of the family's own exports."""

    checkpoints: dict[str, Checkpoint]
    architecture: dict[str, Any]
    size: str
    size_matches: bool
    foreign: bool

    @property
    def main(self) -> Checkpoint:
        return self.checkpoints[MAIN]


def starting_point(recipe: Recipe, init_from: str, init_generator_from: str | None, model_size: str,
                   size_given: bool, config_name: str | None = None) -> StartingPoint:
    """Read `--init_from` (and `--init_generator_from`), refuse an architecture the family cannot take, and choose
    the size preset: the one the checkpoint is, else the nearest in width (its training defaults only); a
    `--model_size` the user gave must be the checkpoint's."""
    from encoder_zoo import models

    family = family_of_model_type(recipe.family)
    weights = family.starting_weights if family else None
    own_types = models.MODEL_TYPES.get(recipe.family, [recipe.family])
    main = find_checkpoint(init_from, MAIN, config_name)
    foreign_types = weights.model_types if weights else ()
    subfolders = dict(weights.subfolders) if weights else {}
    main = _the_whole_copy(main, subfolders, foreign_types)
    if main.model_type not in (*own_types, *foreign_types):
        takes = ", ".join([f"this family's own exports ({', '.join(own_types)})",
                           *(f"{t} checkpoints" for t in foreign_types)])
        raise ValueError(f"{MAIN} {init_from}: a {main.model_type or 'model without a model_type'} checkpoint, which "
                         f"--model {recipe.name} cannot start from. It takes {takes}.")
    checkpoints = {MAIN: main}
    generator_config = None
    if init_generator_from:
        generator_types = weights.generator_model_types if weights else ()
        if not generator_types or main.model_type in own_types:
            raise ValueError(f"{GENERATOR} applies to --model {recipe.name} only with an ELECTRA-format --init_from (a "
                             "zoo export holds its own generator); drop it." if generator_types else
                             f"{GENERATOR} does not apply to --model {recipe.name}: it has no separate generator; "
                             "drop it.")
        generator = find_checkpoint(init_generator_from, GENERATOR)
        if generator.model_type not in generator_types:
            raise ValueError(f"{GENERATOR} {init_generator_from}: a {generator.model_type} checkpoint; it takes "
                             f"{', '.join(generator_types)} generators (e.g. ElectraForMaskedLM).")
        checkpoints[GENERATOR], generator_config = generator, generator.config
    if main.model_type in foreign_types:
        for subfolder, flag in subfolders.items():
            folder = main.folder / subfolder
            if flag not in checkpoints and (folder / "config.json").is_file():
                found = find_checkpoint(str(folder), flag)
                checkpoints[flag] = dataclasses.replace(found, read_notes=(
                    *found.read_notes, f"`{subfolder}/` of {MAIN} {init_from} (a standard copy's {subfolder} folder) "
                    f"read as {flag}."))
        if GENERATOR in checkpoints:
            generator_config = checkpoints[GENERATOR].config
    config_class = models.get_class(recipe.family, "AutoConfig")
    if main.model_type in own_types:
        architecture = {k: v for k, v in main.config.items()
                        if k not in BOOKKEEPING_KEYS and k in config_class.__dataclass_fields__}
    else:
        architecture = {k: v for k, v in weights.config(main.config, generator_config).items()
                        if k in config_class.__dataclass_fields__}
    size, matches = _size_of(recipe, architecture, model_size, size_given, init_from)
    if matches:  # what the checkpoint leaves to the recipe (ELECTRA's generator width, without a generator checkpoint)
        architecture = {**recipe.sizes[size], **architecture}
    return StartingPoint(checkpoints, architecture, size, matches, foreign=main.model_type not in own_types)


def _the_whole_copy(main: Checkpoint, subfolders: dict[str, str], foreign_types: tuple[str, ...]) -> Checkpoint:
    """`--init_from` a subfolder of a standard copy (its `rtd/` or `generator/`): the copy it belongs to, whose root
    holds the layers fine-tuning reads and whose subfolders the rest."""
    parent = main.folder.parent
    if main.folder.name not in subfolders or not (parent / "config.json").is_file():
        return main
    whole = find_checkpoint(str(parent), MAIN)
    if whole.model_type not in foreign_types:
        return main
    return dataclasses.replace(whole, read_notes=(
        *whole.read_notes, f"{main.folder.name}/ is a folder of the standard copy {parent.name}: read as that whole "
        f"copy (its root and {', '.join(f'{name}/' for name in subfolders)}), as the run needs all of them."))


def _size_of(recipe: Recipe, architecture: dict, model_size: str, size_given: bool, init_from: str) -> tuple[str, bool]:
    def agrees(size):
        return all(architecture.get(key, value) == value for key, value in recipe.sizes[size].items())

    matching = [size for size in recipe.sizes if agrees(size)]
    shape = ", ".join(f"{key} {architecture[key]}" for key in ("hidden_size", "num_hidden_layers")
                      if key in architecture)
    if size_given:
        if model_size not in matching:
            raise ValueError(f"--model_size {model_size} disagrees with {MAIN} {init_from} ({shape}): the architecture "
                             "comes from the checkpoint. Drop --model_size.")
        return model_size, True
    if matching:
        return matching[0], True
    width = architecture.get("hidden_size", 0)
    nearest = min(recipe.sizes, key=lambda s: (abs(recipe.sizes[s].get("hidden_size", 0) - width),
                                                -recipe.sizes[s].get("hidden_size", 0)))
    return nearest, False


def plan_weights(recipe: Recipe, point: StartingPoint, config, ignore_mismatched_sizes: bool) -> InitPlan:
    """Which checkpoint tensor each parameter of the recipe's model takes, from names and shapes only (the model is
    built on the meta device); refuses a shape mismatch unless `ignore_mismatched_sizes`."""
    import torch

    from encoder_zoo import models

    with torch.device("meta"):
        model = models.get_class(recipe.family, "AutoModelForPreTraining")(config)
    if point.foreign:
        weights = family_of_model_type(recipe.family).starting_weights
        return plan(model, point.checkpoints, lambda name: weights.sources(name, config),
                    lambda name: weights.also_reads(name, config), ignore_mismatched_sizes,
                    weights.notes(config, tuple(point.checkpoints)))
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    return plan(model, point.checkpoints, lambda name: [(MAIN, name)],
                lambda name: [(MAIN, name)] if name in tied else [], ignore_mismatched_sizes, [])
