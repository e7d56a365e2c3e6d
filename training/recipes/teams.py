"""`--model teams` and its ELECTRA baseline `--model electra`, on one code path (`TeamsForPreTraining`)."""

from __future__ import annotations

import functools
import re

from encoder_zoo.hub_cards.papers import ELECTRA_PAPER, TEAMS_PAPER
from encoder_zoo.training.recipes import (
    ENCODER_CLIENTS,
    FILL_MASK,
    PRETRAINING_HEAD,
    STANDARD_CLIENTS,
    ClientColumn,
    CommonTests,
    Family,
    FineTuningPreset,
    Recipe,
    StartingWeights,
    TrainingDefaults,
    encoder_fields,
    pretraining_export,
    standard_copy_export,
)
from encoder_zoo.training.recipes.registry import PER_MICRO_BATCH, LossWeighting
from encoder_zoo.training.recipes.spanbert import build_span_collator
from encoder_zoo.training.run.flops import FlopCount, dense, layer, step_sizes

# The paper's Table 5 (small = "Small/Small++"), plus tiny for tests and smoke runs.
TEAMS_SIZES = {
    "tiny": dict(embedding_size=64, hidden_size=128, num_hidden_layers=4, num_attention_heads=2, intermediate_size=512),
    "small": dict(embedding_size=128, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
                  intermediate_size=1024),
    "base": dict(embedding_size=768, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072),
    "large": dict(embedding_size=1024, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=4096),
}

# ELECTRA (Clark et al., 2020, Table 6): same discriminators, a full-depth generator at 1/4 (small, large) or 1/3
# (base) of the discriminator's width.
ELECTRA_GENERATORS = {
    "tiny": dict(generator_hidden_size=32, generator_num_attention_heads=1, generator_intermediate_size=128),
    "small": dict(generator_hidden_size=64, generator_num_attention_heads=1, generator_intermediate_size=256),
    "base": dict(generator_hidden_size=256, generator_num_attention_heads=4, generator_intermediate_size=1024),
    "large": dict(generator_hidden_size=256, generator_num_attention_heads=4, generator_intermediate_size=1024),
}
ELECTRA_SIZES = {
    size: {**TEAMS_SIZES[size], **ELECTRA_GENERATORS[size],
           "generator_num_hidden_layers": TEAMS_SIZES[size]["num_hidden_layers"]}
    for size in TEAMS_SIZES
}


# Table 5, with the authors' TF Model Garden config where it is silent (official/projects/teams: AdamW with weight
# decay 0.01 except LayerNorm and biases, eps 1e-6, gradient norm clipped at 1.0, polynomial decay of power 1 =
# linear). Base uses 2e-4 (Table 5's "2e-4/3e-4" is Base/Base++). tiny (not in the paper) gets small's optimiser
# at a rate for a model trained for minutes (`TrainingDefaults.for_tiny`).
_TEAMS = dict(source="TEAMS Table 5; clipping and weight-decay exclusions from the authors' TF Model Garden config",
              warmup_steps=10_000, adam_epsilon=1e-6, weight_decay=0.01, max_grad_norm=1.0, max_seq_length=512)
TEAMS_TRAINING = {
    "small": TrainingDefaults(size="small", learning_rate=5e-4, total_steps=500_000, batch_size=256, **_TEAMS),
    "base": TrainingDefaults(size="base", learning_rate=2e-4, total_steps=1_000_000, batch_size=256, **_TEAMS),
    "large": TrainingDefaults(size="large", learning_rate=2e-4, total_steps=1_760_000, batch_size=2048, **_TEAMS),
}
TEAMS_TRAINING["tiny"] = TEAMS_TRAINING["small"].for_tiny()

# ELECTRA Table 6 and the authors' code (google-research/electra: AdamW eps 1e-6, weight decay 0.01 except
# LayerNorm and biases, gradient norm clipped at 1.0, linear decay): ELECTRA-Small trains on 128-token sequences,
# batch 128, 1M steps; Base 256 x 512 for 766k steps; Large 2048 x 512 for 400k steps with 25% masking.
_ELECTRA = dict(source="ELECTRA Table 6; clipping and weight-decay exclusions from the authors' code",
                warmup_steps=10_000, adam_epsilon=1e-6, weight_decay=0.01, max_grad_norm=1.0)
