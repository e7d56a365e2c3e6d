"""Open-domain QA with a passage selector and a reader (Lin et al., 2018; the BERTAC paper's Section 5.2), for any
zoo model or transformers encoder.

    python qa/run_open_qa.py --model_name_or_path runs/bertac-init --trust_remote_code --output_dir runs/open-qa
    python qa/run_open_qa.py --model_name_or_path FacebookAI/roberta-large --dataset search_qa --output_dir ...
    python qa/run_open_qa.py --model_name_or_path ... --train_file quasart_train.jsonl \\
        --validation_file quasart_dev.jsonl

Each question comes with several retrieved passages. Both models read `[CLS] question [SEP] passage [SEP]` windows
(--max_seq_length, --doc_stride):
- the passage selector is a 2-class sequence classifier: does this window hold an answer (a gold answer string
  occurs in it, the distant supervision of Lin et al.)? P(p_i | q, P) is its probability that passage i holds an
  answer (the best of the passage's windows), normalised over the question's passages;
- the reader is a span extractor trained only on the windows that hold an answer; P(a | q, p_i) is the probability
  of each of its --n_best_size (3, as the authors) best spans in passage i, a softmax over their scores;
- the answer is the argmax over normalised answer text of sum_i P(p_i | q, P) * P(a | q, p_i).
Scored with SQuAD v1.1 exact match and F1 against every gold answer. Data: the embedded `wiki_open` (offline, see
qa/README.md), `search_qa` (the Hub), or local JSON/JSONL records {id, question, answers, passages} (Quasar-T and
SearchQA as Lin et al. preprocess them). Every Trainer flag works; both models train with them, into
OUTPUT_DIR/selector and OUTPUT_DIR/reader. Outputs: predictions.json, open_qa_results.json.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import inspect
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser, TrainingArguments

from encoder_zoo.training.run import MAX_NONFINITE_STEPS_HELP

logger = logging.getLogger("run_open_qa")
METRIC_MODULE = str(Path(__file__).resolve().parent / "metrics" / "squad_zoo")
# The paper's open-domain QA recipe (Section 5.2.2): lr 1e-5, 2 epochs, 6% linear warmup then linear decay, windows of
# 384 with stride 128; batch 48 (Quasar-T) or 96 (SearchQA) on GPUs; the authors' code: AdamW, weight decay 0.01,
# clipping 1.0.
OPEN_QA_DEFAULTS = ["--learning_rate", "1e-5", "--num_train_epochs", "2", "--warmup_steps", "0.06",
                    "--lr_scheduler_type", "linear", "--weight_decay", "0.01", "--max_grad_norm", "1.0",
                    "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "64",
                    "--save_strategy", "no", "--eval_strategy", "no", "--logging_steps", "50", "--report_to", "none"]


@dataclass
class OpenQAArguments:
    model_name_or_path: str = field(metadata={"help": "The encoder both models start from (any encoder, or a zoo "
                                                      "export)."})
    dataset: str | None = field(default="wiki_open", metadata={"help": "wiki_open (embedded) or search_qa (Hub)."})
    train_file: str | None = field(default=None,
                                   metadata={"help": "JSON/JSONL records {id, question, answers, passages}."})
    validation_file: str | None = field(default=None, metadata={"help": "The same, for evaluation."})
    selector_model: str | None = field(default=None,
                                       metadata={"help": "A trained passage selector: skip its training."})
    reader_model: str | None = field(default=None, metadata={"help": "A trained reader: skip its training."})
    num_passages: int = field(default=10, metadata={"help": "wiki_open: passages per question (1 holds the answer)."})
    wiki_articles: int = field(default=4000, metadata={"help": "wiki_open: articles the cloze questions come from."})
    max_seq_length: int = field(default=384, metadata={"help": "Window length in tokens (question included)."})
    doc_stride: int = field(default=128, metadata={"help": "Overlap between consecutive windows of a long passage."})
    max_question_length: int = field(default=64, metadata={"help": "Longer questions are cut to this many tokens."})
    n_best_size: int = field(default=3, metadata={"help": "Spans the reader proposes per passage (the authors: 3)."})
    max_answer_length: int = field(default=30, metadata={"help": "Longest answer, in tokens."})
    max_train_questions: int | None = field(default=None, metadata={"help": "Truncate training questions."})
    max_eval_questions: int | None = field(default=None, metadata={"help": "Truncate evaluation questions."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Needed for zoo checkpoints."})
    cache_dir: str | None = field(default=None,
                                  metadata={"help": "Where the wiki_cloze set behind wiki_open is cached."})
    add_to_model_card: bool = field(default=False, metadata={"help": "Write EM/F1 into the reader's model card."})
    max_nonfinite_steps: int | None = field(default=None, metadata={"help": MAX_NONFINITE_STEPS_HELP})


def window_has_answer(features, cls_token_id: int) -> list[bool]:
    """For each training window: does its answer lie inside it (its start label is not the null position)?"""
    return [start != (ids.index(cls_token_id) if cls_token_id in ids else 0)
            for start, ids in zip(features["start_positions"], features["input_ids"])]


def selector_windows(features, cls_token_id: int):
    """Training windows with the selector's label (1: the window holds an answer) instead of span positions."""
    features["labels"] = [int(holds) for holds in window_has_answer(features, cls_token_id)]
    del features["start_positions"], features["end_positions"]
    return features


