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

import collections
import dataclasses
import inspect
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from transformers import TrainingArguments

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
    """Train the selector and the reader, and evaluate (`run`). A Ctrl-C ends in `RunInterrupted`, whose message
    says what was saved."""
    saved: dict[str, str] = {}  # model -> folder, as each is saved: what a Ctrl-C leaves
    try:
        return run(argv, saved)
    except KeyboardInterrupt:
        raise interruption(saved) from None


def interruption(saved: dict[str, str]):
    """The stop a Ctrl-C ends in: the models saved, and how to go on without training them again."""
    from encoder_zoo.training.run import RunInterrupted

    if not saved:
        return RunInterrupted("interrupted (Ctrl-C) before a model was saved (each is saved when its training "
                              "ends): nothing was saved. Run the same command again to start over.")
    reuse = " ".join(f"--{name}_model {folder}" for name, folder in saved.items())
    return RunInterrupted(f"interrupted (Ctrl-C). Saved: the trained {' and '.join(saved)} "
                          f"({', '.join(saved.values())}). To go on without training "
                          f"{'them' if len(saved) > 1 else 'it'} again, run the same command with {reuse} and "
                          "another --output_dir; the same command alone starts over.")


def references(questions) -> list[dict]:
    """The SQuAD metric's references: every gold answer string of each question (never the letters of one string)."""
    golds = [[answers] if isinstance(answers, str) else list(answers) for answers in questions["answers"]]
    return [{"id": q, "answers": {"text": texts, "answer_start": [0] * len(texts)}}
            for q, texts in zip(questions["id"], golds)]


def run(argv, saved: dict) -> dict:
    """Every check (flags, data, models, length) before the first training step; then train the models not given,
    evaluate, write."""
    from encoder_zoo.qa.open_data import passage_pairs
    from encoder_zoo.qa.processing import check_doc_stride
    from encoder_zoo.training.run import hold_run_folder, parse_fine_tuning_args, release

    args, training_args = parse_fine_tuning_args(OpenQAArguments, OPEN_QA_DEFAULTS, argv, __doc__)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    check_doc_stride(args, "passage text")
    output = Path(training_args.output_dir)
    hold_run_folder(output, training_args)  # one run per output folder
    raw = read_questions(args)
    pairs = {split: passage_pairs(questions) for split, questions in raw.items()}
    setup = OpenQASetup(args, training_args, *load_encoder(args))
    results = {"model": args.model_name_or_path, "dataset": args.train_file or args.dataset}
    paths = {"selector": args.selector_model, "reader": args.reader_model}
    if "train" in pairs:
        features, results["train"] = training_windows(setup, raw["train"], pairs["train"])
        for name in ("selector", "reader"):
            if paths[name] is None:
                results[f"{name}_train"] = train_model(setup, name, features[name])
                paths[name] = saved[name] = str(output / name)
    if "validation" in pairs:
        if None in paths.values():
            raise ValueError("Evaluation needs a selector and a reader: give --train_file (or a dataset with a train "
                             "split), or --selector_model and --reader_model.")
        results["eval"] = evaluate_answers(setup, raw["validation"], pairs["validation"], paths)
    if training_args.process_index == 0:
        write_results(results, args, paths["reader"], training_args.seed, output)
    release(output)
    return results


@dataclass
class OpenQASetup:
    """What every step after loading shares: the flags, the tokenizer and how it cuts windows."""

    args: OpenQAArguments
    training_args: TrainingArguments
    tokenizer: object
    extra_inputs: object  # inputs the model needs beyond the tokenizer's, or None

    def window_args(self) -> tuple:
        """`prepare_train_features`'s and `prepare_validation_features`' arguments after the examples."""
        return (self.tokenizer, self.args.max_seq_length, self.args.doc_stride, self.args.max_question_length,
                self.extra_inputs)

    def model_args(self, name: str) -> TrainingArguments:
        """The training arguments of one model, saved into OUTPUT_DIR/<name>."""
        return dataclasses.replace(self.training_args, output_dir=str(Path(self.training_args.output_dir) / name))

    def trainer(self, model, name: str, **kwargs):
        from transformers import DataCollatorWithPadding

        from encoder_zoo.training.run import FineTuningTrainer

        return FineTuningTrainer(model=model, args=self.model_args(name), processing_class=self.tokenizer,
                                 data_collator=DataCollatorWithPadding(self.tokenizer), **kwargs)


