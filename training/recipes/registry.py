"""The `--model` registry of `training/pretrain.py` (one `Recipe` per pretraining method or baseline) and the family
registry (one `Family` per folder under `models/`).

A recipe names the model family, its size presets, how to build the collator (the pretraining objective's data side),
which model outputs to log, the paper's optimisation recipe per size (`TrainingDefaults`) and the paper metadata the
model card needs. A family adds its recipes in a module of this package, `training/recipes/<family>.py`, that
defines `RECIPES: dict[str, Recipe]`, and declares beside them, as `FAMILY = Family(...)`, what the rest of the
project reads of it: its model-FLOP count, its fine-tuning presets, its transformers common-test settings and its
columns of the client matrix (a family without pretraining recipes, HIRE, has a module with `FAMILY` only). Every such
module is found here, none is listed. What names the model's own modules (LoRA's targets, the FSDP layer) stays in the
model folder, which travels without this package (`models/<family>/__init__.py`); `Family` shows it too.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import logging
import math
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from encoder_zoo.hub_cards.papers import Paper
from encoder_zoo.training.run import plugins
from encoder_zoo.training.run.describe import describe_optimizer, describe_schedule, describe_warmup
from encoder_zoo.training.run.flops import FlopCount

logger = logging.getLogger(__name__)


# Where the `tiny` size's rate and warmup come from (`TrainingDefaults.for_tiny`).
TINY_SOURCE = "ours for the tiny size (no paper trains one): rate and warmup tuned on held-out loss only"


@dataclass(frozen=True)
class TrainingDefaults:
    """One paper configuration's optimisation recipe. `training/pretrain.py` turns it into flags placed before the
    user's own, so any flag still overrides it. Only what torch and Trainer offer: `--optim` (`sgd` with
    `optim_args` for Nesterov momentum), `--lr_scheduler_type` with `lr_scheduler_kwargs`, `--max_grad_norm`.

    Attributes:
        size: the paper's model size these values were published for ("base", "small", ...).
        source: where the values come from (table, section, or the authors' code where the paper is silent).
        learning_rate: peak learning rate.
        warmup_steps, total_steps: the paper's warmup and run length in optimizer updates. A run as long as the
            paper's keeps `warmup_steps`; a shorter one (`--max_steps` below `total_steps`, or a run measured in
            epochs) warms up over the same fraction `warmup_steps / total_steps` of its own length, so the schedule
            keeps the paper's shape instead of never leaving warmup.
        optim, optim_args: Trainer's optimizer name and its `optim_args` string.
        adam_beta1, adam_beta2, adam_epsilon: Adam's hyperparameters (unused by `sgd`).
        weight_decay: decoupled weight decay (AdamW) or L2 (SGD).
        decay_norms_and_biases: decay biases and LayerNorm weights too (the authors' code did); by default Trainer
            exempts them, as BERT, ELECTRA and TEAMS do.
        lr_scheduler_type, lr_scheduler_kwargs: Trainer's schedule after warmup.
        max_grad_norm: clip the global gradient norm at this value (0: no clipping).
        batch_size: sequences per update (the global batch); None where the paper does not say.
        batch_without_accumulation: reach `batch_size` by splitting it over the processes (per-device batch =
            `batch_size / processes`) instead of by gradient accumulation, for recipes whose trainer takes two updates
            per batch and so cannot accumulate; a process count that does not divide it is refused.
        max_seq_length: tokens per sequence.
        mlm_probability: masking rate when it is not the usual 15% (ELECTRA-Large: 25%).
    """

    size: str
    source: str
    learning_rate: float
    warmup_steps: int
    total_steps: int
    optim: str = "adamw_torch_fused"
    optim_args: str | None = None
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    weight_decay: float = 0.0
    decay_norms_and_biases: bool = False
    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: dict[str, float] | None = None
    max_grad_norm: float = 1.0
    batch_size: int | None = None
    batch_without_accumulation: bool = False
    max_seq_length: int = 512
    mlm_probability: float | None = None

    def warmup_for(self, max_steps: int) -> float:
        """`--warmup_steps` for a run of `max_steps` updates (<= 0: measured in epochs): the paper's steps, or the
        paper's fraction of a shorter run (a float below 1, which Trainer reads as a ratio)."""
        if max_steps >= self.total_steps:
            return self.warmup_steps
        return self.warmup_steps / self.total_steps

    def flags(self, *, model_size: str, max_steps: int, per_device_batch_size: int, world_size: int,
              set_by_user: Callable[[str], bool]) -> list[str]:
        """The flags of this recipe for a `--model_size` run of `max_steps` updates. The batch, sequence length and
        masking rate belong to the paper's model size: smaller smoke-test sizes keep the optimiser and schedule but
        not the paper's batch. The global batch is reached by gradient accumulation over
        `per_device_batch_size x world_size` unless the user set `--gradient_accumulation_steps`, or, with
        `batch_without_accumulation`, split over the `world_size` processes unless the user set
        `--per_device_train_batch_size`."""
        flags = [
            "--optim", self.optim,
            "--learning_rate", repr(self.learning_rate),
            "--adam_beta1", repr(self.adam_beta1),
            "--adam_beta2", repr(self.adam_beta2),
            "--adam_epsilon", repr(self.adam_epsilon),
            "--weight_decay", repr(self.weight_decay),
            "--decay_norms_and_biases", str(self.decay_norms_and_biases),
            "--lr_scheduler_type", self.lr_scheduler_type,
            "--warmup_steps", repr(self.warmup_for(max_steps)),
            "--max_grad_norm", repr(self.max_grad_norm),
        ]
        if self.optim_args:
            flags += ["--optim_args", self.optim_args]
        if self.lr_scheduler_kwargs:
            flags += ["--lr_scheduler_kwargs", json.dumps(self.lr_scheduler_kwargs)]
        if model_size == self.size:
            flags += ["--max_seq_length", str(self.max_seq_length)]
            if self.mlm_probability is not None:
                flags += ["--mlm_probability", repr(self.mlm_probability)]
            if self.batch_size and self.batch_without_accumulation:
                if not set_by_user("--per_device_train_batch_size"):
                    flags += ["--per_device_train_batch_size", str(self.split_batch(world_size))]
            elif self.batch_size and not set_by_user("--gradient_accumulation_steps"):
                per_update = per_device_batch_size * world_size
                accumulation = max(1, math.ceil(self.batch_size / per_update))
                if accumulation * per_update != self.batch_size:
                    logger.warning("The paper's batch of %d is not a multiple of %d per update: training with %d.",
                                   self.batch_size, per_update, accumulation * per_update)
                flags += ["--gradient_accumulation_steps", str(accumulation)]
        return flags

    def for_tiny(self, learning_rate: float = 1e-3) -> TrainingDefaults:
        """This paper recipe's optimiser for the `tiny` size, which no paper trains: a higher peak rate and a 5% warmup
        (200 of 4,000 steps), no paper batch, 128-token sequences. At the papers' rates a 2-layer model trained for
        minutes learns only token frequencies; these were chosen on held-out loss against the unigram floor alone
        (docs/reproduction.md, "Tuning the cpu budget")."""
        return replace(self, size="tiny", source=f"{TINY_SOURCE}; optimiser from {self.source}",
                       learning_rate=learning_rate, warmup_steps=200, total_steps=4_000, batch_size=None,
                       batch_without_accumulation=False, max_seq_length=128, mlm_probability=None)

    @property
    def reference(self) -> str:
        """Whose values these are, as a model card's column names them: the paper's, or ours for `tiny`."""
        return "tiny recipe" if self.source.startswith(TINY_SOURCE) else "paper"

    def warmup_steps_of_run(self, run_steps: int) -> int:
        """The warmup steps Trainer takes for a run of `run_steps` updates under `warmup_for` (its own rounding:
        `ceil(run_steps x fraction)` for a shorter run)."""
        warmup = self.warmup_for(run_steps)
        return int(warmup) if warmup >= 1 else math.ceil(run_steps * warmup)

    def split_batch(self, world_size: int) -> int:
        """The per-device batch that makes `batch_size` in all over `world_size` processes."""
        if self.batch_size % world_size:
            raise ValueError(
                f"The paper's batch of {self.batch_size} in all does not split evenly over {world_size} processes, and "
                "this recipe cannot reach it by gradient accumulation: launch a number of processes that divides "
                f"{self.batch_size} (accelerate launch --num_processes N, torchrun --nproc_per_node N), or set "
                "--per_device_train_batch_size yourself (the global batch is then that x the processes).")
        return self.batch_size // world_size

    def summary(self) -> str:
        """One line for `--help`."""
        decay = f"weight decay {self.weight_decay:g}" + (" on every parameter" if self.decay_norms_and_biases else "")
        batch = (f"batch {self.batch_size} x {self.max_seq_length}" if self.batch_size
                 else f"length {self.max_seq_length}")
        if self.batch_size and self.batch_without_accumulation:
            batch += " in all, split over the processes (no accumulation)"
        return (f"{describe_optimizer(self.optim_class_name(), self.optimizer_kwargs())}, lr {self.learning_rate:g}, "
                f"warmup {describe_warmup(self.warmup_steps, self.total_steps, self.lr_scheduler_kwargs)}, "
                f"{describe_schedule(self.lr_scheduler_type, self.lr_scheduler_kwargs)}, {decay}, "
                f"clip {self.max_grad_norm:g}, {batch}" + (f", masking {self.mlm_probability:.0%}"
                                                           if self.mlm_probability else ""))

    def optim_class_name(self) -> str:
        return {"sgd": "SGD", "rmsprop": "RMSprop"}.get(self.optim, "AdamW")

    def optimizer_kwargs(self) -> dict[str, Any]:
        """The hyperparameters `describe_optimizer` shows, as the torch optimizer names them."""
        parsed = dict(item.split("=") for item in (self.optim_args or "").replace(" ", "").split(",") if item)
        if self.optim == "rmsprop":  # torch.optim.RMSprop's own defaults where optim_args is silent
            return {"alpha": float(parsed.get("alpha", 0.99)), "eps": float(parsed.get("eps", 1e-8)),
                    "momentum": float(parsed.get("momentum", 0)),
                    "centered": parsed.get("centered", "False").lower() in ("true", "1", "yes")}
        if self.optim == "sgd":
            return {"momentum": float(parsed.get("momentum", 0)),
                    "nesterov": parsed.get("nesterov", "False").lower() == "true"}
        return {"betas": (self.adam_beta1, self.adam_beta2), "eps": self.adam_epsilon}


# How a recipe's authors weigh the targets of an update (`LossWeighting.per`).
PER_MICRO_BATCH, PER_UPDATE = "micro_batch", "update"


@dataclass(frozen=True)
class LossWeighting:
    """How the authors' code weighs a loss term's targets within one update (`--loss_normalization recipe`).

    Attributes:
        per: `PER_MICRO_BATCH`: each micro-batch's loss terms are means over that micro-batch's targets, and the
            micro-batches of an update weigh equally (Trainer divides by the accumulation steps, DDP averages the
            processes): splits that keep the micro-batch give the same update bitwise, others the same in expectation.
            `PER_UPDATE`: every term's summed loss is divided by its target count over the whole update (every
            micro-batch of every process), so any split gives the same update (what `--loss_normalization update`
            does for every recipe).
        source: what the authors' code does, where it was read.
    """

    per: str
    source: str

    def __post_init__(self):
        if self.per not in (PER_MICRO_BATCH, PER_UPDATE):
            raise ValueError(f"LossWeighting.per {self.per!r}: choose {PER_MICRO_BATCH!r} or {PER_UPDATE!r}.")


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
        document_packer: optional `(tokenizer, args) -> (batch of documents -> batch of examples)`, what `--streaming`
            applies to documents as they arrive; the default packs blocks (`training.data.block_packer`) when
            `build_dataset` is the default. A recipe with its own `build_dataset` and no packer cannot stream (its
            examples need the whole corpus, e.g. a random other document).
        logged_outputs: scalar `ModelOutput` fields averaged over each logging interval (e.g. `mlm_loss`): every
            one a model of the recipe may return.
        logged_outputs_of: `(config values) -> the logged_outputs a model of them returns`, where that depends on
            its config (the two-tower model's on `loss_type`); `config values`: the recipe's `config_overrides` and
            the run's `--config_overrides`. None: all of `logged_outputs` (`Recipe.logs`).
        comparable_outputs: the logged outputs whose held-out value measures what another recipe's output of the
            same name does, so that methods are compared on it (repro's zoo pairs them): a masked LM's own
            `mlm_loss`. Not TEAMS's or ELECTRA's, their generator's.
        perplexity_of: loss fields whose exp() is logged as `<name>_ppl`.
        default_masking_scheme: the collator scheme this recipe uses unless `--masking_scheme` says otherwise.
        training_defaults: `--model_size` -> the paper's optimisation recipe it trains with (`TrainingDefaults`);
            sizes the paper does not have map to the nearest paper size's recipe.
        paper: citation for the card; `None` for plain baselines.
        hyperparameters: the paper's other settings (dropout, masking, loss weights) shown on the card.
        flag_defaults: `pretrain.py` flag -> value settings of this recipe that are not its optimisation recipe (its
            default size, per-device batch, epochs, vocabulary size, ...), applied after the generic pretraining
            defaults and before `training_defaults` and the user's own flags.
        load_corpus: optional `(args) -> Dataset`, the recipe's own corpus of documents (default:
            `training.data.load_corpus`, one text per row); the validation documents are split off it.
        corpus_description: what the embedded default corpus is, for the card (default: the lead sections).
        build_tokenizer: optional `(train_docs, args, config_kwargs) -> PreTrainedTokenizerFast` trained when no
            `--tokenizer_name` is given and OUTPUT_DIR holds none (default: a cased WordPiece).
        init_model: optional `(model, tokenizer, train_docs, args, training_args) -> None`, run once on the new model
            before training (e.g. frozen pretrained word vectors; a resumed run then loads its checkpoint over it).
        trainer_class: the Trainer subclass that runs the recipe (default `PretrainingTrainer`).
        describe_training: optional `(trainer, args) -> dict` of rows added to (or replacing) the card's training table.
        card_plots: extra card figures, file name -> logged keys drawn in it.
        loss_weighting: how the authors weigh the targets of an update (`LossWeighting`): what
            `--loss_normalization recipe` trains with. None: per micro-batch, Trainer's own.
        unused_parameters: parameter name prefixes that get no gradient in some training forward (a GAN's networks
            that one call does not train): DDP then searches the autograd graph for them at every step
            (`find_unused_parameters`); for every other recipe it does not, which saves that traversal.
        unused_parameters_of: `(config values) -> unused_parameters` where they depend on the config (the two-tower
            model trained on its bilm loss alone leaves its combination layer out); None: `unused_parameters`.
    """

    name: str
    family: str
    summary: str
    sizes: dict[str, dict[str, Any]]
    build_collator: Callable[..., Any]
    training_defaults: dict[str, TrainingDefaults]
    config_overrides: dict[str, Any] = field(default_factory=dict)
    build_dataset: Callable[..., Any] | None = None
    document_packer: Callable[..., Any] | None = None
    logged_outputs: tuple[str, ...] = ()
    logged_outputs_of: Callable[[dict[str, Any]], tuple[str, ...]] | None = None
    comparable_outputs: tuple[str, ...] = ()
    perplexity_of: tuple[str, ...] = ()
    default_masking_scheme: str | None = None
    paper: Paper | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    flag_defaults: dict[str, Any] = field(default_factory=dict)
    load_corpus: Callable[..., Any] | None = None
    corpus_description: str | None = None
    build_tokenizer: Callable[..., Any] | None = None
    init_model: Callable[..., None] | None = None
    trainer_class: type | None = None
    describe_training: Callable[..., dict[str, Any]] | None = None
    card_plots: dict[str, tuple[str, ...]] = field(default_factory=dict)
    loss_weighting: LossWeighting | None = None
    unused_parameters: tuple[str, ...] = ()
    unused_parameters_of: Callable[[dict[str, Any]], tuple[str, ...]] | None = None

    def unused_in(self, config_overrides: dict[str, Any] | None = None) -> tuple[str, ...]:
        """The parameters (name prefixes) a training forward of this recipe may leave without a gradient, under the
        run's `--config_overrides`: empty for every recipe whose forward uses all of its parameters."""
        if self.unused_parameters_of is None:
            return self.unused_parameters
        return self.unused_parameters_of({**self.config_overrides, **(config_overrides or {})})

    @property
    def weighs_per_update(self) -> bool:
        """Whether `--loss_normalization recipe` already divides each term by its count over the whole update."""
        return self.loss_weighting is not None and self.loss_weighting.per == PER_UPDATE

    def logs(self, config_overrides: dict[str, Any] | None = None) -> tuple[str, ...]:
        """The `logged_outputs` a model of this recipe returns under `config_overrides` (a run's `--config_overrides`,
        on top of the recipe's own)."""
        if self.logged_outputs_of is None:
            return self.logged_outputs
        return self.logged_outputs_of({**self.config_overrides, **(config_overrides or {})})

    def build_examples(self, documents, tokenizer, args):
        """The training examples of `documents` (a Dataset with a `text` column): `build_dataset`, or single-document
        blocks (`training.data.pack_blocks`, with spaCy spans for the linguistic masking schemes)."""
        if self.build_dataset is not None:
            return self.build_dataset(documents, tokenizer, args)
        from encoder_zoo.training.data.blocks import pack_blocks
        from encoder_zoo.training.masking.spans import LINGUISTIC_SCHEMES

        return pack_blocks(documents, tokenizer, args.max_seq_length,
                           annotate_spans=args.masking_scheme if args.masking_scheme in LINGUISTIC_SCHEMES else None,
                           spacy_model=args.spacy_model, num_proc=args.preprocessing_num_workers)

    @property
    def examples_format(self) -> str:
        """Names what `build_examples` makes: recipes with the same format train on the same pre-tokenized data."""
        builder = self.build_dataset
        return (f"{builder.__module__}.{builder.__qualname__}" if builder
                else "encoder_zoo.training.data.blocks.pack_blocks")


PLUGIN_GROUP = "encoder_zoo.recipes"


def _modules_defining(attribute: str) -> list[str]:
    """The modules of this package that define `attribute` (found, not listed: a new family adds a file), then those
    installed packages add that do (entry point group `encoder_zoo.recipes`: a module with `RECIPES` and/or
    `FAMILY`, as the modules of this package)."""
    package = __name__.rsplit(".", 1)[0]
    names = sorted(info.name for info in pkgutil.iter_modules(importlib.import_module(package).__path__))
    modules = [f"{package}.{name}" for name in names if name != "registry"] + [
        module.__name__ for module in plugins.plugin_modules(PLUGIN_GROUP)]
    return [module for module in modules if hasattr(importlib.import_module(module), attribute)]


def recipe_modules() -> list[str]:
    """The modules of this package that define `RECIPES`."""
    return _modules_defining("RECIPES")


def all_recipes() -> dict[str, Recipe]:
    recipes: dict[str, Recipe] = {}
    owners: dict[str, str] = {}
    for module_name in recipe_modules():
        for name, recipe in importlib.import_module(module_name).RECIPES.items():
            if name in recipes:
                raise ValueError(f"--model {name!r} is defined twice: in {owners[name]} and in {module_name}; rename "
                                 "one.")
            recipes[name], owners[name] = recipe, module_name
    return recipes


def get_recipe(name: str) -> Recipe:
    recipes = all_recipes()
    if name not in recipes:
        raise ValueError(f"Unknown --model {name!r}. Available: {', '.join(sorted(recipes))}.")
    return recipes[name]


@dataclass(frozen=True)
class FineTuningPreset:
    """A paper's fine-tuning recipe, `glue/run_glue.py --preset NAME` (the flags a user passes still win).

    Attributes:
        flags: run_glue / Trainer flags placed before the user's own.
        config: model config values set when the model is loaded (`--config_overrides` still wins).
        epochs_by_task: `--num_train_epochs` for some tasks, where the paper trains them longer or shorter (unless
            the user gives `--num_train_epochs`).
        note: what `--help` says of the preset beyond its flags (None: nothing).
    """

    flags: list[str]
    config: dict[str, float] = field(default_factory=dict)
    epochs_by_task: dict[str, str] = field(default_factory=dict)
    note: str | None = None


@dataclass(frozen=True)
class CommonTests:
    """One class of transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`) on models of a family,
    built by `tests/test_transformers_common.py`; every common test not in `skips` must pass.

    Attributes:
        name: the test class is `<name>ModelTest`.
        model_type: the registry name whose classes are tested (`models.REGISTRY`: a family or a model type).
        config: `(tester) -> config`, a tiny config of `model_type` from the tester's sizes (BertModelTester's:
            `vocab_size`, `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `intermediate_size`,
            `type_vocab_size`, `num_labels`, and whatever `tester` adds).
        works_with_column: the family column of docs/clients.md whose count this class adds to.
        heads: the Auto classes tested (default: every class `model_type` registers, the bare model first).
        pretraining_heads: Auto classes whose targets `pretraining_labels` makes (transformers does not know them).
        pretraining_labels: `(input_ids) -> dict` of target inputs for those heads; default `labels` = the input ids
            at positions 1..3, -100 elsewhere.
        skips: common tests (name prefixes) that do not apply, each with its reason.
        tester: attributes of the model tester that differ from BertModelTester's (e.g. `use_token_type_ids`).
        config_tester: keyword arguments of `ConfigTester` besides the config class.
        has_attentions: False where the model returns no attention maps by design.
        seeded_forward: Auto classes whose forward samples at random: the tests that compare two calls seed each.
        hidden_states_types: Auto class -> the number of kinds of hidden states it returns, where more than one.
    """

    name: str
    model_type: str
    config: Callable[[Any], Any]
    works_with_column: str
    heads: tuple[str, ...] | None = None
    pretraining_heads: tuple[str, ...] = ()
    pretraining_labels: Callable[[Any], dict] | None = None
    skips: dict[str, str] = field(default_factory=dict)
    tester: dict[str, Any] = field(default_factory=dict)
    config_tester: dict[str, Any] = field(default_factory=dict)
    has_attentions: bool = True
    seeded_forward: tuple[str, ...] = ()
    hidden_states_types: dict[str, int] = field(default_factory=dict)


# The encoder fields BERT's and ELECTRA's config.json share with the zoo's BERT-like configs (same names, same
# meaning): what `--init_from` reads of another architecture's checkpoint.
ENCODER_FIELDS = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
                  "max_position_embeddings", "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id")


@dataclass(frozen=True)
class StartingWeights:
    """What `training/pretrain.py --init_from` can start a family's models from besides the family's own exports (which
    load name for name), and how those checkpoints' tensors map onto the family's parameters.

    Attributes:
        model_types: `model_type`s of other architectures' checkpoints it takes (e.g. "bert").
        config: `(checkpoint config, generator checkpoint config or None) -> config kwargs`: the architecture, read from
            their config.json files.
        sources: `(parameter name, model config) -> [(flag, checkpoint key), ...]`, where a parameter may come from,
            the first one present wins; flag is "--init_from" or "--init_generator_from".
        also_reads: `(parameter name, model config) -> [(flag, checkpoint key), ...]`, checkpoint tensors a parameter
            accounts for without loading them (a decoder tied to the word embeddings, a generator's own copy of the
            embeddings it shares).
        generator_model_types: model types `--init_generator_from` takes (empty: the flag does not apply).
        notes: `(model config, flags of the checkpoints given) -> lines` on what has no counterpart in such a
            checkpoint, and how it starts.
        subfolders: `(subfolder, flag)` pairs: checkpoints a layout keeps in subfolders of the `--init_from` one (a
            standard ELECTRA copy's `generator/` and `rtd/`), read under `flag` where its flag is not given; an
            `--init_from` that is such a subfolder is read as the copy it belongs to.
    """

    model_types: tuple[str, ...]
    config: Callable[[dict, dict | None], dict]
    sources: Callable[[str, Any], list[tuple[str, str]]]
    also_reads: Callable[[str, Any], list[tuple[str, str]]] = lambda name, config: []
    generator_model_types: tuple[str, ...] = ()
    notes: Callable[[Any, tuple[str, ...]], list[str]] = lambda config, flags: []
    subfolders: tuple[tuple[str, str], ...] = ()


def encoder_fields(checkpoint_config: dict) -> dict:
    """The `ENCODER_FIELDS` a BERT or ELECTRA config.json sets (a BERT's embeddings are as wide as its layers)."""
    fields = {key: checkpoint_config[key] for key in ENCODER_FIELDS if key in checkpoint_config}
    fields.setdefault("embedding_size", checkpoint_config.get("hidden_size"))
    position = checkpoint_config.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(f"--init_from: the checkpoint's position_embedding_type is {position!r}; the zoo's models "
                         "have absolute position embeddings.")
    return fields


# The clients of the client matrix (tests/test_clients.py; docs/clients.md's "Works with" table), in the table's order:
# the names a `ClientColumn` lists. Every encoder export answers ENCODER_CLIENTS; a masked-LM head adds FILL_MASK, a
# head `AutoModelForPreTraining` loads adds PRETRAINING_HEAD.
FILL_MASK, PRETRAINING_HEAD = "fill-mask", "pretraining-head inference"
CLIENTS = ("feature-extraction", FILL_MASK, "text-classification", PRETRAINING_HEAD, "resize_token_embeddings",
           "PEFT LoRA (sequence classification)", "sentence-transformers", "gradient checkpointing", "torch.compile",
           "attn_implementation (explicit, set_attn_implementation)", "quiet load (AutoModel, no load report)")
ENCODER_CLIENTS = tuple(name for name in CLIENTS if name not in (FILL_MASK, PRETRAINING_HEAD))
# A standard copy (training/to_transformers.py) loads through transformers' own classes, whose bare model reports a
# checkpoint's heads as UNEXPECTED (a BERT or ELECTRA pretraining checkpoint's, as any): no quiet load.
STANDARD_CLIENTS = tuple(name for name in ENCODER_CLIENTS if not name.startswith("quiet load"))
# The size of every tiny export of the client matrix (`ClientColumn.build`).
TINY_EXPORT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                   max_position_embeddings=64)