ELECTRA_TRAINING = {
    "small": TrainingDefaults(size="small", learning_rate=5e-4, total_steps=1_000_000, batch_size=128,
                              max_seq_length=128, **_ELECTRA),
    "base": TrainingDefaults(size="base", learning_rate=2e-4, total_steps=766_000, batch_size=256, max_seq_length=512,
                             **_ELECTRA),
    "large": TrainingDefaults(size="large", learning_rate=2e-4, total_steps=400_000, batch_size=2048,
                              max_seq_length=512, mlm_probability=0.25, **_ELECTRA),
}
ELECTRA_TRAINING["tiny"] = ELECTRA_TRAINING["small"].for_tiny()

TEAMS_HYPERPARAMETERS = {
    "masking": "15% of word pieces",
    "loss": "MLM + 5 RTD + 2 MWS, K = 5 non-original candidates (sampled without replacement)",
    "generator": "1/2 of the discriminator's layers at its width; bottom half shared; tied embeddings",
    "dropout": "0.1 on all layers and attention",
}

ELECTRA_HYPERPARAMETERS = {
    "masking": "15% of word pieces (25% for large)",
    "loss": "MLM + 50 RTD",
    "generator": "1/4 (small, large) or 1/3 (base) of the discriminator's width; tied embeddings",
    "dropout": "0.1 on all layers and attention",
}

LOGGED = ("mlm_loss", "rtd_loss", "mws_loss", "mlm_accuracy", "rtd_accuracy", "mws_accuracy")


def build_masking_collator(tokenizer, args):
    """15% subword masking with BERT's 80/10/10 for both recipes, so TEAMS vs ELECTRA differ only in the model."""
    return build_span_collator(tokenizer, args, span_boundary_targets=False)


# Read in the authors' code: TEAMS (tensorflow/models, official/projects/teams/teams_task.py) computes each replica's
# MLM and MWS losses as means over its masked positions and RTD over its non-padding tokens, then divides by the
# replicas in sync (a mean over replicas, no accumulation); ELECTRA (google-research/electra, run_pretraining.py) does
# the same per TPU core. So each micro-batch's terms are its own means, and micro-batches weigh equally.
TEAMS_LOSS_WEIGHTING = LossWeighting(
    PER_MICRO_BATCH, "the authors' code (TEAMS: tensorflow/models official/projects/teams/teams_task.py; ELECTRA: "
    "google-research/electra run_pretraining.py): each replica's terms are means over its own targets (MLM and MWS "
    "over masked positions, RTD over non-padding tokens), averaged over the replicas")

RECIPES = {
    "teams": Recipe(
        name="teams",
        family="teams",
        summary="TEAMS: ELECTRA augmented with multi-word selection. A generator (half depth, bottom half of its "
        "layers shared with the discriminator, tied embeddings) corrupts 15% of tokens; the discriminator learns "
        "replaced token detection through an attention task layer fed from layer L-1 and selects the original token "
        "among K+1 candidates on layer L.",
        sizes=TEAMS_SIZES,
        training_defaults=TEAMS_TRAINING,
        build_collator=build_masking_collator,
        config_overrides={"pretraining_tasks": "rtd+mws", "task_head_type": "attention", "layer_tying": "bottom_half"},
        logged_outputs=LOGGED,
        perplexity_of=("mlm_loss",),
        default_masking_scheme="subword",
        paper=TEAMS_PAPER,
        hyperparameters=TEAMS_HYPERPARAMETERS,
        loss_weighting=TEAMS_LOSS_WEIGHTING,
    ),
    "electra": Recipe(
        name="electra",
        family="teams",
        summary="ELECTRA baseline on TEAMS's code path: replaced token detection only through an FFN head on the top "
        "layer, a narrow full-depth generator with tied embeddings and no shared layers, loss MLM + 50 RTD.",
        sizes=ELECTRA_SIZES,
        training_defaults=ELECTRA_TRAINING,
        build_collator=build_masking_collator,
        config_overrides={
            "pretraining_tasks": "rtd",
            "task_head_type": "ffn",
            "layer_tying": "none",
            "rtd_loss_weight": 50.0,
        },
        logged_outputs=("mlm_loss", "rtd_loss", "mlm_accuracy", "rtd_accuracy"),
        perplexity_of=("mlm_loss",),
        default_masking_scheme="subword",
        paper=ELECTRA_PAPER,
        hyperparameters=ELECTRA_HYPERPARAMETERS,
        loss_weighting=TEAMS_LOSS_WEIGHTING,
    ),
}


