"""Fine-tune any zoo model or transformers encoder on GLUE tasks with Trainer, as the papers report them.

    python glue/run_glue.py --model_name_or_path PATH_OR_ID --task_name sst2 --output_dir runs/glue [--seeds 1 2 3 4 5]
    python glue/run_glue.py --model_name_or_path runs/demo/export --trust_remote_code --task_name rotten_tomatoes ...
    accelerate launch --multi_gpu glue/run_glue.py ...          # several GPUs

Tasks: cola sst2 mrpc qqp stsb mnli qnli rte wnli (Hub GLUE when online, or --data_dir with the original GLUE TSV
layout), the embedded offline tasks rotten_tomatoes (SST-2 schema) and movie_sentiment_regression (STS-B-style
regression), or custom data: --train_file/--validation_file (csv/tsv/json/jsonl) with --text_columns/--label_column.
Several --task_name values run one after the other and report the GLUE average (WNLI excluded by default).
--seeds runs every task once per seed and reports each run and the median. Every Trainer flag works.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from transformers import TrainingArguments

from encoder_zoo.glue.tacred import TACRED_MODES
from encoder_zoo.training.recipes import FineTuningPreset, glue_presets
from encoder_zoo.training.run import MAX_NONFINITE_STEPS_HELP, RunInterrupted, stop_on_sigterm, stopped_by

logger = logging.getLogger("run_glue")

GLUE_DEFAULTS = [
    "--learning_rate", "2e-5", "--per_device_train_batch_size", "32", "--per_device_eval_batch_size", "64",
    "--num_train_epochs", "3", "--warmup_steps", "0.1", "--weight_decay", "0.01", "--save_strategy", "no",
    "--eval_strategy", "no", "--logging_steps", "50", "--report_to", "none",
]
# Fine-tuning recipes from the papers' appendices, and the authors' fine-tuning code where they are silent (the
# flags a user passes still win), each declared by its family beside its recipes (`FAMILY.glue_presets` in
# training/recipes/<family>.py). Trainer's AdamW exempts biases and LayerNorm weights from weight decay, as every one
# of these codebases does.
PRESETS: dict[str, FineTuningPreset] = glue_presets()
NO_PRESET = FineTuningPreset(flags=[])
METRIC_MODULE = str(Path(__file__).resolve().parent / "metrics" / "glue_zoo")


@dataclass
class GlueArguments:
    model_name_or_path: str = field(metadata={"help": "A checkpoint folder or Hub id (any encoder, or a zoo export)."})
    task_name: list[str] = field(
        default_factory=lambda: ["rotten_tomatoes"],
        metadata={"help": "One or more of cola sst2 mrpc qqp stsb mnli qnli rte wnli rotten_tomatoes "
                  "movie_sentiment_regression tacred, or 'custom' with --train_file/--validation_file."},
    )
    data_dir: str | None = field(default=None,
                                 metadata={"help": "Original GLUE TSV distribution root (e.g. glue_data/)."})
    train_file: str | None = field(default=None,
                                   metadata={"help": "Custom/local training file (csv, tsv, json, jsonl)."})
    validation_file: str | None = field(default=None, metadata={"help": "Custom/local validation file."})
    text_columns: list[str] | None = field(default=None, metadata={"help": "One or two text columns of custom data."})
    label_column: str = field(default="label", metadata={"help": "Label column of custom data."})
    tacred_mode: str = field(default="ner", metadata={
        "help": "How --task_name tacred marks its two entities (as the SpanBERT authors' run_tacred.py --feature_mode "
                "does): " + "; ".join(f"{name}: {what}" for name, what in TACRED_MODES.items()) + "."})
    max_seq_length: int = field(default=128, metadata={"help": "Longer inputs are truncated."})
    seeds: list[int] | None = field(default=None,
                                    metadata={"help": "Run each task once per seed; report each and the median."})
    preset: str | None = field(default=None, metadata={
        "help": f"Paper hyperparameters: {', '.join(PRESETS)}."
        + "".join(f" {name}: {preset.note}" for name, preset in PRESETS.items() if preset.note)})
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Comma-separated model config fields set when the model is loaded, on top of the preset's, "
                  "e.g. 'hidden_dropout_prob=0.0,classifier_dropout=0.1'."},
    )
    trust_remote_code: bool = field(default=False,
                                    metadata={"help": "Needed for zoo checkpoints (their code travels with them)."})
    ignore_mismatched_sizes: bool = field(default=False,
                                          metadata={"help": "Re-initialise a classifier of another label count."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Truncate training data (quick runs)."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Truncate each validation split."})
    include_wnli_in_average: bool = field(default=False,
                                          metadata={"help": "The papers exclude WNLI from the GLUE average."})
    add_to_model_card: bool = field(default=False, metadata={"help": "Write each seed's results (percent) into the "
                                    "model-index of OUTPUT_DIR/<task>/seed-N/README.md, and the median into "
                                    "--model_card_dir if given. Runs cut down with "
                                    "--max_train_samples/--max_eval_samples are left out."})
    model_card_dir: str | None = field(default=None, metadata={"help": "Another card to receive the results (e.g. the "
                                                                       "pretrained export)."})
    early_stopping_patience: int | None = field(
        default=None,
        metadata={"help": "Stop a run after this many evaluations without a better development score (Trainer's "
                  "EarlyStoppingCallback) and load its best checkpoint. Implies --load_best_model_at_end: evaluates "
                  "and saves every epoch unless --eval_strategy/--save_strategy say otherwise, selects on the task's "
                  "score (the mean of its metrics, `eval_score`) unless --metric_for_best_model says otherwise, and "
                  "removes the checkpoints it made once the best model is saved (pass --save_strategy to keep them)."},
    )
    max_nonfinite_steps: int | None = field(default=None, metadata={"help": MAX_NONFINITE_STEPS_HELP})
    weight_decay_type: Literal["decoupled", "l2"] = field(
        default="decoupled",
        metadata={"help": "decoupled: --weight_decay is AdamW's decoupled decay (--optim). l2: --weight_decay is an L2 "
                  "penalty added to the gradient before Adam normalises it (torch.optim.Adam with --adam_beta1/2 and "
                  "--adam_epsilon; biases and LayerNorm still exempt)."},
    )


def task_score(metrics: dict[str, float]) -> float:
    """A task's GLUE score: the mean of its reported metrics (e.g. MRPC F1 and accuracy; MNLI matched and
    mismatched)."""
    return statistics.mean(metrics.values())


def glue_average(per_task: dict[str, dict[str, float]], include_wnli: bool = False) -> float | None:
    """The GLUE average over the GLUE tasks that were run, WNLI excluded unless asked (as the papers do)."""
    from encoder_zoo.glue.tasks import GLUE_TASKS

    scores = [task_score(m) for t, m in per_task.items() if t in GLUE_TASKS and (include_wnli or t != "wnli")]
    return statistics.mean(scores) if scores else None


def metric_config(task) -> str:
    """The glue_zoo metric configuration of a task; custom data and a plugin's task are scored by their label kind."""
    from encoder_zoo.glue.tasks import BUILT_IN_TASKS

    if task.name in BUILT_IN_TASKS:
        return task.name
    return "regression" if task.is_regression else "binary" if task.num_labels == 2 else "accuracy"


