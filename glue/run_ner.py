"""Fine-tune any zoo model or transformers encoder on token classification (NER) with Trainer, scored at the entity
level as conlleval scores CoNLL-2003.

    python glue/run_ner.py --model_name_or_path PATH_OR_ID --dataset conll2003 --output_dir runs/ner [--seeds 1 2 3]
    python glue/run_ner.py --model_name_or_path runs/demo/export --trust_remote_code \\
        --train_file train.jsonl --validation_file dev.jsonl --output_dir runs/ner
    accelerate launch --multi_gpu glue/run_ner.py ...          # several GPUs

Data: --dataset conll2003 (online, through `datasets`), or --train_file/--validation_file as JSON lines (`tokens` and
string `ner_tags`, BIO/IOB2 or IOB1) or CoNLL column files (token first, tag last, a blank line between sentences).
Each word's tag goes to its first sub-token (--label_all_tokens: to every sub-token). Scores: entity-level precision,
recall and F1 (conlleval's, through seqeval) in percent. --seeds runs once per seed and reports each and the median;
--preset takes a paper's fine-tuning recipe, as glue/run_glue.py does. Every Trainer flag works. Outputs:
OUTPUT_DIR/ner_results.json, and per seed OUTPUT_DIR/seed-N/ with the model and predictions.jsonl.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import TrainingArguments

from encoder_zoo.glue.run_glue import GLUE_DEFAULTS, NO_PRESET, PRESETS, SCORE_SCALE
from encoder_zoo.training.run import MAX_NONFINITE_STEPS_HELP, RunInterrupted

logger = logging.getLogger("run_ner")
METRIC_MODULE = str(Path(__file__).resolve().parent / "metrics" / "ner_zoo")
RESULTS = "ner_results.json"
PARTIAL_RESULTS = "ner_results.partial.json"
# The scores a run reports (fractions from the metric, points in the results); F1 is what checkpoint selection reads.
SCORES = ("precision", "recall", "f1", "accuracy")


@dataclass
class NerArguments:
    model_name_or_path: str = field(metadata={"help": "A checkpoint folder or Hub id (any encoder, or a zoo export)."})
    dataset: str | None = field(default="conll2003", metadata={
        "help": "A Hub dataset of tagged sentences (conll2003 is eriktks/conll2003); read online through `datasets`. "
                "Ignored when --train_file/--validation_file are given."})
    train_file: str | None = field(default=None, metadata={
        "help": "Training sentences: JSON lines (.json/.jsonl) with 'tokens' and string 'ner_tags', or a CoNLL column "
                "file (any other suffix; token first, tag last)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation sentences, in either format."})
    tokens_column: str = field(default="tokens", metadata={"help": "The words column of JSON or Hub data."})
    tags_column: str = field(default="ner_tags", metadata={"help": "The tags column of JSON or Hub data."})
    label_all_tokens: bool = field(default=False, metadata={
        "help": "Train every sub-token of a word on its tag (B- becomes I- after the first), as transformers' "
                "run_ner.py offers; default: the first sub-token only. Scoring reads the first sub-token either way."})
    max_seq_length: int = field(default=256, metadata={
        "help": "Longer sentences are cut; their cut words are predicted O (and counted in a warning)."})
    seeds: list[int] | None = field(default=None,
                                    metadata={"help": "Run once per seed; report each and the median."})
    preset: str | None = field(default=None, metadata={
        "help": f"Paper hyperparameters, as run_glue.py's: {', '.join(PRESETS)}."})
    config_overrides: str | None = field(default=None, metadata={
        "help": "Comma-separated model config fields set when the model is loaded, on top of the preset's."})
    trust_remote_code: bool = field(default=False,
                                    metadata={"help": "Needed for zoo checkpoints (their code travels with them)."})
    ignore_mismatched_sizes: bool = field(default=False,
                                          metadata={"help": "Re-initialise a classifier of another label count."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Truncate training data (quick runs)."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Truncate the validation data."})
    early_stopping_patience: int | None = field(default=None, metadata={
        "help": "As run_glue.py's: stop after this many evaluations without a better F1 and keep the best checkpoint."})
    add_to_model_card: bool = field(default=False, metadata={
        "help": "Write each seed's scores (percent) into OUTPUT_DIR/seed-N/README.md's model-index, and the median "
                "into --model_card_dir if given; runs cut down with --max_train_samples/--max_eval_samples are left "
                "out."})
    model_card_dir: str | None = field(default=None, metadata={"help": "Another card to receive the median."})
    max_nonfinite_steps: int | None = field(default=None, metadata={"help": MAX_NONFINITE_STEPS_HELP})


def parse_args(argv=None) -> tuple[NerArguments, TrainingArguments, list[str]]:
    """The flags on top of run_glue.py's defaults and the --preset's; the user's win over both."""
    from encoder_zoo.glue.run_glue import preset_named
    from encoder_zoo.training.run import parse_fine_tuning_args

    argv = list(sys.argv[1:] if argv is None else argv)
    defaults = GLUE_DEFAULTS + PRESETS.get(preset_named(argv), NO_PRESET).flags
    args, training_args = parse_fine_tuning_args(NerArguments, defaults, argv, __doc__)
    return args, training_args, argv