def flop_kind(model, inputs: dict) -> str:
    """One count for both recipes: the model's own heads and task layers decide what is added ("electra": RTD only)."""
    return "electra" if model.config.pretraining_tasks == "rtd" else "teams"


def train_step_flops(kind: str, model, inputs: dict) -> int:
    """Model FLOPs of a train step of `TeamsForPreTraining` (TEAMS or ELECTRA): the generator at the targets' rows
    where its feed-forward block and output layer run, the discriminator at every token, and whichever of the RTD and
    MWS heads and task layers the model has."""
    tokens, squared, targets = step_sizes(inputs)
    config = model.config
    e, d, ff, vocab = config.embedding_size, config.hidden_size, config.intermediate_size, config.vocab_size
    dg, ffg = config.generator_hidden_size, config.generator_intermediate_size
    flops = dense(tokens, e, dg) if e != dg else 0
    flops += (config.generator_num_hidden_layers - 1) * layer(tokens, squared, dg, ffg)
    flops += layer(tokens, squared, dg, ffg, feed_forward_rows=targets)
    flops += dense(targets, dg, e) + dense(targets, e, vocab)
    flops += dense(tokens, e, d) if e != d else 0
    flops += config.num_hidden_layers * layer(tokens, squared, d, ff)
    if model.teams.rtd_layer is not None:
        flops += layer(tokens, squared, d, ff)
    if model.rtd_head is not None:
        flops += dense(tokens, d, d) + dense(tokens, d, 1)
    if model.mws_head is not None:
        if model.teams.mws_layer is not None:
            flops += layer(tokens, squared, d, ff, feed_forward_rows=targets)
        flops += dense(targets, d, e) + dense(targets, config.num_negatives + 1, e)
    return flops


# TEAMS Table 6: lr 1e-4 (small) / 3e-5 (base, large), batch 32, 5 epochs, linear decay, warmup 0.1, eps 1e-6.
# The authors' Model Garden config: weight decay 0.01, clipping at 1.0, sequences of 128.
GLUE_PRESETS = {
    "teams_small": FineTuningPreset(
        flags=["--learning_rate", "1e-4", "--per_device_train_batch_size", "32", "--num_train_epochs", "5",
               "--warmup_steps", "0.1", "--adam_epsilon", "1e-6", "--lr_scheduler_type", "linear",
               "--weight_decay", "0.01", "--max_grad_norm", "1.0", "--max_seq_length", "128"]),
    "teams_base": FineTuningPreset(
        flags=["--learning_rate", "3e-5", "--per_device_train_batch_size", "32", "--num_train_epochs", "5",
               "--warmup_steps", "0.1", "--adam_epsilon", "1e-6", "--lr_scheduler_type", "linear",
               "--weight_decay", "0.01", "--max_grad_norm", "1.0", "--max_seq_length", "128"]),
}


def common_test_config(tester, **overrides):
    """A tiny TEAMS config for transformers' common tests."""
    from encoder_zoo import models

    return models.get_class("teams", "AutoConfig")(
        vocab_size=tester.vocab_size, embedding_size=16, hidden_size=tester.hidden_size,
        num_hidden_layers=tester.num_hidden_layers, num_attention_heads=tester.num_attention_heads,
        intermediate_size=tester.intermediate_size, type_vocab_size=tester.type_vocab_size, max_position_embeddings=64,
        num_negatives=3, generator_num_hidden_layers=2, **overrides,
    )


# TeamsForPreTraining samples the replacements and the MWS candidates at random (Gumbel noise): the common tests that
# compare two of its calls seed them alike.
_TEAMS_COMMON_TESTS = dict(works_with_column="teams", pretraining_heads=("AutoModelForPreTraining",),
                           config_tester={"hidden_size": 37}, seeded_forward=("AutoModelForPreTraining",))

MAIN, GENERATOR = "--init_from", "--init_generator_from"
# A standard copy's rtd/ folder (training/to_transformers.py): TEAMS's RTD path as an ELECTRA discriminator of its own.
RTD = "--init_from rtd/"
# Where transformers' ELECTRA and BERT checkpoints keep the encoder: under `electra.`/`bert.` (the pretraining and
# masked-LM classes) or at the top (ElectraModel, BertModel).
ENCODER_PREFIXES = ("electra.", "bert.", "")


