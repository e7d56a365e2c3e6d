"""Fine-tune and evaluate any zoo model or transformers encoder on extractive QA with Trainer.

    python qa/run_qa.py --model_name_or_path PATH_OR_ID --dataset squad --output_dir runs/qa
    python qa/run_qa.py --model_name_or_path runs/demo/export --trust_remote_code --dataset wiki_cloze_v2 ...
    python qa/run_qa.py --model_name_or_path ... --train_file train.json --validation_file dev.json \\
        --version_2_with_negative
    accelerate launch --multi_gpu qa/run_qa.py ...

Datasets: squad, squad_v2, mrqa (online, through `datasets`), local SQuAD-format JSON (--train_file /
--validation_file), and the embedded offline wiki_cloze / wiki_cloze_v2 (cloze questions from real Wikipedia text;
see qa/README.md). Long contexts are split into windows of --max_seq_length with --doc_stride overlap; SQuAD 2.0
reports both the raw figures (null threshold 0) and the best-threshold figures tuned on the evaluation set.
Every Trainer flag works. Outputs: predictions.json, nbest_predictions.json, null_odds.json (v2), qa_results.json.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from transformers import TrainingArguments

from encoder_zoo.training.run import MAX_NONFINITE_STEPS_HELP

logger = logging.getLogger("run_qa")
METRIC_MODULE = str(Path(__file__).resolve().parent / "metrics" / "squad_zoo")
# v2: a question is answered null when its null odds (null score - best span score) exceed this; the metric's
# best_* figures tune it on the evaluation set.
NULL_ODDS_THRESHOLD = 0.0
QA_DEFAULTS = ["--learning_rate", "3e-5", "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "32",
               "--num_train_epochs", "2", "--warmup_steps", "0.1", "--weight_decay", "0.01", "--save_strategy", "no",
               "--eval_strategy", "no", "--logging_steps", "50", "--report_to", "none"]


@dataclass
class QAArguments:
    model_name_or_path: str = field(metadata={"help": "A checkpoint folder or Hub id (any encoder, or a zoo export)."})
    dataset: str | None = field(default="wiki_cloze",
                                metadata={"help": "squad, squad_v2, mrqa, wiki_cloze, wiki_cloze_v2."})
    train_file: str | None = field(default=None, metadata={"help": "Local SQuAD-format JSON for training."})
    validation_file: str | None = field(default=None, metadata={"help": "Local SQuAD-format JSON for evaluation."})
    version_2_with_negative: bool | None = field(default=None,
                                                 metadata={"help": "SQuAD 2.0 scoring (default: from the dataset)."})
    max_seq_length: int = field(default=384, metadata={"help": "Window length in tokens (question included)."})
    doc_stride: int = field(default=128, metadata={"help": "Overlap between consecutive windows of a long context."})
    n_best_size: int = field(default=20, metadata={"help": "Start/end candidates searched per window."})
    max_answer_length: int = field(default=30, metadata={"help": "Longest answer, in tokens."})
    max_question_length: int = field(default=64, metadata={"help": "Longer questions are cut to this many tokens."})
    on_malformed: str = field(default="error",
                              metadata={"help": "error (name the bad record) or skip (drop and count)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Truncate training data."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Truncate evaluation data."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Needed for zoo checkpoints."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where the built wiki_cloze set is cached."})
    add_to_model_card: bool = field(default=False, metadata={"help": "Write the results (percent) into "
                                    "OUTPUT_DIR's model card; runs cut down with "
                                    "--max_train_samples/--max_eval_samples are left out."})
    model_card_dir: str | None = field(default=None, metadata={"help": "Another card to receive the results."})
    max_nonfinite_steps: int | None = field(default=None, metadata={"help": MAX_NONFINITE_STEPS_HELP})


def main(argv=None) -> dict:
    """Fine-tune and evaluate (`run`). A Ctrl-C ends in `RunInterrupted`, whose message says what was saved."""
    from encoder_zoo.training.run import stop_on_sigterm

    stage = {"saved": None}  # what a Ctrl-C leaves: set once the fine-tuned model is saved
    try:
        with stop_on_sigterm():  # a preempted job says what it saved, as a Ctrl-C does
            return run(argv, stage)
    except KeyboardInterrupt as stop:
        raise interruption(stage, stop) from None


def interruption(stage: dict, stop: KeyboardInterrupt):
    """The stop a Ctrl-C (or SIGTERM) ends in: what was saved, and how to go on."""
    from encoder_zoo.training.run import RunInterrupted, stopped_by

    output = stage.get("output")
    how, exit_code = stopped_by(stop)
    if stage["saved"]:
        return RunInterrupted(
            f"interrupted ({how}) after training: the fine-tuned model is saved in {output}, not yet evaluated. "
            f"Evaluate it without training again by running the same command with --model_name_or_path {output} "
            "--num_train_epochs 0 and another --output_dir, or run the same command to start over.", exit_code)
    return RunInterrupted(f"interrupted ({how}) before the fine-tuned model was saved (it is saved when training "
                          "ends): nothing was saved. Run the same command again to start over.", exit_code)


def run(argv, stage: dict) -> dict:
    """Every check (flags, data, model, length) before the first training step; then train, evaluate, write."""
    from encoder_zoo.qa.data import SQUAD_LAYOUT
    from encoder_zoo.training.run import hold_run_folder, parse_fine_tuning_args, release

    args, training_args = parse_fine_tuning_args(QAArguments, QA_DEFAULTS, argv, __doc__)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    check_arguments(args)
    output = Path(training_args.output_dir)
    hold_run_folder(output, training_args)  # one run per output folder
    stage["output"] = training_args.output_dir
    raw, skipped, empty = read_questions(args)
    version_2 = is_version_2(args, raw)
    tokenizer, model, extra_inputs = load_model(args, training_args)
    if empty:  # after the model: a broken checkpoint is named before a placeholder data file is
        raise ValueError(" ".join(empty.values()) + (f" {SQUAD_LAYOUT}." if local_file(args) else ""))
    train_features, eval_features = build_windows(raw, tokenizer, extra_inputs, args, training_args)
    trainer = build_trainer(model, tokenizer, train_features, args, training_args)
    results = {"model": args.model_name_or_path, "dataset": args.train_file or args.dataset, "version_2": version_2,
               "skipped_malformed": skipped}
    if train_features is not None and (training_args.num_train_epochs > 0 or training_args.max_steps > 0):
        results["train"] = train(trainer, stage)
    if eval_features is not None:
        results["eval"] = evaluate_answers(trainer, raw["validation"], eval_features, args, version_2, output)
        results["first_words_floor"] = first_words_floor(raw.get("train"), raw["validation"], version_2)
    if training_args.process_index == 0:
        write_results(results, args, version_2, training_args.seed, output)
    release(output)
    return results


def local_file(args: QAArguments) -> str | None:
    """The local data the run reads, if any: the validation file, else the training file."""
    return args.validation_file or args.train_file


def check_arguments(args: QAArguments) -> None:
    """The flags, and the model path, before anything is loaded."""
    from encoder_zoo.qa.processing import check_doc_stride
    from encoder_zoo.training.run import check_model_path

    if args.on_malformed not in ("error", "skip"):
        raise ValueError("--on_malformed is 'error' or 'skip'.")
    check_model_path(args.model_name_or_path)
    check_doc_stride(args, "context")


def read_questions(args: QAArguments) -> tuple[dict, dict[str, int], dict[str, str]]:
    """The dataset's or the files' splits, validated (malformed records refused or skipped and counted) and cut to
    --max_train_samples/--max_eval_samples; with the count skipped per split and what each empty split lacks."""
    from encoder_zoo.qa.data import load_qa, validate

    raw = load_qa(None if local_file(args) else args.dataset, args.train_file, args.validation_file,
                  cache_dir=args.cache_dir)
    skipped, empty = {}, {}
    for split in list(raw):
        source = {"train": args.train_file, "validation": args.validation_file}.get(split) or f"{args.dataset} {split}"
        raw[split], problems = validate(raw[split], args.on_malformed, source)
        skipped[split] = len(problems)
        if problems:
            logger.warning("Skipped %d malformed %s records: %s.", len(problems), split, first_problems(problems))
        if not len(raw[split]):
            empty[split] = (f"{source} has no {split} questions" + (
                f" left: all {len(problems)} were malformed and skipped ({first_problems(problems)})." if problems
                else "."))
    for split, limit in (("train", args.max_train_samples), ("validation", args.max_eval_samples)):
        if limit and split in raw:
            raw[split] = raw[split].select(range(min(limit, len(raw[split]))))
    return raw, skipped, empty


def first_problems(problems: list[str], shown: int = 3) -> str:
    """What was wrong with the first `shown` malformed records, and how many more there were."""
    more = f"; and {len(problems) - shown} more" if len(problems) > shown else ""
    return "; ".join(problems[:shown]) + more


def is_version_2(args: QAArguments, raw: dict) -> bool:
    """SQuAD 2.0 scoring: as --version_2_with_negative says, else from the dataset; local files are 2.0 when any
    question has no answer."""
    if args.version_2_with_negative is not None:
        return args.version_2_with_negative
    if not local_file(args):
        from encoder_zoo.qa.tasks import QA_TASKS

        return args.dataset in QA_TASKS and QA_TASKS[args.dataset].version_2
    return any(not a["text"] for split in raw.values() for a in split["answers"])


def load_model(args: QAArguments, training_args: TrainingArguments):
    """The fast tokenizer, the QA model (a new head is the same for the same --seed), the inputs it needs beyond the
    tokenizer's, and --max_seq_length checked against what it can read."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, set_seed

    from encoder_zoo.glue.run_glue import check_max_seq_length
    from encoder_zoo.training.run import extra_inputs_for, load_pretrained

    tokenizer = load_pretrained(AutoTokenizer, args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("QA windows need a fast tokenizer (offset mappings).")
    set_seed(training_args.seed)  # a checkpoint without a QA head gets a new one: the same for the same --seed
    model = load_pretrained(AutoModelForQuestionAnswering, args.model_name_or_path,
                            trust_remote_code=args.trust_remote_code)
    extra_inputs = extra_inputs_for(model.config)
    check_max_seq_length(args.max_seq_length, model.config, tokenizer, args.model_name_or_path)  # as run_glue.py
    return tokenizer, model, extra_inputs


def build_windows(raw: dict, tokenizer, extra_inputs, args: QAArguments, training_args: TrainingArguments):
    """Training windows with their answer positions and evaluation windows with their offsets (None for a split
    the data lacks)."""
    from encoder_zoo.qa.processing import prepare_train_features, prepare_validation_features

    window_args = (tokenizer, args.max_seq_length, args.doc_stride, args.max_question_length, extra_inputs)
    with training_args.main_process_first(desc="building windows"):
        train_features = raw["train"].map(
            lambda b: prepare_train_features(b, *window_args),
            batched=True, remove_columns=raw["train"].column_names, desc="Train windows") if "train" in raw else None
        eval_features = raw["validation"].map(
            lambda b: prepare_validation_features(b, *window_args),
            batched=True, remove_columns=raw["validation"].column_names,
            desc="Validation windows") if "validation" in raw else None
    return train_features, eval_features


def build_trainer(model, tokenizer, train_features, args: QAArguments, training_args: TrainingArguments):
    from transformers import DataCollatorWithPadding

    from encoder_zoo.training.run import FineTuningTrainer

    return FineTuningTrainer(model=model, args=training_args, train_dataset=train_features,
                             processing_class=tokenizer, data_collator=DataCollatorWithPadding(tokenizer),
                             max_nonfinite_steps=args.max_nonfinite_steps)


def train(trainer, stage: dict) -> dict:
    """Fine-tune and save the model into OUTPUT_DIR; its training metrics."""
    metrics = trainer.train().metrics
    trainer.save_model()
    stage["saved"] = trainer.args.output_dir
    return metrics


def evaluate_answers(trainer, questions, features, args: QAArguments, version_2: bool, output: Path) -> dict:
    """Score the predicted answers with the SQuAD metric (v2: raw figures at NULL_ODDS_THRESHOLD and best-threshold
    ones), and write predictions.json, nbest_predictions.json and (v2) null_odds.json."""
    import evaluate

    from encoder_zoo.qa.processing import postprocess_predictions

    prediction = trainer.predict(features.remove_columns(["example_id", "offset_mapping"]))
    start_logits, end_logits = prediction.predictions[:2]
    predictions, nbest, null_odds = postprocess_predictions(
        questions, features, start_logits, end_logits, args.n_best_size, args.max_answer_length, version_2,
    )
    metric = evaluate.load(METRIC_MODULE, "v2" if version_2 else "v1")
    references = [{"id": r["id"], "answers": r["answers"]} for r in questions]
    scored = [{"id": q, "prediction_text": t, **({"no_answer_probability": null_odds[q]} if version_2 else {})}
              for q, t in predictions.items()]
    scores = metric.compute(predictions=scored, references=references,
                            **({"no_answer_threshold": NULL_ODDS_THRESHOLD} if version_2 else {}))
    if trainer.args.process_index == 0:
        output.mkdir(parents=True, exist_ok=True)
        final = {q: ("" if version_2 and null_odds[q] > NULL_ODDS_THRESHOLD else t) for q, t in predictions.items()}
        (output / "predictions.json").write_text(json.dumps(final, indent=1))
        (output / "nbest_predictions.json").write_text(json.dumps(nbest, indent=1))
        if version_2:
            (output / "null_odds.json").write_text(json.dumps(null_odds, indent=1))
    return scores


MAX_ANSWER_WORDS = 10  # the first-words floor tries answers of 0 (no answer) to this many words
FLOOR_TRAIN_QUESTIONS = 2000  # the training questions that choose its length (what the reproduction budgets read)


def first_words(context: str, k: int) -> str:
    return " ".join(context.split()[:k])


def first_words_floor(train, validation, version_2: bool, limit: int | None = FLOOR_TRAIN_QUESTIONS) -> dict | None:
    """The score of a model that reads neither question nor answer type: every question answered with its context's
    first k words, k (0: no answer) the length whose answers score the best F1 on the first `limit` training
    questions (None: all; ties: the shorter), scored on `validation` by the SQuAD metric as the model is. None
    without training questions to choose k. `repro/floors.py` (trivial_answer) reads the same."""
    import evaluate

    if train is None or not len(train):
        return None
    train = train.select(range(min(limit, len(train)))) if limit else train
    metric = evaluate.load(METRIC_MODULE, "v2" if version_2 else "v1")

    def scores(records, k: int) -> dict:
        answered = [{"id": r["id"], "prediction_text": first_words(r["context"], k),
                     **({"no_answer_probability": 0.0} if version_2 else {})} for r in records]
        references = [{"id": r["id"], "answers": r["answers"]} for r in records]
        return metric.compute(predictions=answered, references=references,
                              **({"no_answer_threshold": NULL_ODDS_THRESHOLD} if version_2 else {}))

    train_f1 = {k: float(scores(train, k)["f1"]) for k in range(MAX_ANSWER_WORDS + 1)}
    k = max(train_f1, key=lambda length: (train_f1[length], -length))
    score = scores(validation, k)
    return {"words": k, "f1": float(score["f1"]), "exact": float(score.get("exact_match", score.get("exact"))),
            "train_f1": train_f1, "train_questions": len(train), "eval_questions": len(validation)}


def results_line(scores: dict, floor: dict | None) -> str:
    """The run's F1 and exact match beside the first-words floor's."""
    exact = scores.get("exact_match", scores.get("exact"))
    line = f"F1 {scores['f1']:.2f}, exact match {exact:.2f}"
    if floor is None:
        return f"{line} (no training questions to fit the first-words floor)"
    answer = "no answer" if floor["words"] == 0 else f"the context's first {floor['words']} word(s)"
    return (f"{line}; first-words floor F1 {floor['f1']:.2f}, exact match {floor['exact']:.2f} ({answer} for "
            f"every question, the length chosen on {floor['train_questions']} training questions)")


def write_results(results: dict, args: QAArguments, version_2: bool, seed: int, output: Path) -> None:
    """qa_results.json, and the scores in the model cards --add_to_model_card names (not for a cut-down run)."""
    output.mkdir(parents=True, exist_ok=True)
    (output / "qa_results.json").write_text(json.dumps(results, indent=2, default=str))
    logger.info("QA results: %s", results.get("eval"))
    if "eval" in results:  # the score beside what a model that reads no question scores
        print(f"QA results: {results_line(results['eval'], results.get('first_words_floor'))}.")
    if args.add_to_model_card and "eval" in results and (args.max_train_samples or args.max_eval_samples):
        logger.warning("Not writing the model-index: --max_train_samples/--max_eval_samples cut this run down, "
                       "so its scores are not the dataset's.")
    elif args.add_to_model_card and "eval" in results:
        from encoder_zoo.hub_cards import add_eval_results
        from encoder_zoo.qa.data import HUB_DATASETS, card_dataset

        keys = ("exact", "f1", "best_exact", "best_f1") if version_2 else ("exact_match", "f1")
        # SQuAD scores are percentages already, the scale of run_glue's model-index too.
        kwargs = dict(task_type="question-answering", task_name="extractive QA",
                      **card_dataset(args.dataset, local_file(args), HUB_DATASETS), dataset_split="validation",
                      metrics={k: results["eval"][k] for k in keys}, seeds=[seed])
        for folder in filter(None, (output, args.model_card_dir)):
            add_eval_results(folder, **kwargs)


def cli() -> None:
    from encoder_zoo.training.run import RunInterrupted, TrainingDiverged, run_cli

    run_cli(main, "run_qa.py", stops=(TrainingDiverged, RunInterrupted),
            interrupted="interrupted (Ctrl-C) before anything was saved. Run the same command again.")


if __name__ == "__main__":
    cli()
