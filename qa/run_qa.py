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

import argparse
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser, TrainingArguments

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
    from encoder_zoo.glue.run_glue import RunInterrupted

    stage = {"saved": None}  # what a Ctrl-C leaves: set once the fine-tuned model is saved
    try:
        return run(argv, stage)
    except KeyboardInterrupt:
        output = stage.get("output")
        if stage["saved"]:
            raise RunInterrupted(
                f"interrupted (Ctrl-C) after training: the fine-tuned model is saved in {output}, not yet evaluated. "
                f"Evaluate it without training again by running the same command with --model_name_or_path {output} "
                "--num_train_epochs 0 and another --output_dir, or run the same command to start over.") from None
        raise RunInterrupted("interrupted (Ctrl-C) before the fine-tuned model was saved (it is saved when training "
                             "ends): nothing was saved. Run the same command again to start over.") from None


def run(argv, stage: dict) -> dict:
    import evaluate
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, DataCollatorWithPadding, set_seed

    from encoder_zoo.glue.run_glue import check_max_seq_length
    from encoder_zoo.qa.data import EMBEDDED, SQUAD_LAYOUT, load_qa, validate
    from encoder_zoo.qa.processing import postprocess_predictions, prepare_train_features, prepare_validation_features
    from encoder_zoo.training.run import (
        FineTuningTrainer,
        check_model_path,
        extra_inputs_for,
        hold_run_folder,
        load_pretrained,
        pin_memory_only_with_an_accelerator,
        release,
    )

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser((QAArguments, TrainingArguments), description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    args, training_args = parser.parse_args_into_dataclasses(args=QA_DEFAULTS + argv)
    pin_memory_only_with_an_accelerator(training_args)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if args.on_malformed not in ("error", "skip"):
        raise ValueError("--on_malformed is 'error' or 'skip'.")
    check_model_path(args.model_name_or_path)
    room = args.max_seq_length - args.max_question_length - 3  # [CLS] question [SEP] context [SEP]
    if args.doc_stride >= room:
        raise ValueError(f"--doc_stride {args.doc_stride} leaves no new context per window: it must be below "
                         f"--max_seq_length - --max_question_length - 3 = {room}.")
    hold_run_folder(Path(training_args.output_dir), training_args)  # one run per output folder
    stage["output"] = training_args.output_dir

    raw = load_qa(None if (args.train_file or args.validation_file) else args.dataset, args.train_file,
                  args.validation_file, cache_dir=args.cache_dir)
    skipped, empty = {}, {}
    for split in list(raw):
        source = {"train": args.train_file, "validation": args.validation_file}.get(split) or f"{args.dataset} {split}"
        raw[split], skipped[split] = validate(raw[split], args.on_malformed, source)
        if skipped[split]:
            logger.warning("Skipped %d malformed %s records.", skipped[split], split)
        if not len(raw[split]):
            empty[split] = (f"{source} has no {split} questions"
                            + (f" left (all {skipped[split]} were malformed and skipped)." if skipped[split] else "."))
    if args.max_train_samples and "train" in raw:
        raw["train"] = raw["train"].select(range(min(args.max_train_samples, len(raw["train"]))))
    if args.max_eval_samples and "validation" in raw:
        raw["validation"] = raw["validation"].select(range(min(args.max_eval_samples, len(raw["validation"]))))
    version_2 = args.version_2_with_negative
    if version_2 is None:  # local files: SQuAD 2.0 when any question has no answer
        local = args.train_file or args.validation_file
        version_2 = args.dataset in ("squad_v2", "wiki_cloze_v2") if not local else any(
            not a["text"] for split in raw.values() for a in split["answers"])

    tokenizer = load_pretrained(AutoTokenizer, args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("QA windows need a fast tokenizer (offset mappings).")
    set_seed(training_args.seed)  # a checkpoint without a QA head gets a new one: the same for the same --seed
    model = load_pretrained(AutoModelForQuestionAnswering, args.model_name_or_path,
                            trust_remote_code=args.trust_remote_code)
    extra_inputs = extra_inputs_for(model.config)
    check_max_seq_length(args.max_seq_length, model.config, tokenizer, args.model_name_or_path)  # as run_glue.py
    max_length = args.max_seq_length
    if empty:  # after the model: a broken checkpoint is named before a placeholder data file is
        raise ValueError(" ".join(empty.values())
                         + (f" {SQUAD_LAYOUT}." if args.train_file or args.validation_file else ""))
    with training_args.main_process_first(desc="building windows"):
        train_features = raw["train"].map(
            lambda b: prepare_train_features(b, tokenizer, max_length, args.doc_stride, args.max_question_length,
                                             extra_inputs),
            batched=True, remove_columns=raw["train"].column_names, desc="Train windows") if "train" in raw else None
        eval_features = raw["validation"].map(
            lambda b: prepare_validation_features(b, tokenizer, max_length, args.doc_stride, args.max_question_length,
                                                  extra_inputs),
            batched=True, remove_columns=raw["validation"].column_names,
            desc="Validation windows") if "validation" in raw else None

    trainer = FineTuningTrainer(model=model, args=training_args, train_dataset=train_features,
                                processing_class=tokenizer, data_collator=DataCollatorWithPadding(tokenizer),
                                max_nonfinite_steps=args.max_nonfinite_steps)
    results = {"model": args.model_name_or_path, "dataset": args.train_file or args.dataset, "version_2": version_2,
               "skipped_malformed": skipped}
    if train_features is not None and (training_args.num_train_epochs > 0 or training_args.max_steps > 0):
        results["train"] = trainer.train().metrics
        trainer.save_model()
        stage["saved"] = training_args.output_dir
    output = Path(training_args.output_dir)
    if eval_features is not None:
        model_inputs = eval_features.remove_columns(["example_id", "offset_mapping"])
        prediction = trainer.predict(model_inputs)
        start_logits, end_logits = prediction.predictions[:2]
        predictions, nbest, null_odds = postprocess_predictions(
            raw["validation"], eval_features, start_logits, end_logits, args.n_best_size, args.max_answer_length,
            version_2,
        )
        metric = evaluate.load(METRIC_MODULE, "v2" if version_2 else "v1")
        references = [{"id": r["id"], "answers": r["answers"]} for r in raw["validation"]]
        scored = [{"id": q, "prediction_text": t, **({"no_answer_probability": null_odds[q]} if version_2 else {})}
                  for q, t in predictions.items()]
        results["eval"] = metric.compute(predictions=scored, references=references,
                                         **({"no_answer_threshold": NULL_ODDS_THRESHOLD} if version_2 else {}))
        if training_args.process_index == 0:
            output.mkdir(parents=True, exist_ok=True)
            final = {q: ("" if version_2 and null_odds[q] > NULL_ODDS_THRESHOLD else t) for q, t in predictions.items()}
            (output / "predictions.json").write_text(json.dumps(final, indent=1))
            (output / "nbest_predictions.json").write_text(json.dumps(nbest, indent=1))
            if version_2:
                (output / "null_odds.json").write_text(json.dumps(null_odds, indent=1))
    if training_args.process_index == 0:
        output.mkdir(parents=True, exist_ok=True)
        (output / "qa_results.json").write_text(json.dumps(results, indent=2, default=str))
        logger.info("QA results: %s", results.get("eval"))
        if args.add_to_model_card and "eval" in results and (args.max_train_samples or args.max_eval_samples):
            logger.warning("Not writing the model-index: --max_train_samples/--max_eval_samples cut this run down, "
                           "so its scores are not the dataset's.")
        elif args.add_to_model_card and "eval" in results:
            from encoder_zoo.hub_cards import add_eval_results
            from encoder_zoo.qa.data import HUB_DATASETS

            keys = ("exact", "f1", "best_exact", "best_f1") if version_2 else ("exact_match", "f1")
            local = args.validation_file or args.train_file
            if local:  # ids that cannot be mistaken for Hub ids: huggingface_hub groups results by dataset type
                identity = dict(dataset_type=f"local:{Path(local).stem}", dataset_name=Path(local).name)
            elif args.dataset in EMBEDDED:
                identity = dict(dataset_type=f"encoder-zoo:{args.dataset}",
                                dataset_name=f"{args.dataset} (embedded in encoder-zoo)")
            else:
                identity = dict(dataset_type=HUB_DATASETS[args.dataset][0], dataset_name=args.dataset)
            # SQuAD scores are percentages already, the scale of run_glue's model-index too.
            kwargs = dict(task_type="question-answering", task_name="extractive QA", **identity,
                          dataset_split="validation", metrics={k: results["eval"][k] for k in keys},
                          seeds=[training_args.seed])
            for folder in filter(None, (output, args.model_card_dir)):
                add_eval_results(folder, **kwargs)
    release(output)
    return results


def cli() -> None:
    from encoder_zoo.glue.run_glue import RunInterrupted
    from encoder_zoo.qa.data import MalformedRecordError
    from encoder_zoo.training.run import TrainingDiverged

    try:
        main()
    except TrainingDiverged as error:
        print(f"run_qa.py: {error}", file=sys.stderr)
        raise SystemExit(error.exit_code) from None
    except (ValueError, OSError, MalformedRecordError) as error:
        print(f"run_qa.py: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except RunInterrupted as error:
        print(f"run_qa.py: {error}", file=sys.stderr)
        raise SystemExit(error.exit_code) from None
    except KeyboardInterrupt:  # while Python was still importing: nothing was written
        print("run_qa.py: interrupted (Ctrl-C) before anything was saved. Run the same command again.", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    cli()