def main(argv=None) -> dict:
    args, training_args, user_flags = parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    from encoder_zoo.training.run import hold_run_folder, release, stop_on_sigterm, stopped_by

    check_arguments(args)
    hold_run_folder(Path(training_args.output_dir), training_args)  # one run per output folder
    # Everything that can be checked is checked before the first run trains: the data, the model's head, the length.
    labels, raw = load_data(args)
    tokenizer = load_word_tokenizer(args)
    check_model(args, tokenizer)
    encoded, first_positions = tokenize(raw, tokenizer, labels, args, training_args)
    finished = []
    try:
        with stop_on_sigterm():  # a preempted job says what it saved, as a Ctrl-C does
            runs = [run_seed(seed, args, training_args, user_flags, tokenizer, labels, raw, encoded, first_positions,
                             finished) for seed in args.seeds or [training_args.seed]]
    except KeyboardInterrupt as stop:
        how, exit_code = stopped_by(stop)
        raise RunInterrupted(interrupted_message(finished, Path(training_args.output_dir), training_args, how),
                             exit_code) from None
    results = write_results(runs, labels, raw, args, training_args)
    release(Path(training_args.output_dir))
    return results


def check_arguments(args: NerArguments) -> None:
    from encoder_zoo.training.run import check_model_path

    check_model_path(args.model_name_or_path)
    repeated = sorted({seed for seed in args.seeds or [] if args.seeds.count(seed) > 1})
    if repeated:
        raise ValueError(f"--seeds names seed {', '.join(map(str, repeated))} more than once: each seed is one run, "
                         "and the median would count it twice. Pass distinct seeds.")


def load_data(args: NerArguments):
    """The tag names and the train/validation sentences, cut to --max_train_samples/--max_eval_samples."""
    from encoder_zoo.glue.ner import load_ner

    labels, raw = load_ner(args.dataset, args.train_file, args.validation_file, args.tokens_column, args.tags_column)
    for split, limit in (("train", args.max_train_samples), ("validation", args.max_eval_samples)):
        if limit:
            raw[split] = raw[split].select(range(min(limit, len(raw[split]))))
    return labels, raw