def electra_config(main: dict, generator: dict | None) -> dict:
    """The discriminator's architecture from `--init_from`, the generator's width and depth from
    `--init_generator_from` (without it, the recipe's: TEAMS's at the discriminator's width)."""
    fields = encoder_fields(main)
    if generator is not None:
        fields.update(generator_hidden_size=generator["hidden_size"], generator_num_hidden_layers=generator[
            "num_hidden_layers"], generator_intermediate_size=generator["intermediate_size"],
                      generator_num_attention_heads=generator["num_attention_heads"])
    return fields


def electra_sources(name: str, config) -> list[tuple[str, str]]:
    """Where a TEAMS/ELECTRA parameter is in transformers' ELECTRA (or BERT) checkpoints, as TEAMS's layer sharing
    implies: the discriminator from --init_from; the generator's own layers from --init_generator_from, or, at the
    discriminator's width, copies of the discriminator's layers at the same depth (TEAMS's generator is the
    discriminator's bottom half); both task layers start as copies of the top layer, which they stand beside."""
    def encoder(flag, rest):
        return [(flag, f"{prefix}{rest}") for prefix in ENCODER_PREFIXES]

    top = config.num_hidden_layers - 1
    if name.startswith(("teams.embeddings.", "teams.embeddings_project.")):
        return encoder(MAIN, name.removeprefix("teams."))
    if match := re.match(r"teams\.layer\.(\d+)\.(.+)", name):
        return encoder(MAIN, f"encoder.layer.{match[1]}.{match[2]}")
    if match := re.match(r"teams\.rtd_layer\.(.+)", name):  # a standard copy's rtd/ holds it above its shared layers
        return encoder(RTD, f"encoder.layer.{config.task_source_layer}.{match[1]}") + encoder(
            MAIN, f"encoder.layer.{top}.{match[1]}")
    if match := re.match(r"teams\.mws_layer\.(.+)", name):
        return encoder(MAIN, f"encoder.layer.{top}.{match[1]}")
    if name.startswith("rtd_head."):
        rest = name.removeprefix("rtd_head.")
        return [(RTD, f"discriminator_predictions.{rest}"), (MAIN, f"discriminator_predictions.{rest}")]
    if match := re.match(r"generator\.layer\.(\d+)\.(.+)", name):
        depth = config.num_shared_generator_layers + int(match[1])
        same_width = config.generator_hidden_size == config.hidden_size
        return encoder(GENERATOR, f"encoder.layer.{depth}.{match[2]}") + (
            encoder(MAIN, f"encoder.layer.{depth}.{match[2]}") if same_width else [])
    if name.startswith("generator.embeddings_project."):
        return encoder(GENERATOR, name.removeprefix("generator."))
    if name.startswith("generator.predictions."):
        rest = name.removeprefix("generator.predictions.")
        return [(GENERATOR, f"generator_predictions.{rest}"), (MAIN, f"generator_predictions.{rest}"),
                (MAIN, f"cls.predictions.transform.{rest}")]  # BERT's MLM transform: dense, LayerNorm
    if name == "generator.bias":
        return [(GENERATOR, "generator_lm_head.bias"), (MAIN, "cls.predictions.bias")]
    return []  # the MWS head: no counterpart


def electra_tied_reads(name: str, config) -> list[tuple[str, str]]:
    """Checkpoint tensors the shared word embeddings account for: the generator's output layer (tied to them, as in
    ELECTRA and BERT). The generator checkpoint's own copy of the embeddings is not read (the table lists it as not
    used): the discriminator's are shared."""
    if name == "teams.embeddings.word_embeddings.weight":
        return [(GENERATOR, "generator_lm_head.weight"), (MAIN, "cls.predictions.decoder.weight"),
                (RTD, "electra.embeddings.word_embeddings.weight")]
    if name == "generator.bias":
        return [(MAIN, "cls.predictions.decoder.bias")]
    # A standard copy's rtd/ repeats the root's embeddings and the layers below its RTD layer.
    if name.startswith(("teams.embeddings.", "teams.embeddings_project.")):
        return [(RTD, f"electra.{name.removeprefix('teams.')}")]
    if (match := re.match(r"teams\.layer\.(\d+)\.(.+)", name)) and int(match[1]) < config.task_source_layer:
        return [(RTD, f"electra.encoder.layer.{match[1]}.{match[2]}")]
    return []