def parse_args(argv=None) -> tuple[GlueArguments, TrainingArguments, list[str]]:
    """The flags on top of GLUE_DEFAULTS and the --preset's; with the user's flags, which win over both."""
    from encoder_zoo.training.run import parse_fine_tuning_args

    argv = list(sys.argv[1:] if argv is None else argv)
    defaults = GLUE_DEFAULTS + PRESETS.get(preset_named(argv), NO_PRESET).flags
    args, training_args = parse_fine_tuning_args(GlueArguments, defaults, argv, __doc__)
    return args, training_args, argv


def preset_named(argv: list[str]) -> str | None:
    """The --preset the command line names (None: none), checked before the flags are parsed: its flags are the
    defaults the user's own flags are parsed on top of."""
    if "--preset" not in argv:
        return None
    position = argv.index("--preset") + 1
    if position == len(argv) or argv[position].startswith("--"):
        raise ValueError(f"--preset needs a value: one of {', '.join(PRESETS)}.")
    preset = argv[position]
    if preset not in PRESETS:
        raise ValueError(f"Unknown --preset {preset!r}; choose one of {', '.join(PRESETS)}.")
    return preset


def model_config_overrides(args: GlueArguments) -> dict:
    """The preset's config values and the user's --config_overrides, checked against the model's config."""
    from transformers import AutoConfig

    from encoder_zoo.training.run import parse_overrides

    preset_config = PRESETS.get(args.preset, NO_PRESET).config
    overrides = {**preset_config, **parse_overrides(args.config_overrides)}
    if overrides:
        config = AutoConfig.from_pretrained(args.model_name_or_path, trust_remote_code=args.trust_remote_code)
        unknown = [key for key in overrides if not hasattr(config, key)]
        if unknown:
            source = f"--preset {args.preset}" if set(unknown) <= set(preset_config) else "--config_overrides"
            raise ValueError(f"{source}: {type(config).__name__} has no field {', '.join(map(repr, unknown))}.")
    return overrides


def position_limit(config, tokenizer) -> tuple[int | None, str]:
    """The most tokens the model can read, and where that number comes from: its position embeddings (the smallest
    of the config's and, for HIRE or BERTAC, the encoder's; RoBERTa-style positions start after the padding id), or
    the tokenizer's `model_max_length` for a model without a position table."""
    limits = []
    for part in (config, getattr(config, "backbone_config", None)):
        positions = getattr(part, "max_position_embeddings", None) if part is not None else None
        if isinstance(positions, int) and positions > 0:
            model_type = getattr(part, "model_type", "") or ""
            offset = (getattr(part, "pad_token_id", None) or 0) + 1 if "roberta" in model_type or model_type in (
                "camembert", "longformer", "data2vec-text", "xmod") else 0
            limits.append((positions - offset, f"{model_type or 'its'} position embeddings, max_position_embeddings "
                           f"{positions}" + (f" less {offset} for the padding offset" if offset else "")))
    if limits:
        return min(limits)
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < 1_000_000:  # transformers' "no limit" is 1e30
        return declared, "its tokenizer's model_max_length"
    return None, ""