def load_word_tokenizer(args: NerArguments):
    """The model's tokenizer, fast (its word ids map sub-tokens to words), reading pre-split words (a byte-level BPE
    tokenizer needs add_prefix_space for that)."""
    from transformers import AutoTokenizer

    from encoder_zoo.training.run import load_pretrained

    tokenizer = load_pretrained(AutoTokenizer, args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    if not tokenizer.is_fast:
        raise ValueError(f"--model_name_or_path {args.model_name_or_path}: run_ner.py needs a fast tokenizer (a "
                         f"tokenizer.json) to map sub-tokens to words; {type(tokenizer).__name__} is a slow one.")
    try:
        tokenizer([["a", "b"]], is_split_into_words=True)
    except ValueError as error:
        if "add_prefix_space" not in str(error):
            raise
        tokenizer = load_pretrained(AutoTokenizer, args.model_name_or_path, trust_remote_code=args.trust_remote_code,
                                    add_prefix_space=True)
    return tokenizer


def check_model(args: NerArguments, tokenizer) -> None:
    """Refuse, before anything trains, a model without a token-classification head (HIRE and BERTAC define sequence
    classification only) and a --max_seq_length it cannot read."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    from encoder_zoo.glue.run_glue import check_max_seq_length
    from encoder_zoo.training.run import load_pretrained

    config = load_pretrained(AutoConfig, args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    auto_map = getattr(config, "auto_map", None) or {}
    if "AutoModelForTokenClassification" not in auto_map and type(config) not in (
            AutoModelForTokenClassification._model_mapping):
        heads = sorted(name.removeprefix("AutoModelFor") for name in auto_map if name.startswith("AutoModelFor"))
        raise ValueError(f"--model_name_or_path {args.model_name_or_path}: its model type {config.model_type!r} "
                         "defines no token-classification head (AutoModelForTokenClassification"
                         + (f"; it has {', '.join(heads)}" if heads else "") + "), so run_ner.py cannot fine-tune it. "
                         "Fine-tune it with glue/run_glue.py, or run NER on the encoder it extends.")
    check_max_seq_length(args.max_seq_length, config, tokenizer, args.model_name_or_path)


def tokenize(raw, tokenizer, labels: list[str], args: NerArguments, training_args: TrainingArguments):
    """The tokenized splits with their sub-token labels, and each validation sentence's first sub-token positions
    (what scoring reads)."""
    from encoder_zoo.glue.ner import align_labels, first_sub_tokens

    label2id = {label: i for i, label in enumerate(labels)}

    def encode(batch):
        encoded = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True,
                            max_length=args.max_seq_length)
        word_ids = [encoded.word_ids(i) for i in range(len(batch["tokens"]))]
        encoded["labels"] = [align_labels(ids, tags, label2id, args.label_all_tokens)
                             for ids, tags in zip(word_ids, batch["ner_tags"])]
        encoded["first_positions"] = [first_sub_tokens(ids) for ids in word_ids]
        return encoded

    with training_args.main_process_first(desc="tokenizing"):
        encoded = raw.map(encode, batched=True, remove_columns=raw["train"].column_names, desc="Tokenizing")
    first_positions = encoded["validation"]["first_positions"]
    cut = sum(len(positions) < len(tokens) for positions, tokens in zip(first_positions, raw["validation"]["tokens"]))
    if cut:
        logger.warning("%d of %d validation sentences are longer than --max_seq_length %d sub-tokens: their cut words "
                       "are predicted O (raise --max_seq_length to score them).", cut, len(first_positions),
                       args.max_seq_length)
    return encoded.remove_columns("first_positions"), first_positions


def predicted_tags(logits, first_positions: list[list[int]], sentences: list[list[str]],
                   labels: list[str]) -> list[list[str]]:
    """Each sentence's tags: the argmax at each word's first sub-token; O for words cut by --max_seq_length."""
    import numpy as np

    best = np.argmax(logits, axis=-1)
    return [[labels[best[row, position]] for position in positions] + ["O"] * (len(words) - len(positions))
            for row, (positions, words) in enumerate(zip(first_positions, sentences))]


def run_seed(seed: int, args: NerArguments, training_args: TrainingArguments, user_flags: list[str], tokenizer,
             labels: list[str], raw, encoded, first_positions, finished: list) -> dict:
    """One fine-tuning run: train, tag the validation sentences, score them, save the model and predictions.jsonl."""
    import evaluate
    from transformers import (
        AutoModelForTokenClassification,
        DataCollatorForTokenClassification,
        EarlyStoppingCallback,
        set_seed,
    )

    from encoder_zoo.glue.run_glue import model_config_overrides, selection_arguments
    from encoder_zoo.training.run import FineTuningTrainer, load_pretrained

    metric = evaluate.load(METRIC_MODULE)
    sentences, gold = raw["validation"]["tokens"], raw["validation"]["ner_tags"]

    def compute_metrics(prediction):
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        scores = metric.compute(predictions=predicted_tags(logits, first_positions, sentences, labels),
                                references=gold)
        # Trainer logs (and checkpoint selection reads) percentages, the scale of the papers' NER tables.
        return {**{key: 100.0 * scores[key] for key in SCORES}, "score": 100.0 * scores["f1"]}

    selection = selection_arguments(args, training_args, user_flags, PRESETS.get(args.preset, NO_PRESET).flags)
    if selection.get("metric_for_best_model") == "score":
        selection["metric_for_best_model"] = "f1"
    run_args = dataclasses.replace(training_args, seed=seed,
                                   output_dir=str(Path(training_args.output_dir) / f"seed-{seed}"), **selection)
    set_seed(seed)
    model = load_pretrained(AutoModelForTokenClassification, args.model_name_or_path, num_labels=len(labels),
                            id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)},
                            trust_remote_code=args.trust_remote_code,
                            ignore_mismatched_sizes=args.ignore_mismatched_sizes, **model_config_overrides(args))
    trainer = FineTuningTrainer(
        model=model, args=run_args, train_dataset=encoded["train"], eval_dataset=encoded["validation"],
        processing_class=tokenizer, data_collator=DataCollatorForTokenClassification(tokenizer),
        compute_metrics=compute_metrics, max_nonfinite_steps=args.max_nonfinite_steps,
        callbacks=[EarlyStoppingCallback(args.early_stopping_patience)]
        if selection and args.early_stopping_patience is not None else None)
    trainer.train()
    prediction = trainer.predict(encoded["validation"])
    trainer.save_model()
    tags = predicted_tags(prediction.predictions, first_positions, sentences, labels)
    scores = metric.compute(predictions=tags, references=gold)
    run = {"seed": seed, "metrics": {key: 100.0 * scores[key] for key in SCORES},
           "per_type": {name: {**{key: 100.0 * value[key] for key in ("precision", "recall", "f1")},
                               "number": value["number"]} for name, value in scores.items() if isinstance(value, dict)}}
    if trainer.is_world_process_zero():
        write_predictions(Path(run_args.output_dir) / "predictions.jsonl", sentences, gold, tags)
    finished.append((seed, run_args.output_dir, run["metrics"]))
    logger.info("seed %d: %s", seed, ", ".join(f"{key} {value:.2f}" for key, value in run["metrics"].items()))
    return run


def write_predictions(path: Path, sentences, gold, predicted) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for words, gold_tags, predicted_tags_ in zip(sentences, gold, predicted):
            handle.write(json.dumps({"tokens": words, "gold_tags": gold_tags, "predicted_tags": predicted_tags_},
                                    ensure_ascii=False) + "\n")


def write_results(runs: list[dict], labels: list[str], raw, args: NerArguments, training_args: TrainingArguments):
    """OUTPUT_DIR/ner_results.json: every run and the median (points), and the model cards when asked."""
    output = Path(training_args.output_dir)
    results = {"model": args.model_name_or_path, "dataset": dataset_name(args), "scale": SCORE_SCALE,
               "labels": labels, "label_all_tokens": args.label_all_tokens, "num_train": len(raw["train"]),
               "num_validation": len(raw["validation"]), "runs": runs,
               "median": {key: statistics.median(run["metrics"][key] for run in runs) for key in SCORES}}
    if training_args.process_index == 0:
        (output / RESULTS).write_text(json.dumps(results, indent=2))
        (output / PARTIAL_RESULTS).unlink(missing_ok=True)
        print(" | ".join(f"{key} {value:.2f}" for key, value in results["median"].items())
              + f" (median of {len(runs)} seed{'s' if len(runs) > 1 else ''})")
        if args.add_to_model_card and (args.max_train_samples or args.max_eval_samples):
            logger.warning("Not writing the model-index: --max_train_samples/--max_eval_samples cut this run down, "
                           "so its scores are not the dataset's.")
        elif args.add_to_model_card:
            write_model_index(results, output, args)
    return results


def dataset_name(args: NerArguments) -> str:
    return args.train_file and Path(args.train_file).name or args.dataset


def dataset_identity(args: NerArguments) -> dict:
    """The model-index's dataset fields: a Hub set by its id, local files by an id of their own (`local:<stem>`),
    as run_glue.py names them."""
    from encoder_zoo.glue.ner import NER_HUB_IDS

    if args.train_file:
        return dict(dataset_type=f"local:{Path(args.train_file).stem}", dataset_name=Path(args.train_file).name)
    return dict(dataset_type=NER_HUB_IDS.get(args.dataset, args.dataset),
                dataset_name="CoNLL-2003" if args.dataset == "conll2003" else args.dataset)


def write_model_index(results: dict, output: Path, args: NerArguments) -> None:
    """Each seed's card (complete, as run_glue.py writes them) gets its scores; --model_card_dir the median."""
    from encoder_zoo.glue.run_glue import TOKEN_CARD, base_card_data, write_seed_card
    from encoder_zoo.hub_cards import add_eval_results

    identity = dataset_identity(args)
    kwargs = dict(task_type="token-classification", task_name="ner", dataset_split="validation", **identity)
    base_card = base_card_data(args.model_name_or_path)
    for run in results["runs"]:
        folder = output / f"seed-{run['seed']}"
        write_seed_card(folder, args.model_name_or_path, base_card, "ner", run["seed"], identity["dataset_name"],
                        TOKEN_CARD)
        add_eval_results(folder, metrics=run["metrics"], seeds=[run["seed"]], **kwargs)
    if args.model_card_dir:
        add_eval_results(args.model_card_dir, metrics=results["median"], seeds=[run["seed"] for run in results["runs"]],
                         **kwargs)


def interrupted_message(finished: list, output: Path, training_args: TrainingArguments, how: str) -> str:
    """What a Ctrl-C (or SIGTERM) leaves: the finished seeds (model and predictions.jsonl in their folders, scores in
    OUTPUT_DIR/ner_results.partial.json), and how to go on."""
    if not finished:
        return (f"interrupted ({how}) before any run finished: nothing was saved (a run saves its model when it ends). "
                "Run the same command again to start over.")
    if training_args.process_index == 0:
        partial = [{"seed": seed, "metrics": metrics} for seed, _, metrics in finished]
        (output / PARTIAL_RESULTS).write_text(json.dumps({"scale": SCORE_SCALE, "finished_runs": partial}, indent=2))
    seeds = ", ".join(str(seed) for seed, *_ in finished)
    return (f"interrupted ({how}). Saved: seed {seeds}: each model and predictions.jsonl in {output}/seed-N, the "
            f"scores in {output / PARTIAL_RESULTS}. Run the missing seeds (--seeds) with another --output_dir to keep "
            "them.")


def cli() -> None:
    from encoder_zoo.training.run import TrainingDiverged, run_cli

    run_cli(main, "run_ner.py", stops=(TrainingDiverged, RunInterrupted),
            interrupted="interrupted (Ctrl-C) before any run began; nothing was saved. Run the same command again.")


if __name__ == "__main__":
    cli()