def read_questions(args: OpenQAArguments) -> dict:
    """The dataset's or the files' splits, each checked for repeated ids and for questions at all, then cut to
    --max_train_questions/--max_eval_questions."""
    from encoder_zoo.qa.open_data import check_unique_ids, load_open_qa

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
    return raw


def load_encoder(args: OpenQAArguments):
    """Every model path checked, the fast tokenizer, --max_seq_length checked against what the encoder can read, and
    the inputs it needs beyond the tokenizer's."""
    from transformers import AutoConfig, AutoTokenizer

    from encoder_zoo.glue.run_glue import check_max_seq_length
    from encoder_zoo.training.run import check_model_path, extra_inputs_for, load_pretrained

    remote = args.trust_remote_code
    for flag in ("model_name_or_path", "selector_model", "reader_model"):
        if getattr(args, flag):
            check_model_path(getattr(args, flag), f"--{flag}")
    tokenizer = load_pretrained(AutoTokenizer, args.model_name_or_path, trust_remote_code=remote)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("Passage windows need a fast tokenizer (offset mappings).")
    config = load_pretrained(AutoConfig, args.model_name_or_path, trust_remote_code=remote)
    check_max_seq_length(args.max_seq_length, config, tokenizer, args.model_name_or_path)  # as run_glue.py
    return tokenizer, extra_inputs_for(config)


def training_windows(setup: OpenQASetup, questions, train) -> tuple[dict, dict]:
    """The selector's windows (every passage's, labelled by whether they hold an answer) and the reader's (the
    windows of answer-bearing passages that hold the answer), with their counts."""
    import numpy as np

    from encoder_zoo.qa.processing import prepare_train_features

    window_args, cls_token_id = setup.window_args(), setup.tokenizer.cls_token_id
    with setup.training_args.main_process_first(desc="building training windows"):
        selector_features = train.map(
            lambda b: selector_windows(prepare_train_features(b, *window_args), cls_token_id),
            batched=True, remove_columns=train.column_names, desc="Selector windows")
        positives = train.filter(lambda r: len(r["answers"]["text"]) > 0, desc="Passages with an answer")
        reader_features = positives.map(lambda b: prepare_train_features(b, *window_args), batched=True,
                                        remove_columns=positives.column_names, desc="Reader windows")
        reader_features = reader_features.filter(lambda b: window_has_answer(b, cls_token_id),
                                                 batched=True, desc="Windows that hold the answer")
    counts = {"questions": len(questions), "passages": len(train), "passages_with_answer": len(positives),
              "selector_windows": len(selector_features),
              "selector_positive_windows": int(np.sum(selector_features["labels"])),
              "reader_windows": len(reader_features)}
    return {"selector": selector_features, "reader": reader_features}, counts


def train_model(setup: OpenQASetup, name: str, features) -> dict:
    """Train the selector (a 2-class sequence classifier) or the reader (a span extractor) from the encoder, save it
    into OUTPUT_DIR/<name>; its training metrics."""
    from transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification, set_seed

    from encoder_zoo.training.run import load_pretrained

    set_seed(setup.training_args.seed)  # the new head: the same for the same --seed
    if name == "selector":
        model = load_pretrained(AutoModelForSequenceClassification, setup.args.model_name_or_path, num_labels=2,
                                ignore_mismatched_sizes=True, trust_remote_code=setup.args.trust_remote_code)
    else:
        model = load_pretrained(AutoModelForQuestionAnswering, setup.args.model_name_or_path,
                                trust_remote_code=setup.args.trust_remote_code)
    trainer = setup.trainer(model, name, train_dataset=features, max_nonfinite_steps=setup.args.max_nonfinite_steps)
    metrics = trainer.train().metrics
    trainer.save_model()
    return metrics