def combine(pairs, selector_scores: dict[str, float], nbest: dict[str, list], normalize) -> dict[str, dict]:
    """Per question: sum_i P(p_i | q, P) P(a | q, p_i) over normalised answer text; the best answer with the text it
    was first written as. `selector_scores`: the probability that passage `qid|i` holds an answer."""
    passages_of = collections.defaultdict(list)
    for pair_id, question_id in zip(pairs["id"], pairs["question_id"]):
        passages_of[question_id].append(pair_id)
    answers = {}
    for question_id, pair_ids in passages_of.items():
        total = sum(selector_scores[p] for p in pair_ids) or 1.0
        scores, surface = collections.defaultdict(float), {}
        for pair_id in pair_ids:
            for candidate in nbest.get(pair_id, []):
                key = normalize(candidate["text"])
                if not key:
                    continue
                scores[key] += selector_scores[pair_id] / total * candidate["probability"]
                surface.setdefault(key, candidate["text"])
        best = max(scores, key=scores.get) if scores else ""
        answers[question_id] = {"text": surface.get(best, ""), "score": scores.get(best, 0.0),
                                "passage_probabilities": {p: selector_scores[p] / total for p in pair_ids}}
    return answers


def main(argv=None) -> dict:
    from encoder_zoo.glue.run_glue import RunInterrupted

    saved: dict[str, str] = {}  # model -> folder, as each is saved: what a Ctrl-C leaves
    try:
        return run(argv, saved)
    except KeyboardInterrupt:
        if not saved:
            raise RunInterrupted("interrupted (Ctrl-C) before a model was saved (each is saved when its training "
                                 "ends): nothing was saved. Run the same command again to start over.") from None
        reuse = " ".join(f"--{name}_model {folder}" for name, folder in saved.items())
        raise RunInterrupted(f"interrupted (Ctrl-C). Saved: the trained {' and '.join(saved)} "
                             f"({', '.join(saved.values())}). To go on without training "
                             f"{'them' if len(saved) > 1 else 'it'} again, run the same command with {reuse} and "
                             "another --output_dir; the same command alone starts over.") from None


def references(questions) -> list[dict]:
    """The SQuAD metric's references: every gold answer string of each question (never the letters of one string)."""
    golds = [[answers] if isinstance(answers, str) else list(answers) for answers in questions["answers"]]
    return [{"id": q, "answers": {"text": texts, "answer_start": [0] * len(texts)}}
            for q, texts in zip(questions["id"], golds)]