def check_max_seq_length(max_seq_length: int, config, tokenizer, model: str, flag: str = "--max_seq_length") -> None:
    """Refuse a `--max_seq_length` the model cannot read (it would fail at the first long batch, deep in the forward
    pass), naming the flag and the model's limit."""
    if max_seq_length < 1:
        raise ValueError(f"{flag} {max_seq_length}: pass a positive number of tokens.")
    limit, source = position_limit(config, tokenizer)
    if limit is not None and max_seq_length > limit:
        raise ValueError(f"{flag} {max_seq_length} is longer than {model} can read: {limit} tokens ({source}). Pass "
                         f"{flag} {limit} or less.")


def prepare_task(task_name: str, args: GlueArguments):
    """A task's data, checked and cut to --max_train_samples/--max_eval_samples: every task is loaded before any
    training, so bad data in the second task stops the command before the first one trains."""
    from encoder_zoo.glue.tasks import first_samples, load_task

    task, raw = load_task(task_name, data_dir=args.data_dir, train_file=args.train_file,
                          validation_file=args.validation_file, text_columns=args.text_columns,
                          label_column=args.label_column, tacred_mode=args.tacred_mode)
    empty = [split for split in ("train", *task.validation_splits) if not len(raw[split])]
    if empty:
        raise ValueError(f"--task_name {task_name}: its {' and '.join(empty)} data has no rows"
                         + (f" (in --data_dir {args.data_dir})" if args.data_dir and not args.train_file else "") + ".")
    return task, first_samples(raw, task, args.max_train_samples, args.max_eval_samples)


def run_task(task_name: str, args: GlueArguments, training_args: TrainingArguments, user_flags: list[str],
             prepared=None, finished: list | None = None) -> dict:
    """Fine-tune one task once per seed. `prepared`: `prepare_task`'s output (loaded here if None). `finished`
    collects (task, seed, folder, metrics) as each run's model is saved, for the message after a Ctrl-C."""
    from transformers import AutoModelForSequenceClassification, set_seed

    from encoder_zoo.training.run import load_pretrained

    task, raw = prepared or prepare_task(task_name, args)
    tokenizer, encoded = tokenize_task(task, raw, args, training_args)
    compute_metrics, fractions = task_metrics(task)
    model_kwargs = model_arguments(task, args)
    config_overrides = model_config_overrides(args)
    selection = selection_arguments(args, training_args, user_flags, PRESETS.get(args.preset, NO_PRESET).flags)
    baseline = bag_of_words_baseline(task, raw) if task.is_regression else {}
    runs = []
    for seed in args.seeds or [training_args.seed]:
        run_args = seed_arguments(task, seed, args, training_args, user_flags, selection)
        set_seed(seed)
        model = load_pretrained(AutoModelForSequenceClassification, args.model_name_or_path, **model_kwargs,
                                **config_overrides)
        if task.new_tokens:  # TACRED's entity markers: new rows in the embeddings
            model.resize_token_embeddings(len(tokenizer))
        trainer = build_trainer(model, tokenizer, encoded, task, compute_metrics, run_args, args, selection)
        run = train_and_evaluate(trainer, encoded, task, fractions, seed, selection)
        runs.append(run)
        if finished is not None:
            finished.append((task.name, seed, run_args.output_dir, run["metrics"]))
        logger.info("%s seed %d: %s", task.name, seed, format_percent(run["metrics"]))
    return task_result(task, raw, runs, baseline)