@dataclass(frozen=True)
class TinyExport:
    """Where a tiny export builder (`ClientColumn.build`) wrote its export.

    Attributes:
        folder: the export every client loads (config with auto_map, code, safetensors, tokenizer).
        pretraining: the export `AutoModelForPreTraining` loads where it is another, with its own tokenizer (BERTAC's:
            its part-1 CNN's); None: `folder`.
    """

    folder: Path
    pretraining: Path | None = None


@dataclass(frozen=True)
class ClientColumn:
    """One column of the client matrix: a tiny random export of a family (or of one configuration of it), run through
    each client it supports in a process where this project is not importable (tests/test_clients.py).

    Attributes:
        name: the column: the family's name, or its configuration's (TEAMS's ELECTRA); `CommonTests.works_with_column`
            names it.
        clients: the clients it supports, names of `CLIENTS` (no `fill-mask` without a masked-LM head).
        build: `(folder, tokenizer) -> TinyExport`: writes a tiny random export, `TINY_EXPORT` wide, under `folder` (an
            empty folder of its own) with `tokenizer` (a tokenizer object, saved with it); torch is seeded before.
    """

    name: str
    clients: tuple[str, ...]
    build: Callable[[Path, Any], TinyExport]

    def __post_init__(self):
        unknown = [name for name in self.clients if name not in CLIENTS]
        if unknown:
            raise ValueError(f"The client column {self.name!r} names {', '.join(map(repr, unknown))}, no client of the "
                             f"matrix ({', '.join(CLIENTS)}).")