def run(argv, saved: dict) -> dict:
    import evaluate
    import numpy as np
    from transformers import (
        AutoConfig,
        AutoModelForQuestionAnswering,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        set_seed,
    )

    from encoder_zoo.glue.run_glue import check_max_seq_length
    from encoder_zoo.qa.open_data import check_unique_ids, load_open_qa, passage_pairs
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
    parser = HfArgumentParser((OpenQAArguments, TrainingArguments), description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    args, training_args = parser.parse_args_into_dataclasses(args=OPEN_QA_DEFAULTS + argv)
    pin_memory_only_with_an_accelerator(training_args)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    room = args.max_seq_length - args.max_question_length - 3
    if args.doc_stride >= room:
        raise ValueError(f"--doc_stride {args.doc_stride} leaves no new passage text per window: it must be below "
                         f"--max_seq_length - --max_question_length - 3 = {room}.")
    hold_run_folder(Path(training_args.output_dir), training_args)  # one run per output folder
    raw = load_open_qa(None if (args.train_file or args.validation_file) else args.dataset, args.train_file,
                       args.validation_file, cache_dir=args.cache_dir, num_passages=args.num_passages,
                       wiki_articles=args.wiki_articles)
    for split, questions in raw.items():
        source = {"train": args.train_file, "validation": args.validation_file}.get(split) or f"{args.dataset} {split}"
        check_unique_ids(questions, source)
        if not len(questions):
            raise ValueError(f"{source} has no {split} questions.")
    for split, limit in (("train", args.max_train_questions), ("validation", args.max_eval_questions)):
        if limit and split in raw:
            raw[split] = raw[split].select(range(min(limit, len(raw[split]))))
    pairs = {split: passage_pairs(questions) for split, questions in raw.items()}

    remote = args.trust_remote_code
    for flag in ("model_name_or_path", "selector_model", "reader_model"):
        if getattr(args, flag):
            check_model_path(getattr(args, flag), f"--{flag}")
    tokenizer = load_pretrained(AutoTokenizer, args.model_name_or_path, trust_remote_code=remote)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("Passage windows need a fast tokenizer (offset mappings).")
    config = load_pretrained(AutoConfig, args.model_name_or_path, trust_remote_code=remote)
    check_max_seq_length(args.max_seq_length, config, tokenizer, args.model_name_or_path)  # as run_glue.py
    extra_inputs = extra_inputs_for(config)
    max_length = args.max_seq_length
    window_args = (tokenizer, max_length, args.doc_stride, args.max_question_length, extra_inputs)
    collator = DataCollatorWithPadding(tokenizer)
    output = Path(training_args.output_dir)
    results = {"model": args.model_name_or_path, "dataset": args.train_file or args.dataset}

    def run_args(name):
        return dataclasses.replace(training_args, output_dir=str(output / name))

    selector_path, reader_path = args.selector_model, args.reader_model
    if "train" in pairs:
        with training_args.main_process_first(desc="building training windows"):
            train = pairs["train"]
            selector_features = train.map(
                lambda b: selector_windows(prepare_train_features(b, *window_args), tokenizer.cls_token_id),
                batched=True, remove_columns=train.column_names, desc="Selector windows")
            positives = train.filter(lambda r: len(r["answers"]["text"]) > 0, desc="Passages with an answer")
            reader_features = positives.map(lambda b: prepare_train_features(b, *window_args), batched=True,
                                            remove_columns=positives.column_names, desc="Reader windows")
            reader_features = reader_features.filter(lambda b: window_has_answer(b, tokenizer.cls_token_id),
                                                     batched=True, desc="Windows that hold the answer")
        results["train"] = {"questions": len(raw["train"]), "passages": len(train),
                            "passages_with_answer": len(positives), "selector_windows": len(selector_features),
                            "selector_positive_windows": int(np.sum(selector_features["labels"])),
                            "reader_windows": len(reader_features)}
        if selector_path is None:
            set_seed(training_args.seed)  # the new classification head: the same for the same --seed
            selector = load_pretrained(AutoModelForSequenceClassification, args.model_name_or_path, num_labels=2,
                                       ignore_mismatched_sizes=True, trust_remote_code=remote)
            trainer = FineTuningTrainer(model=selector, args=run_args("selector"), train_dataset=selector_features,
                                        processing_class=tokenizer, data_collator=collator,
                                        max_nonfinite_steps=args.max_nonfinite_steps)
            results["selector_train"] = trainer.train().metrics
            trainer.save_model()
            selector_path = saved["selector"] = str(output / "selector")
        if reader_path is None:
            set_seed(training_args.seed)  # the new QA head: the same for the same --seed
            reader = load_pretrained(AutoModelForQuestionAnswering, args.model_name_or_path, trust_remote_code=remote)
            trainer = FineTuningTrainer(model=reader, args=run_args("reader"), train_dataset=reader_features,
                                        processing_class=tokenizer, data_collator=collator,
                                        max_nonfinite_steps=args.max_nonfinite_steps)
            results["reader_train"] = trainer.train().metrics
            trainer.save_model()
            reader_path = saved["reader"] = str(output / "reader")
    if "validation" in pairs:
        if selector_path is None or reader_path is None:
            raise ValueError("Evaluation needs a selector and a reader: give --train_file (or a dataset with a train "
                             "split), or --selector_model and --reader_model.")
        validation = pairs["validation"]
        with training_args.main_process_first(desc="building validation windows"):
            features = validation.map(lambda b: prepare_validation_features(b, *window_args), batched=True,
                                      remove_columns=validation.column_names, desc="Validation windows")
        model_inputs = features.remove_columns(["example_id", "offset_mapping"])
        selector = load_pretrained(AutoModelForSequenceClassification, selector_path, "--selector_model",
                                   trust_remote_code=remote)
        logits = FineTuningTrainer(model=selector, args=run_args("selector"), processing_class=tokenizer,
                                   data_collator=collator).predict(model_inputs).predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        probabilities = np.exp(logits - logits.max(-1, keepdims=True))
        probabilities = probabilities[:, 1] / probabilities.sum(-1)
        selector_scores = collections.defaultdict(float)
        for pair_id, probability in zip(features["example_id"], probabilities.tolist()):
            selector_scores[pair_id] = max(selector_scores[pair_id], probability)  # a passage's best window
        reader = load_pretrained(AutoModelForQuestionAnswering, reader_path, "--reader_model", trust_remote_code=remote)
        start_logits, end_logits = FineTuningTrainer(model=reader, args=run_args("reader"), processing_class=tokenizer,
                                                     data_collator=collator).predict(model_inputs).predictions[:2]
        _, nbest, _ = postprocess_predictions(validation, features, start_logits, end_logits, args.n_best_size,
                                              args.max_answer_length)
        metric = evaluate.load(METRIC_MODULE, "v1")
        normalize = inspect.getmodule(type(metric)).normalize_answer  # the official SQuAD normalisation
        answers = combine(validation, selector_scores, nbest, normalize)
        questions = raw["validation"]
        predictions = [{"id": q, "prediction_text": answers.get(q, {"text": ""})["text"]} for q in questions["id"]]
        results["eval"] = metric.compute(predictions=predictions, references=references(questions))
        positive = {p for p, a in zip(validation["id"], validation["answers"]) if a["text"]}
        top = [max(answers[q]["passage_probabilities"], key=answers[q]["passage_probabilities"].get)
               for q in questions["id"] if q in answers]
        results["eval"]["selector_top1_holds_answer"] = 100.0 * sum(p in positive for p in top) / max(len(top), 1)
        results["eval"]["questions_with_an_answer_passage"] = (100.0 * len({p.split("|")[0] for p in positive})
                                                               / max(len(questions), 1))
        if training_args.process_index == 0:
            output.mkdir(parents=True, exist_ok=True)
            (output / "predictions.json").write_text(json.dumps({q: a["text"] for q, a in answers.items()}, indent=1))
    if training_args.process_index == 0:
        output.mkdir(parents=True, exist_ok=True)
        (output / "open_qa_results.json").write_text(json.dumps(results, indent=2, default=str))
        logger.info("Open-domain QA results: %s", results.get("eval"))
        if args.add_to_model_card and "eval" in results and reader_path:
            from encoder_zoo.hub_cards import add_eval_results
            from encoder_zoo.qa.open_data import HUB_OPEN

            local = args.validation_file or args.train_file
            if local:  # ids of their own (huggingface_hub groups results by dataset type), no local path
                identity = dict(dataset_type=f"local:{Path(local).stem}", dataset_name=Path(local).name)
            elif args.dataset in HUB_OPEN:
                identity = dict(dataset_type=HUB_OPEN[args.dataset][0], dataset_config=HUB_OPEN[args.dataset][1],
                                dataset_name=args.dataset)
            else:
                identity = dict(dataset_type=f"encoder-zoo:{args.dataset}",
                                dataset_name=f"{args.dataset} (embedded in encoder-zoo)")
            add_eval_results(reader_path, task_type="question-answering", task_name="open-domain QA", **identity,
                             dataset_split="validation", seeds=[training_args.seed],
                             metrics={k: results["eval"][k] for k in ("exact_match", "f1")})
    release(output)
    return results


def cli() -> None:
    from encoder_zoo.glue.run_glue import RunInterrupted
    from encoder_zoo.training.run import TrainingDiverged

    try:
        main()
    except TrainingDiverged as error:
        print(f"run_open_qa.py: {error}", file=sys.stderr)
        raise SystemExit(error.exit_code) from None
    except (ValueError, OSError) as error:
        print(f"run_open_qa.py: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except RunInterrupted as error:
        print(f"run_open_qa.py: {error}", file=sys.stderr)
        raise SystemExit(error.exit_code) from None
    except KeyboardInterrupt:  # while Python was still importing: nothing was written
        print("run_open_qa.py: interrupted (Ctrl-C) before anything was saved. Run the same command again.",
              file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    cli()