def tokenize_task(task, raw, args: GlueArguments, training_args: TrainingArguments):
    """The model's tokenizer, and the task's splits tokenized (with the inputs the model needs beyond the
    tokenizer's)."""
    from transformers import AutoConfig, AutoTokenizer

    from encoder_zoo.training.run import extra_inputs_for, load_pretrained

    tokenizer = load_pretrained(AutoTokenizer, args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    if task.new_tokens:  # whole tokens, matched before any lower-casing or splitting
        tokenizer.add_tokens(list(task.new_tokens), special_tokens=True)
    extra_inputs = extra_inputs_for(load_pretrained(AutoConfig, args.model_name_or_path,
                                                    trust_remote_code=args.trust_remote_code))

    def tokenize(batch):
        texts = [batch[column] for column in task.text_columns]
        encoded = tokenizer(*texts, truncation=True, max_length=args.max_seq_length,
                            return_offsets_mapping=extra_inputs is not None)
        if extra_inputs is not None:  # inputs a model needs beyond the tokenizer's (training/run/task_inputs.py)
            encoded.update(extra_inputs(encoded, texts))
            encoded.pop("offset_mapping")
        return encoded

    with training_args.main_process_first(desc="tokenizing"):
        encoded = raw.map(tokenize, batched=True, desc=f"Tokenizing {task.name}")
    return tokenizer, encoded


def task_metrics(task):
    """Trainer's `compute_metrics` for the task (percentages, and `score`, the task's GLUE score, that checkpoint
    selection reads), and the dict that holds its last evaluation's scores as the metric gives them (0-1): what
    glue_results.json records."""
    import evaluate
    import numpy as np

    metric = evaluate.load(METRIC_MODULE, metric_config(task))
    fractions = {}

    def compute_metrics(prediction):
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        predicted = np.squeeze(logits, -1) if task.is_regression else np.argmax(logits, axis=-1)
        result = metric.compute(predictions=predicted, references=prediction.label_ids)
        fractions.clear()
        fractions.update(result)
        # Trainer logs (and checkpoint selection reads) percentages, the scale GLUE's tables print.
        return {**percent(result), "score": 100.0 * task_score({key: result[key] for key in task.metrics})}

    return compute_metrics, fractions


def model_arguments(task, args: GlueArguments) -> dict:
    """`from_pretrained`'s arguments for the task's classifier or regressor: its labels, named when the task names
    them."""
    label_kwargs = {} if task.is_regression else {
        "id2label": dict(enumerate(task.label_names or range(task.num_labels))),
        "label2id": {str(name): i for i, name in enumerate(task.label_names or range(task.num_labels))},
    }
    return dict(num_labels=task.num_labels, trust_remote_code=args.trust_remote_code,
                ignore_mismatched_sizes=args.ignore_mismatched_sizes,
                problem_type="regression" if task.is_regression else "single_label_classification", **label_kwargs)


def seed_arguments(task, seed: int, args: GlueArguments, training_args: TrainingArguments, user_flags: list[str],
                   selection: dict) -> TrainingArguments:
    """One run's TrainingArguments: its seed, its folder OUTPUT_DIR/<task>/seed-N, the preset's epochs for the task
    (unless --num_train_epochs is given) and the checkpoint selection."""
    epochs_override = PRESETS.get(args.preset, NO_PRESET).epochs_by_task.get(task.name)
    return dataclasses.replace(
        training_args, seed=seed, output_dir=str(Path(training_args.output_dir) / task.name / f"seed-{seed}"),
        **({"num_train_epochs": float(epochs_override)}
           if epochs_override and "--num_train_epochs" not in user_flags else {}),
        **selection,
    )


def build_trainer(model, tokenizer, encoded, task, compute_metrics, run_args: TrainingArguments,
                  args: GlueArguments, selection: dict):
    """The run's Trainer: early stopping when asked, L2 through Adam with --weight_decay_type l2."""
    from transformers import DataCollatorWithPadding, EarlyStoppingCallback

    from encoder_zoo.training.run import FineTuningTrainer

    return FineTuningTrainer(model=model, args=run_args, train_dataset=encoded["train"],
                             eval_dataset=encoded[task.validation_splits[0]], processing_class=tokenizer,
                             data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=compute_metrics,
                             callbacks=[EarlyStoppingCallback(args.early_stopping_patience)]
                             if selection and args.early_stopping_patience is not None else None,
                             optimizer_cls_and_kwargs=l2_adam(run_args) if args.weight_decay_type == "l2" else None,
                             max_nonfinite_steps=args.max_nonfinite_steps)


def train_and_evaluate(trainer, encoded, task, fractions: dict, seed: int, selection: dict) -> dict:
    """Train, score every validation split and save the model; with checkpoint selection, the best step kept and
    the checkpoints removed."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    trainer.train()
    metrics = {}
    for split in task.validation_splits:
        trainer.evaluate(encoded[split], metric_key_prefix="eval")
        for key in (*task.metrics, *task.extra_metrics):
            metrics[split_metric(key, split)] = fractions[key]
    trainer.save_model()
    run = {"seed": seed, "metrics": metrics}
    if selection:  # the best checkpoint was loaded: which one, and where training stopped
        run.update(best_step=trainer.state.best_global_step, trained_steps=trainer.state.global_step)
        if selection.get("save_strategy") and trainer.is_world_process_zero():
            for checkpoint in Path(trainer.args.output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
                shutil.rmtree(checkpoint, ignore_errors=True)
    return run


def task_result(task, raw, runs: list[dict], baseline: dict | None = None) -> dict:
    """A task's runs, their median, and the score to read them against: the majority class's for accuracy, and
    `baseline` (`bag_of_words_baseline`'s, for regression) as it is."""
    from encoder_zoo.glue.tasks import majority_class_accuracy

    median = {key: statistics.median(run["metrics"][key] for run in runs) for key in runs[0]["metrics"]}
    result = {"task": task.name, "runs": runs, "median": median, "num_train": len(raw["train"]),
              "validation_splits": list(task.validation_splits)}
    if "accuracy" in task.metrics:  # the score of a classifier that learned nothing, to read the runs against
        result["majority_class"] = {split_metric("accuracy", split): majority_class_accuracy(raw[split]["label"])
                                    for split in task.validation_splits}
    return {**result, **(baseline or {})}


# The bag-of-words baseline fits on at most this many of the training rows (the first): seconds, whatever the data.
BASELINE_TRAIN_ROWS = 20_000


def bag_of_words_baseline(task, raw) -> dict:
    """What a regression task's runs are read against, since a constant answer has no correlation: glue/baselines.py's
    bag-of-words Ridge model fitted on the runs' training rows (the first BASELINE_TRAIN_ROWS) and scored like them on
    every validation split. `bag_of_words`: its scores (0-1); `bag_of_words_model`: what it is. Empty, with a
    warning, where it cannot be fitted or scores no number (texts without a word, constant labels)."""
    import math

    from encoder_zoo.glue.baselines import fit_bag_of_words, score

    train = raw["train"].select(range(min(BASELINE_TRAIN_ROWS, len(raw["train"]))))
    try:
        predict, model = fit_bag_of_words(task, train)
        scores = {}
        for split in task.validation_splits:
            predicted = predict(raw[split])
            for key in task.metrics:
                scores[split_metric(key, split)] = score(key, predicted, raw[split]["label"])
    except ValueError as error:
        logger.warning("%s: no bag-of-words baseline to read the runs against (%s).", task.name, error)
        return {}
    if not all(map(math.isfinite, scores.values())):
        logger.warning("%s: no bag-of-words baseline to read the runs against (it scores %s).", task.name,
                       format_percent(scores))
        return {}
    return {"bag_of_words": scores, "bag_of_words_model": f"{model} on {len(train)} training rows"}


def selection_arguments(args: GlueArguments, training_args: TrainingArguments, user_flags: list[str],
                        preset_flags: list[str] = ()) -> dict:
    """TrainingArguments that keep the best checkpoint on the development set, as papers that report the best epoch
    do (`--early_stopping_patience` or `--load_best_model_at_end`); empty otherwise. The user's and the preset's
    flags win over these defaults; the user's `--eval_strategy no` or `--save_strategy no` turns a preset's selection
    off (the run then reports its last epoch)."""
    if args.early_stopping_patience is None and not training_args.load_best_model_at_end:
        return {}
    if args.early_stopping_patience is not None and args.early_stopping_patience < 1:
        raise ValueError(f"--early_stopping_patience {args.early_stopping_patience}: pass at least 1 evaluation.")
    switched_off = [f"{flag} no" for flag, value in (("--eval_strategy", training_args.eval_strategy),
                                                      ("--save_strategy", training_args.save_strategy))
                    if flag in user_flags and value == "no"]
    if switched_off:
        if {"--early_stopping_patience", "--load_best_model_at_end"} & set(user_flags):
            raise ValueError(f"--early_stopping_patience/--load_best_model_at_end keep the best checkpoint on the "
                             f"development set, which {' and '.join(switched_off)} rules out: drop one or the other.")
        logger.warning("%s: no checkpoint selection; each run reports its last epoch (--preset %s would keep the "
                       "best).", " and ".join(switched_off), args.preset)
        return {}
    given = set(user_flags + list(preset_flags)).__contains__
    selection = {"load_best_model_at_end": True}
    # Evaluation and saving must match: either one the user set decides both, else once per epoch.
    if given("--eval_strategy"):
        strategy, steps = training_args.eval_strategy, training_args.eval_steps
    elif given("--save_strategy"):
        strategy, steps = training_args.save_strategy, training_args.save_steps
    else:
        strategy, steps = "epoch", None
    if not given("--eval_strategy"):
        selection.update(eval_strategy=strategy, eval_steps=steps)
    if not given("--save_strategy"):
        selection.update(save_strategy=strategy, save_steps=steps or training_args.save_steps)
        if not given("--save_total_limit"):
            selection["save_total_limit"] = 1  # the best checkpoint is always kept as well
    if not given("--metric_for_best_model"):
        selection.update(metric_for_best_model="score", greater_is_better=True)
    return selection


def l2_adam(training_args: TrainingArguments) -> tuple:
    """torch.optim.Adam, whose `weight_decay` (Trainer sets it per parameter group from --weight_decay, biases and
    LayerNorm exempt) adds `weight_decay x w` to the gradient before Adam's normalisation: L2 through Adam."""
    import torch

    return torch.optim.Adam, {"lr": training_args.learning_rate, "eps": training_args.adam_epsilon,
                              "betas": (training_args.adam_beta1, training_args.adam_beta2)}


def split_metric(key: str, split: str) -> str:
    """A metric's name for one validation split: `accuracy` on "validation", `accuracy_matched` on MNLI's
    "validation_matched"."""
    return key if split == "validation" else f"{key}_{split.removeprefix('validation_')}"


def markdown_table(results: dict) -> str:
    lines = ["| task | metric | median | runs |", "| --- | --- | --- | --- |"]
    for task, result in results["tasks"].items():
        for key, value in result["median"].items():
            runs = ", ".join(f"{run['metrics'][key]:.1f}" for run in result["runs"])
            lines.append(f"| {task} | {key} | {value:.2f} | {runs} |")
        for key, value in result.get("majority_class", {}).items():
            lines.append(f"| {task} | {key} of always predicting its most frequent label | {value:.2f} | |")
        for key, value in result.get("bag_of_words", {}).items():
            lines.append(f"| {task} | {key} of a bag-of-words ridge model ({result['bag_of_words_model']}) | "
                         f"{value:.2f} | |")
    if results.get("glue_average") is not None:
        lines.append(f"| GLUE average | {'with' if results['include_wnli'] else 'without'} WNLI | "
                     f"{results['glue_average']:.2f} | |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    args, training_args, user_flags = parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    from transformers import AutoConfig, AutoTokenizer

    from encoder_zoo.glue.tasks import CUSTOM, TASKS
    from encoder_zoo.training.run import check_model_path, hold_run_folder, load_pretrained, release

    check_model_path(args.model_name_or_path)
    for name in args.task_name:
        if name not in TASKS and name != CUSTOM:
            raise ValueError(f"Unknown --task_name {name!r}. Choose from {', '.join(TASKS)} or 'custom' with "
                             "--train_file.")
    if (args.train_file or args.validation_file) and len(args.task_name) > 1:
        raise ValueError("--train_file/--validation_file go with a single --task_name.")
    repeated = sorted({seed for seed in args.seeds or [] if args.seeds.count(seed) > 1})
    if repeated:
        raise ValueError(f"--seeds {' '.join(map(str, args.seeds))} names seed {', '.join(map(str, repeated))} more "
                         "than once: each seed is one run (same seed, same run), and the median would count it twice. "
                         "Pass distinct seeds.")
    if args.train_file and args.task_name == ["rotten_tomatoes"] and "--task_name" not in user_flags:
        args.task_name = [CUSTOM]
    hold_run_folder(Path(training_args.output_dir), training_args)  # one run per output folder
    output = Path(training_args.output_dir)
    # Everything that can be checked is checked before the first run trains: every task's data, and the length.
    prepared = {name: prepare_task(name, args) for name in args.task_name}
    tokenizer = load_pretrained(AutoTokenizer, args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    config = load_pretrained(AutoConfig, args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    check_max_seq_length(args.max_seq_length, config, tokenizer, args.model_name_or_path)

    finished = []
    try:
        with stop_on_sigterm():  # a preempted job says what it saved, as a Ctrl-C does
            results = run_tasks(args, training_args, user_flags, prepared, finished)
    except KeyboardInterrupt as stop:
        how, exit_code = stopped_by(stop)
        raise RunInterrupted(interrupted_message(finished, output, training_args, how), exit_code) from None
    release(output)
    return results


def run_tasks(args: GlueArguments, training_args: TrainingArguments, user_flags: list[str], prepared: dict,
              finished: list) -> dict:
    """Every task's runs, then the results files (and cards) in OUTPUT_DIR."""
    output = Path(training_args.output_dir)
    results = {"model": args.model_name_or_path, "tasks": {}}
    for name in args.task_name:
        results["tasks"][name] = run_task(name, args, training_args, user_flags, prepared[name], finished)
    results["glue_average"] = glue_average({t: r["median"] for t, r in results["tasks"].items()},
                                           args.include_wnli_in_average)
    results["include_wnli"] = args.include_wnli_in_average
    results = in_points(results)
    if training_args.process_index == 0:
        output.mkdir(parents=True, exist_ok=True)
        (output / "glue_results.json").write_text(json.dumps(results, indent=2))
        (output / "glue_results.md").write_text(markdown_table(results) + "\n")
        drop_superseded_partial_results(output, results)
        print(markdown_table(results))
        if args.add_to_model_card and (args.max_train_samples or args.max_eval_samples):
            logger.warning("Not writing the model-index: --max_train_samples/--max_eval_samples cut this run down, "
                           "so its scores are not the task's.")
        elif args.add_to_model_card:
            write_model_index(results, output, args.model_card_dir, args.train_file)
    return results


PARTIAL_RESULTS = "glue_results.partial.json"
# What glue_results.json (and its partial copy) hold: every score in percent points, as GLUE's tables print them.
SCORE_SCALE = "points (percent, 0-100)"


def in_points(results: dict) -> dict:
    """`results` (scores as the metrics give them, 0-1) with every score in points: each run's, the medians, the
    baselines' (majority class, bag of words) and the GLUE average, as glue_results.json and main() give them."""
    tasks = {name: {**result, "runs": [{**run, "metrics": percent(run["metrics"])} for run in result["runs"]],
                    "median": percent(result["median"]),
                    **{key: percent(result[key]) for key in ("majority_class", "bag_of_words") if key in result}}
             for name, result in results["tasks"].items()}
    average = results.get("glue_average")
    return {**results, "scale": SCORE_SCALE, "tasks": tasks, "glue_average": None if average is None else 100 * average}


def interrupted_message(finished: list, output: Path, training_args: TrainingArguments, how: str = "Ctrl-C") -> str:
    """What a Ctrl-C (or a SIGTERM: `how`) leaves: the runs that finished (each model saved in its folder, their
    scores written to OUTPUT_DIR/glue_results.partial.json) and how to go on."""
    if not finished:
        return (f"interrupted ({how}) before any run finished: nothing was saved (a run saves its model when it ends). "
                "Run the same command again to start over.")
    if training_args.process_index == 0:
        output.mkdir(parents=True, exist_ok=True)
        partial = [{"task": task, "seed": seed, "metrics": percent(metrics)} for task, seed, _, metrics in finished]
        (output / PARTIAL_RESULTS).write_text(json.dumps({"scale": SCORE_SCALE, "finished_runs": partial}, indent=2))
    runs = ", ".join(f"{task} seed {seed} ({format_percent(metrics)})" for task, seed, _, metrics in finished)
    return (f"interrupted ({how}). Saved: {len(finished)} finished run{'s' if len(finished) > 1 else ''}: {runs}; "
            f"each model in {output}/TASK/seed-N, the scores in {output / PARTIAL_RESULTS}. Running the same command "
            "again starts every run over, those too (rewriting their folders); to keep them, move them aside first, "
            "or run only the missing seeds (--seeds) with another --output_dir.")


def drop_superseded_partial_results(output: Path, results: dict) -> None:
    """Remove an interrupted attempt's partial results once this command's results hold every run they list (the
    same task and seed, run again); partial results of runs not repeated stay."""
    partial = output / PARTIAL_RESULTS
    try:
        runs = json.loads(partial.read_text())["finished_runs"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    done = {(task, run["seed"]) for task, result in results["tasks"].items() for run in result["runs"]}
    if all((run.get("task"), run.get("seed")) in done for run in runs):
        partial.unlink()


def format_percent(metrics: dict[str, float]) -> str:
    """Scores (0-1, as the metrics give them) for logs and messages, in percent as GLUE's tables print them."""
    return ", ".join(f"{key} {100 * value:.2f}" for key, value in metrics.items())


def dataset_identity(task: str, train_file: str | None = None) -> dict[str, str | None]:
    """The model-index's dataset fields. GLUE tasks name the Hub dataset; embedded and local data get an id of their
    own that cannot be mistaken for a Hub id, because huggingface_hub groups (and replaces) results by dataset type."""
    from encoder_zoo.glue.tasks import GLUE_TASKS

    if task in GLUE_TASKS:
        return dict(dataset_type="nyu-mll/glue", dataset_name=f"GLUE {task.upper()}", dataset_config=task)
    if task == "tacred":  # the LDC's, never on the Hub: its own id, whichever of its files was scored
        return dict(dataset_type="local:tacred", dataset_name="TACRED (LDC2018T24)", dataset_config=None)
    if train_file:
        return dict(dataset_type=f"local:{Path(train_file).stem}", dataset_name=Path(train_file).name,
                    dataset_config=None)
    return dict(dataset_type=f"encoder-zoo:{task}", dataset_name=f"{task.replace('_', ' ')} (embedded in encoder-zoo)",
                dataset_config=None)


def percent(metrics: dict[str, float]) -> dict[str, float]:
    return {key: 100.0 * value for key, value in metrics.items()}


def write_model_index(results: dict, output: Path, extra_card_dir: str | None, train_file: str | None = None) -> None:
    """Each seed's card gets that seed's scores; --model_card_dir gets the median over the seeds. Points, as `results`
    holds them (`in_points`). A seed's folder first gets a complete card of its own (`write_seed_card`)."""
    from encoder_zoo.hub_cards import add_eval_results

    base_card = base_card_data(results.get("model"))
    for task, result in results["tasks"].items():
        identity = dataset_identity(task, train_file)
        kwargs = dict(task_type="text-classification", task_name=task, **identity,
                      dataset_split=(result["validation_splits"][0] if len(result["validation_splits"]) == 1
                                     else "validation"))
        for run in result["runs"]:
            folder = output / task / f"seed-{run['seed']}"
            write_seed_card(folder, results.get("model"), base_card, task, run["seed"], identity["dataset_name"])
            add_eval_results(folder, metrics=run["metrics"], seeds=[run["seed"]], **kwargs)
        if extra_card_dir:
            add_eval_results(extra_card_dir, metrics=result["median"],
                             seeds=[run["seed"] for run in result["runs"]], **kwargs)


SEED_CARD = """---
{{ card_data }}
---

# {{ name }}

{{ base }} fine-tuned on {{ dataset }} (seed {{ seed }}) with encoder-zoo's `{{ script }}`.{{ local_note }}

```python
from transformers import {{ auto_class }}, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("<your-username>/{{ name }}"{{ remote }})
model = {{ auto_class }}.from_pretrained("<your-username>/{{ name }}"{{ remote }})
```
{{ carried }}"""
# hub_cards/card.py's heading of the encoder code a HIRE or BERTAC folder carries, copied into its fine-tuned cards.
CARRIED_CODE_HEADING = "## Encoder code this checkpoint carries"


def is_hub_id(name: str | None) -> bool:
    return bool(name) and not Path(name).expanduser().exists()


def base_card_data(base: str | None):
    """The card metadata of the model fine-tuning started from: a local folder's README.md, else the Hub's (when it
    can be reached; offline, a README.md in the local Hub cache); None when there is none."""
    from huggingface_hub import ModelCard

    if not base:
        return None
    readme = Path(base).expanduser() / "README.md"
    try:
        if not is_hub_id(base):
            return ModelCard.load(readme, ignore_metadata_errors=True).data if readme.is_file() else None
        from huggingface_hub import model_info, try_to_load_from_cache

        from encoder_zoo.glue.tasks import hub_unreachable

        if hub_unreachable() is None:
            return model_info(base, timeout=5).card_data
        cached = try_to_load_from_cache(base, "README.md")
        return ModelCard.load(cached, ignore_metadata_errors=True).data if isinstance(cached, str) else None
    except Exception as error:  # a card is a nicety: a broken or unreachable one leaves the defaults
        logger.info("No model card metadata read for %s (%s); the fine-tuned cards get the defaults.", base, error)
        return None


# What a fine-tuned card says its model does: the Hub's pipeline tag, the Auto class that loads it, the script.
SEQUENCE_CARD = ("text-classification", "AutoModelForSequenceClassification", "glue/run_glue.py")
TOKEN_CARD = ("token-classification", "AutoModelForTokenClassification", "glue/run_ner.py")


def write_seed_card(folder: Path, base: str | None, base_card, task: str, seed: int, dataset: str,
                    kind: tuple[str, str, str] = SEQUENCE_CARD) -> Path:
    """A card for one fine-tuned run that the Hub can index: library_name, the base model's licence (its card's, else
    this project's apache-2.0), base_model (a Hub id; a local base is named in the text instead, since the Hub takes
    only model ids there) and a model-index named after the model. Its results are added after. `kind`: the
    pipeline tag, Auto class and script (`SEQUENCE_CARD`, `TOKEN_CARD`)."""
    from huggingface_hub import ModelCard, ModelCardData

    from encoder_zoo.hub_cards import display_name
    from encoder_zoo.training.run import hub_origin

    pipeline, auto_class, script = kind

    origin = hub_origin(base)  # the shipped MiniLM is a copy of a Hub model: named and licensed as that one
    license = getattr(base_card, "license", None) or (origin[1] if origin else "apache-2.0")
    if origin:
        base_card, base = None, origin[0]
    base_name = getattr(base_card, "model_name", None) if base and not is_hub_id(base) else None
    if not base_name and base:
        path = Path(base.rstrip("/"))
        base_name = path.parent.name if path.name in ("model", "export") and path.parent.name else path.name
    name = f"{base_name or 'model'}-{task}-seed-{seed}"
    remote = any(folder.glob("*.py"))  # the model's code travels in the folder
    data = ModelCardData(library_name="transformers", license=license, base_model=base if is_hub_id(base) else None,
                         model_name=name, pipeline_tag=pipeline,
                         tags=[pipeline, "pretraining-zoo", *(["custom_code"] if remote else [])])
    card = ModelCard.from_template(
        data, template_str=SEED_CARD, name=name, dataset=dataset, seed=seed, script=script, auto_class=auto_class,
        base=(f"[{base}](https://huggingface.co/{base})" if is_hub_id(base)
              else f"`{display_name(base)}`" if base else "A model"),
        local_note=" It started from a local checkpoint: set `base_model` in this card to that model's Hub id once it "
                   "is uploaded." if base and not is_hub_id(base) else "",
        remote=", trust_remote_code=True" if remote else "",
        carried=carried_code_section(base, folder))
    path = folder / "README.md"
    card.save(path)
    return path


def carried_code_section(base: str | None, folder: Path) -> str:
    """The base card's section on the encoder code the model carries (HIRE or BERTAC over a remote-code encoder, as
    hub_cards writes it), for a fine-tuned copy that carries the same files; "" when there is none."""
    readme = Path(base).expanduser() / "README.md" if base and not is_hub_id(base) else None
    text = readme.read_text(encoding="utf-8") if readme and readme.is_file() else ""
    start = text.find(CARRIED_CODE_HEADING)
    if start < 0:
        return ""
    end = text.find("\n## ", start + len(CARRIED_CODE_HEADING))
    section = text[start:end if end >= 0 else None].strip()
    row = next((line for line in section.splitlines() if line.startswith("| files |")), "")
    files = re.findall(r"`([^`]+)`", row)  # the files the section names: claimed only if this folder holds them
    return "\n" + section + "\n" if files and all((folder / name).is_file() for name in files) else ""


def cli() -> None:
    from encoder_zoo.training.run import TrainingDiverged, run_cli

    run_cli(main, "run_glue.py", stops=(TrainingDiverged, RunInterrupted),
            interrupted="interrupted (Ctrl-C) before any run began; nothing was saved. Run the same command again.")


if __name__ == "__main__":
    cli()