def evaluate_answers(setup: OpenQASetup, questions, validation, paths: dict[str, str]) -> dict:
    """Score the combined answers with SQuAD v1.1 EM/F1 against every gold answer, with how often the selector's top
    passage holds an answer; write predictions.json."""
    import evaluate

    from encoder_zoo.qa.processing import prepare_validation_features

    window_args = setup.window_args()
    with setup.training_args.main_process_first(desc="building validation windows"):
        features = validation.map(lambda b: prepare_validation_features(b, *window_args), batched=True,
                                  remove_columns=validation.column_names, desc="Validation windows")
    model_inputs = features.remove_columns(["example_id", "offset_mapping"])
    selector_scores = passage_probabilities(setup, paths["selector"], features, model_inputs)
    nbest = reader_spans(setup, paths["reader"], validation, features, model_inputs)
    metric = evaluate.load(METRIC_MODULE, "v1")
    normalize = inspect.getmodule(type(metric)).normalize_answer  # the official SQuAD normalisation
    answers = combine(validation, selector_scores, nbest, normalize)
    predictions = [{"id": q, "prediction_text": answers.get(q, {"text": ""})["text"]} for q in questions["id"]]
    scores = metric.compute(predictions=predictions, references=references(questions))
    positive = {p for p, a in zip(validation["id"], validation["answers"]) if a["text"]}
    top = [max(answers[q]["passage_probabilities"], key=answers[q]["passage_probabilities"].get)
           for q in questions["id"] if q in answers]
    scores["selector_top1_holds_answer"] = 100.0 * sum(p in positive for p in top) / max(len(top), 1)
    scores["questions_with_an_answer_passage"] = (100.0 * len({p.split("|")[0] for p in positive})
                                                  / max(len(questions), 1))
    if setup.training_args.process_index == 0:
        output = Path(setup.training_args.output_dir)
        output.mkdir(parents=True, exist_ok=True)
        (output / "predictions.json").write_text(json.dumps({q: a["text"] for q, a in answers.items()}, indent=1))
    return scores


def passage_probabilities(setup: OpenQASetup, selector_path: str, features, model_inputs) -> dict[str, float]:
    """P(passage holds an answer) per `qid|i` passage: the selector's probability of its best window."""
    import numpy as np
    from transformers import AutoModelForSequenceClassification

    from encoder_zoo.training.run import load_pretrained

    selector = load_pretrained(AutoModelForSequenceClassification, selector_path, "--selector_model",
                               trust_remote_code=setup.args.trust_remote_code)
    logits = setup.trainer(selector, "selector").predict(model_inputs).predictions
    logits = logits[0] if isinstance(logits, tuple) else logits
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities = probabilities[:, 1] / probabilities.sum(-1)
    scores = collections.defaultdict(float)
    for pair_id, probability in zip(features["example_id"], probabilities.tolist()):
        scores[pair_id] = max(scores[pair_id], probability)  # a passage's best window
    return scores


def reader_spans(setup: OpenQASetup, reader_path: str, validation, features, model_inputs) -> dict[str, list]:
    """The reader's --n_best_size spans per passage, each with its probability P(a | q, p_i)."""
    from transformers import AutoModelForQuestionAnswering

    from encoder_zoo.qa.processing import postprocess_predictions
    from encoder_zoo.training.run import load_pretrained

    reader = load_pretrained(AutoModelForQuestionAnswering, reader_path, "--reader_model",
                             trust_remote_code=setup.args.trust_remote_code)
    start_logits, end_logits = setup.trainer(reader, "reader").predict(model_inputs).predictions[:2]
    _, nbest, _ = postprocess_predictions(validation, features, start_logits, end_logits, setup.args.n_best_size,
                                          setup.args.max_answer_length)
    return nbest


def write_results(results: dict, args: OpenQAArguments, reader_path: str | None, seed: int, output: Path) -> None:
    """open_qa_results.json, and EM/F1 in the reader's model card with --add_to_model_card."""
    output.mkdir(parents=True, exist_ok=True)
    (output / "open_qa_results.json").write_text(json.dumps(results, indent=2, default=str))
    logger.info("Open-domain QA results: %s", results.get("eval"))
    if args.add_to_model_card and "eval" in results and reader_path:
        from encoder_zoo.hub_cards import add_eval_results
        from encoder_zoo.qa.data import card_dataset
        from encoder_zoo.qa.open_data import HUB_OPEN

        add_eval_results(reader_path, task_type="question-answering", task_name="open-domain QA",
                         **card_dataset(args.dataset, args.validation_file or args.train_file, HUB_OPEN),
                         dataset_split="validation", seeds=[seed],
                         metrics={k: results["eval"][k] for k in ("exact_match", "f1")})


def cli() -> None:
    from encoder_zoo.training.run import RunInterrupted, TrainingDiverged, run_cli

    run_cli(main, "run_open_qa.py", stops=(TrainingDiverged, RunInterrupted),
            interrupted="interrupted (Ctrl-C) before anything was saved. Run the same command again.")


if __name__ == "__main__":
    cli()