def electra_notes(config, flags=()) -> list[str]:
    notes = ["Embeddings: the discriminator's (--init_from), shared with the generator as in ELECTRA and TEAMS"
             + ("; the --init_generator_from checkpoint's own copy is not read." if GENERATOR in flags else ".")]
    if config.num_shared_generator_layers:
        notes.append(f"Generator: its bottom {config.num_shared_generator_layers} layer(s) ARE the discriminator's "
                     "(shared, TEAMS's layer tying); its other layers come from --init_generator_from, else start as "
                     "copies of the discriminator's layers at the same depth (at the discriminator's width).")
    if RTD in flags:
        notes.append("RTD task layer and head: from the standard copy's rtd/ (TEAMS's RTD path as a discriminator of "
                     "its own); its embeddings and lower layers repeat the root's and are not read again.")
    elif config.has_rtd_task_layer or config.has_mws_task_layer:
        notes.append("RTD/MWS task layers (no counterpart in ELECTRA): start as copies of the discriminator's top "
                     "layer, the layer they stand beside.")
    if config.trains_mws:
        notes.append("MWS head (no counterpart in ELECTRA): new.")
    return notes


FAMILY = Family(
    name="teams",
    starting_weights=StartingWeights(model_types=("electra", "bert"), config=electra_config, sources=electra_sources,
                                     also_reads=electra_tied_reads, generator_model_types=("electra",),
                                     notes=electra_notes, subfolders=(("generator", GENERATOR), ("rtd", RTD))),
    flops=FlopCount(kinds=("teams", "electra"), choose=flop_kind, count=train_step_flops),
    glue_presets=GLUE_PRESETS,
    common_tests=(
        CommonTests(name="Teams", model_type="teams", config=common_test_config, **_TEAMS_COMMON_TESTS),
        # ELECTRA on TEAMS' code path (`--model electra`): RTD only, a narrower generator, no shared layers.
        CommonTests(
            name="Electra", model_type="teams",
            config=functools.partial(common_test_config, pretraining_tasks="rtd", task_head_type="ffn",
                                     layer_tying="none", generator_hidden_size=16, generator_intermediate_size=24,
                                     generator_num_attention_heads=2),
            **{**_TEAMS_COMMON_TESTS, "works_with_column": "electra"},
            skips={
                "test_hidden_states_output": "ELECTRA's generator (TeamsForMaskedLM) is narrower than the "
                                             "discriminator by design: its hidden states are generator_hidden_size "
                                             "wide (TeamsModelTest covers the heads at one width)",
                "test_attention_outputs": "ELECTRA's generator (TeamsForMaskedLM) has fewer heads than the "
                                          "discriminator by design (generator_num_attention_heads; TeamsModelTest "
                                          "covers the heads at one width)",
            },
        ),
    ),
    # Both configurations through every client; TEAMS's and ELECTRA's generator is the masked-LM head.
    client_matrix=(
        ClientColumn("teams", (FILL_MASK, PRETRAINING_HEAD, *ENCODER_CLIENTS),
                     pretraining_export("teams", embedding_size=32)),
        ClientColumn("electra", (FILL_MASK, PRETRAINING_HEAD, *ENCODER_CLIENTS),
                     pretraining_export("teams", embedding_size=32, pretraining_tasks="rtd", task_head_type="ffn",
                                        layer_tying="none", generator_hidden_size=16, generator_intermediate_size=32,
                                        generator_num_attention_heads=1)),
        # The standard ELECTRA copies (training/to_transformers.py), loaded without remote code: the discriminator
        # (fill-mask is the generator's, in its generator/ folder: tests/test_to_transformers.py).
        ClientColumn("teams (standard ELECTRA)", STANDARD_CLIENTS,
                     standard_copy_export(pretraining_export("teams", embedding_size=32))),
        ClientColumn("electra (standard ELECTRA)", (PRETRAINING_HEAD, *STANDARD_CLIENTS),
                     standard_copy_export(pretraining_export(
                         "teams", embedding_size=32, pretraining_tasks="rtd", task_head_type="ffn", layer_tying="none",
                         generator_hidden_size=16, generator_intermediate_size=32, generator_num_attention_heads=1))),
    ),
)