def save_tiny_export(model, folder: Path, tokenizer) -> TinyExport:
    """`model` and `tokenizer` saved into `folder`: a tiny export of one folder."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return TinyExport(Path(folder))


def pretraining_export(model_type: str, **config) -> Callable[[Path, Any], TinyExport]:
    """A `ClientColumn.build` that saves a tiny random `AutoModelForPreTraining` of `model_type` (`TINY_EXPORT` wide,
    `config` on top)."""

    def build(folder: Path, tokenizer) -> TinyExport:
        from encoder_zoo import models

        model_config = models.get_class(model_type, "AutoConfig")(vocab_size=len(tokenizer), **TINY_EXPORT, **config)
        return save_tiny_export(models.get_class(model_type, "AutoModelForPreTraining")(model_config), folder,
                                tokenizer)

    return build


def standard_copy_export(build: Callable[[Path, Any], TinyExport]) -> Callable[[Path, Any], TinyExport]:
    """A `ClientColumn.build` of the standard transformers copy (`training/to_transformers.py`: no remote code) of
    the tiny export `build` writes: the zoo export in `folder/zoo`, its copy in `folder/standard`."""

    def standard(folder: Path, tokenizer) -> TinyExport:
        from encoder_zoo.training.run.standard_copy import convert

        (Path(folder) / "zoo").mkdir()
        zoo = build(Path(folder) / "zoo", tokenizer)
        return TinyExport(convert(zoo.folder, Path(folder) / "standard"))

    return standard


@dataclass(frozen=True)
class Family:
    """What one model family (a folder under `models/`) declares beside its recipes, for the rest of the project.

    Attributes:
        name: its folder under `models/`.
        flops: how a pretraining train step of its models is counted in model FLOPs (`training/run/flops.py`);
            None, said explicitly: not counted, its runs sum Trainer's estimate (6 x parameters x tokens).
        glue_presets: `glue/run_glue.py --preset` name -> the paper's fine-tuning recipe.
        common_tests: the classes of transformers' common tests its models run.
        starting_weights: the other architectures `pretrain.py --init_from` takes (None: only the family's own
            exports).
        client_matrix: its columns of the client matrix (tests/test_clients.py): the clients each tiny export
            supports and how to build it.
    """

    name: str
    flops: FlopCount | None
    glue_presets: dict[str, FineTuningPreset] = field(default_factory=dict)
    common_tests: tuple[CommonTests, ...] = ()
    starting_weights: StartingWeights | None = None
    client_matrix: tuple[ClientColumn, ...] = ()

    @property
    def model_types(self) -> list[str]:
        """The model types of its folder (`config.model_type`; BERTAC's folder has two)."""
        from encoder_zoo import models

        return models.MODEL_TYPES[self.name]

    @property
    def peft_target_modules(self) -> dict[str, list[str]]:
        """LoRA's default targets per model type, from the model folder (`models.PEFT_TARGET_MODULES`)."""
        from encoder_zoo import models

        return {t: models.PEFT_TARGET_MODULES[t] for t in self.model_types if t in models.PEFT_TARGET_MODULES}

    @property
    def fsdp_layer_classes(self) -> dict[str, str]:
        """The layer class of each model type that FSDP shards as one unit, from the model folder."""
        from encoder_zoo import models

        return {t: models.FSDP_LAYER_CLASSES[t] for t in self.model_types if t in models.FSDP_LAYER_CLASSES}


def family_modules() -> list[str]:
    """The modules of this package that define `FAMILY`."""
    return _modules_defining("FAMILY")


def families() -> dict[str, Family]:
    """Every declared family by folder name, checked: one declaration per folder, each of a folder under `models/`."""
    from encoder_zoo import models

    found: dict[str, Family] = {}
    owners: dict[str, str] = {}
    for module_name in family_modules():
        family = importlib.import_module(module_name).FAMILY
        if family.name in found:
            raise ValueError(f"Family {family.name!r} is declared twice: in {owners[family.name]} and in "
                             f"{module_name}.")
        owners[family.name] = module_name
        if family.name not in models.MODEL_TYPES:
            raise ValueError(f"{module_name}.FAMILY names {family.name!r}, which is no folder under models/ "
                             f"({', '.join(models.MODEL_TYPES)}).")
        found[family.name] = family
    return found


def family_of_model_type(model_type: str | None) -> Family | None:
    """The family whose folder holds `model_type` (e.g. "bertac_cnn" -> bertac), or None."""
    return next((family for family in families().values() if model_type in family.model_types), None)


def flop_kinds() -> dict[str, Family]:
    """Every model-FLOP kind of every family, with its family; a kind two families both name is refused."""
    kinds: dict[str, Family] = {}
    for family in families().values():
        for kind in family.flops.kinds if family.flops else ():
            if kind in kinds:
                raise ValueError(f"The model-FLOP kind {kind!r} is declared by {kinds[kind].name} and {family.name}.")
            kinds[kind] = family
    return kinds


def pretraining_kind(model, inputs: dict) -> str | None:
    """The kind of `train_step_flops` that counts a train step of the zoo's pretraining `model` on `inputs`, or None
    where there is none (a family without a count, any other model, a batch without `labels`)."""
    family = family_of_model_type(getattr(getattr(model, "config", None), "model_type", None))
    return family.flops.kind(model, inputs) if family is not None and family.flops is not None else None


def train_step_flops(kind: str, model, inputs: dict) -> int:
    """Model FLOPs of one train step of `model` (of `kind`, see `flop_kinds`) on `inputs` (`training/run/flops.py`).
    Raises ValueError for a kind or a configuration the count does not cover."""
    family = flop_kinds().get(kind)
    if family is None:
        raise ValueError(f"unknown kind {kind!r}")
    return family.flops.count(kind, model, inputs)


def client_columns() -> dict[str, ClientColumn]:
    """Every family's client-matrix columns by name, in declaration order; a name two families both use is refused."""
    columns: dict[str, ClientColumn] = {}
    owners: dict[str, str] = {}
    for family in families().values():
        for column in family.client_matrix:
            if column.name in columns:
                raise ValueError(f"The client column {column.name!r} is declared by {owners[column.name]} and "
                                 f"{family.name}.")
            columns[column.name], owners[column.name] = column, family.name
    return columns


def glue_presets() -> dict[str, FineTuningPreset]:
    """Every family's fine-tuning presets by `--preset` name; a name two families both use is refused."""
    presets: dict[str, FineTuningPreset] = {}
    owners: dict[str, str] = {}
    for family in families().values():
        for name, preset in family.glue_presets.items():
            if name in presets:
                raise ValueError(f"--preset {name!r} is declared by {owners[name]} and {family.name}.")
            presets[name], owners[name] = preset, family.name
    return presets
