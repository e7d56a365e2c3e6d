"""GLUE tasks, the two embedded offline tasks, and every way to load their data.

Each task is described once (`TaskSpec`): its text columns in the Hub GLUE schema, label count, validation splits,
metrics, where its columns sit in the original GLUE TSV distribution, the loader of an embedded task's own data, and
how a comparison of models scores it (`Scoring`, which repro/ reads).
"""

from __future__ import annotations

import bz2
import csv
import hashlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import datasets

from encoder_zoo.training.run import merged_with_plugins, resource_path

GLUE_HUB_ID = "nyu-mll/glue"
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scoring:
    """How a comparison of models (repro/) scores a task, declared in the task's own spec: a sentence task's
    `TaskSpec` (here), a QA set's `QATaskSpec` (qa/tasks.py), a pretraining metric's `PretrainingTask`
    (repro/tasks.py). repro reads it through `repro.tasks.task_facts`, never by the task's name."""

    metric: str  # the score's key in what its script writes (glue_results.json, qa_results.json, the trainer's log)
    description: str  # what the reports and plots call it
    finetuned_by: str | None  # "glue" (glue/run_glue.py), "qa" (qa/run_qa.py); None: the pretraining logs it
    higher_is_better: bool = True
    # One point of a paper's table in the units repro stores the score in: 0.01 for accuracy or a correlation (0-1 in
    # repro's cache; repro.jobs.glue_run_scores reads glue_results.json's points back), 1.0 for SQuAD F1
    # (qa_results.json's, already 0-100) and for a loss.
    point: float = 0.01
    unit: str = "points"  # what the reports show: percent points, or nats for a loss
    # What a model that learned nothing scores: "majority_class" (the accuracy of the scored rows' most frequent
    # label), "no_correlation" (0), None (no such level: QA F1, a loss).
    chance: str | None = None
    floor: str | None = None  # the trivial model repro/floors.py fits: bag_of_words, trivial_answer or unigram


@dataclass(frozen=True)
class TaskSpec:
    name: str
    text_columns: tuple[str, ...]
    num_labels: int  # 1 = regression
    metrics: tuple[str, ...]
    validation_splits: tuple[str, ...] = ("validation",)
    label_names: tuple[str, ...] = ()
    # Original GLUE TSV layout: folder, dev files per validation split, header -> our column names, or indices.
    tsv_folder: str = ""
    tsv_dev_files: tuple[str, ...] = ("dev.tsv",)
    tsv_columns: dict[str, str | int] = field(default_factory=dict)
    tsv_has_header: bool = True
    # An embedded task's own data (train and validation splits), read offline; None: the Hub or --data_dir.
    loader: Callable[[], datasets.DatasetDict] | None = None
    scoring: Scoring | None = None  # None: no comparison of repro/ scores this task
    extra_metrics: tuple[str, ...] = ()  # reported beside `metrics` but not part of the task's score
    new_tokens: tuple[str, ...] = ()  # added to the tokenizer (the model's embeddings resized): TACRED's markers

    def __post_init__(self):
        if self.scoring and self.scoring.metric not in self.metrics:
            raise ValueError(f"task {self.name}: its scoring metric {self.scoring.metric!r} is none of the metrics "
                             f"run_glue.py computes for it {self.metrics}; name one of them.")

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1


# ------------------------------------------------------------------------------------------------ embedded tasks
def _fixed_split(keys: list[str], validation_fraction: float) -> list[bool]:
    """A split that never changes: an example is validation when the hash of its text says so."""
    return [int(hashlib.md5(key.encode("utf-8")).hexdigest(), 16) % 1000 < validation_fraction * 1000 for key in keys]


# The one fixed order of an embedded set's rows (`shuffled_once`).
EMBEDDED_ORDER_SEED = 0


def shuffled_once(splits: datasets.DatasetDict) -> datasets.DatasetDict:
    """Each split's rows in one fixed random order (no row changes split): then the first N rows, what
    --max_train_samples/--max_eval_samples keep, are a random sample, whatever order the source file has (the
    movie scores' file runs from positive to negative; the Wikipedia articles are alphabetical)."""
    return datasets.DatasetDict({name: split.shuffle(seed=EMBEDDED_ORDER_SEED)
                                 for name, split in splits.items()})


def _as_splits(columns: dict[str, list], validation_fraction: float = 0.1) -> datasets.DatasetDict:
    is_validation = _fixed_split(columns["sentence"], validation_fraction)
    data = datasets.Dataset.from_dict(columns)
    return datasets.DatasetDict({
        "train": data.select([i for i, v in enumerate(is_validation) if not v]),
        "validation": data.select([i for i, v in enumerate(is_validation) if v]),
    })


def load_rotten_tomatoes() -> datasets.DatasetDict:
    """12.8k Rotten Tomatoes snippets (the source SST-2 was built from), fresh=1 / rotten=0, `plot` rows dropped;
    a fixed 90/10 train/validation split by text hash."""
    with bz2.open(resource_path("rotten_tomatoes"), "rt", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["category"] in ("fresh", "rotten") and r["text"].strip()]
    seen, sentences, labels = set(), [], []
    for row in rows:
        text = row["text"].strip()
        if text not in seen:  # duplicates would leak across the split
            seen.add(text)
            sentences.append(text)
            labels.append(int(row["category"] == "fresh"))
    return _as_splits({"sentence": sentences, "label": labels})


def load_movie_sentiment_regression() -> datasets.DatasetDict:
    """10.6k movie snippets with mean human sentiment scores (-3.9..3.9, Hutto & Gilbert 2014): STS-B-style
    regression; a fixed 90/10 split by text hash."""
    sentences, scores = [], []
    with open(resource_path("movie_sentiment_scores"), encoding="latin-1") as handle:
        next(handle)
        for line in handle:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 3 and parts[2].strip():
                sentences.append(parts[2].strip())
                scores.append(float(parts[1]))
    return _as_splits({"sentence": sentences, "label": scores})


# ------------------------------------------------------------------------------------------------ the tasks
BUILT_IN_TASKS: dict[str, TaskSpec] = {
    "cola": TaskSpec("cola", ("sentence",), 2, ("matthews_correlation",), label_names=("unacceptable", "acceptable"),
                     tsv_folder="CoLA", tsv_columns={"sentence": 3, "label": 1}, tsv_has_header=False),
    "sst2": TaskSpec("sst2", ("sentence",), 2, ("accuracy",), label_names=("negative", "positive"),
                     tsv_folder="SST-2", tsv_columns={"sentence": "sentence", "label": "label"}),
    "mrpc": TaskSpec("mrpc", ("sentence1", "sentence2"), 2, ("f1", "accuracy"),
                     label_names=("not_equivalent", "equivalent"), tsv_folder="MRPC",
                     tsv_columns={"sentence1": "#1 String", "sentence2": "#2 String", "label": "Quality"}),
    "qqp": TaskSpec("qqp", ("question1", "question2"), 2, ("f1", "accuracy"),
                    label_names=("not_duplicate", "duplicate"), tsv_folder="QQP",
                    tsv_columns={"question1": "question1", "question2": "question2", "label": "is_duplicate"}),
    "stsb": TaskSpec("stsb", ("sentence1", "sentence2"), 1, ("pearson", "spearmanr"), tsv_folder="STS-B",
                     tsv_columns={"sentence1": "sentence1", "sentence2": "sentence2", "label": "score"}),
    "mnli": TaskSpec("mnli", ("premise", "hypothesis"), 3, ("accuracy",),
                     validation_splits=("validation_matched", "validation_mismatched"),
                     label_names=("entailment", "neutral", "contradiction"), tsv_folder="MNLI",
                     tsv_dev_files=("dev_matched.tsv", "dev_mismatched.tsv"),
                     tsv_columns={"premise": "sentence1", "hypothesis": "sentence2", "label": "gold_label"}),
    "qnli": TaskSpec("qnli", ("question", "sentence"), 2, ("accuracy",), label_names=("entailment", "not_entailment"),
                     tsv_folder="QNLI", tsv_columns={"question": "question", "sentence": "sentence", "label": "label"}),
    "rte": TaskSpec("rte", ("sentence1", "sentence2"), 2, ("accuracy",), label_names=("entailment", "not_entailment"),
                    tsv_folder="RTE",
                    tsv_columns={"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"}),
    "wnli": TaskSpec("wnli", ("sentence1", "sentence2"), 2, ("accuracy",), label_names=("not_entailment", "entailment"),
                     tsv_folder="WNLI",
                     tsv_columns={"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"}),
    # Embedded offline tasks built from real data shipped in PyPI packages; the comparisons of repro/ score them.
    "rotten_tomatoes": TaskSpec(
        "rotten_tomatoes", ("sentence",), 2, ("accuracy",), label_names=("rotten", "fresh"),
        loader=load_rotten_tomatoes,
        scoring=Scoring("accuracy", "rotten_tomatoes accuracy", "glue", chance="majority_class", floor="bag_of_words")),
    "movie_sentiment_regression": TaskSpec(
        "movie_sentiment_regression", ("sentence",), 1, ("pearson", "spearmanr"),
        loader=load_movie_sentiment_regression,
        scoring=Scoring("pearson", "movie_sentiment_regression Pearson", "glue", chance="no_correlation",
                        floor="bag_of_words")),
    # Relation extraction (glue/tacred.py): its relations and marker tokens come from the data it reads.
    "tacred": TaskSpec("tacred", ("sentence",), 0, ("f1",), extra_metrics=("precision", "recall")),
}
# The nine tasks of the GLUE benchmark (run_glue.py's GLUE average); not the embedded tasks.
GLUE_TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")
CUSTOM = "custom"
PLUGIN_GROUP = "encoder_zoo.tasks"


def with_plugins(built_in: dict, attribute: str, where: str) -> dict:
    """`built_in` (declared in `where`) and every task plugin module's `attribute` (entry point group
    `encoder_zoo.tasks`: sentence tasks as `TASKS`, QA sets as `QA_TASKS`, name -> spec); a name declared twice is
    refused."""
    return merged_with_plugins(built_in, PLUGIN_GROUP, attribute, where, "task")


def __getattr__(name: str):
    """`TASKS` (the built-in tasks and the plugins'), read on first use: a plugin module imports this one's spec
    classes, so it can only be loaded once this module is. `EMBEDDED_TASKS`: those with data of their own."""
    if name == "TASKS":
        globals()["TASKS"] = with_plugins(BUILT_IN_TASKS, "TASKS", "glue/tasks.py")
        return globals()["TASKS"]
    if name == "EMBEDDED_TASKS":
        return tuple(task_name for task_name, task in _tasks().items() if task.loader)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _tasks() -> dict[str, TaskSpec]:
    return sys.modules[__name__].TASKS


def get_task(name: str) -> TaskSpec:
    tasks = _tasks()
    if name not in tasks:
        raise ValueError(f"Unknown task {name!r}. Choose one of: {', '.join(tasks)} (or pass "
                         "--train_file/--validation_file).")
    return tasks[name]


# ------------------------------------------------------------------------------------------------ TSV distribution
def read_glue_tsv(path: Path, task: TaskSpec) -> datasets.Dataset:
    """One file of the original GLUE TSV distribution, mapped onto the Hub schema's columns. Blank lines are skipped;
    a row without one of the task's fields, or with a label that is not one of the task's, is named by its line."""
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: --data_dir should hold the GLUE folder layout "
                                f"({task.tsv_folder}/train.tsv, {task.tsv_folder}/{task.tsv_dev_files[0]}).")
    with open(path, encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        rows = [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]  # a blank line is no row
    header = rows.pop(0)[1] if task.tsv_has_header and rows else None
    indices = {}
    for target, source in task.tsv_columns.items():
        if isinstance(source, str):
            if source not in (header or []):
                raise ValueError(f"{path}: column {source!r} (for {target!r}) missing; the header is {header}.")
            indices[target] = header.index(source)
        else:
            indices[target] = source
    names = {name: i for i, name in enumerate(task.label_names)}
    columns = {target: [] for target in indices}
    empty_text = {}  # text column -> lines where it is empty: allowed (the tokenizer reads ""), but worth a warning
    for line, row in rows:
        missing = [target for target, index in indices.items()
                   if index >= len(row) or (target == "label" and not row[index].strip())]
        if missing:
            shown = " and ".join(f"{target!r} ({_tsv_column_name(task, target)})" for target in missing)
            raise ValueError(f"{path}, line {line}: no {shown}: the row has {len(row)} tab-separated field"
                             + ("s" if len(row) != 1 else "")
                             + (f" where the header has {len(header)}" if header else "")
                             + ". Fix or delete that line (one field per column, separated by tabs).")
        for target, index in indices.items():
            columns[target].append(row[index])
            if target != "label" and not row[index].strip():
                empty_text.setdefault(target, []).append(line)
    for target, lines in empty_text.items():
        logger.warning("%s: %d rows have an empty %r (%s; lines %s).", path, len(lines), target,
                       _tsv_column_name(task, target),
                       ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else ""))
    if task.is_regression:
        for (line, _), value in zip(rows, columns["label"]):
            try:
                float(value)
            except ValueError:
                raise ValueError(f"{path}, line {line}: the score {value!r} is not a number; "
                                 "fix or delete that line.") from None
        columns["label"] = [float(v) for v in columns["label"]]
        check_finite(columns["label"], str(path))
    else:
        labels = []
        for (line, _), value in zip(rows, columns["label"]):
            value = value.strip()
            if value in names:
                labels.append(names[value])
            elif value.isdigit() and int(value) < task.num_labels:
                labels.append(int(value))
            else:
                valid = (list(names) + [str(i) for i in range(task.num_labels)] if names
                         else [str(i) for i in range(task.num_labels)])
                raise ValueError(f"{path}, line {line}: label {value!r} is not one of {task.name}'s {valid}; fix or "
                                 "delete that line.")
        columns["label"] = labels
    return datasets.Dataset.from_dict(columns)


def _tsv_column_name(task: TaskSpec, target: str) -> str:
    source = task.tsv_columns[target]
    return f"column {source!r}" if isinstance(source, str) else f"field {source + 1}"


def check_finite(labels, where: str) -> None:
    """Regression labels must be finite numbers: a NaN or inf would turn the MSE loss into NaN."""
    import math

    for row, value in enumerate(labels):
        if value is None or not math.isfinite(value):
            shown = "missing (or NaN)" if value is None else value
            raise ValueError(f"Label {shown} at row {row} of {where} is not a finite number; fix or drop that row.")


# ------------------------------------------------------------------------------------------------ the Hub, offline
OFFLINE_TASKS_HELP = ("Offline, run an embedded task (--task_name rotten_tomatoes or movie_sentiment_regression), or "
                      "give local data: --data_dir with the GLUE TSV layout, or --train_file/--validation_file.")


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hub cannot be reached now (offline mode, or no connection within `timeout` s), or None. Behind a proxy
    a direct connection says nothing, so only offline mode counts there."""
    import os
    import socket
    import threading
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    endpoint = urlparse(constants.ENDPOINT)
    address = (endpoint.hostname, endpoint.port or (443 if endpoint.scheme == "https" else 80))
    outcome = {}

    def probe():  # in a thread: a hanging name lookup ignores the socket's timeout
        try:
            socket.create_connection(address, timeout=timeout).close()
            outcome["ok"] = True
        except OSError as error:
            outcome["error"] = error

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 1)
    if outcome.get("ok"):
        return None
    return f"no network: {address[0]} cannot be reached ({outcome.get('error') or f'no answer within {timeout:.0f} s'})"


def load_hub_dataset(hub_id: str, config: str | None, what: str, way_out: str,
                     revision: str | None = None) -> datasets.DatasetDict:
    """`datasets.load_dataset(hub_id, config, revision=revision)`. When the Hub cannot be reached (`hub_unreachable`)
    only the local `datasets` cache is read, so a dataset that is not there fails at once (instead of after minutes of
    retries), with a ValueError that names `what` was asked for and `way_out`."""
    from unittest import mock

    from huggingface_hub import constants

    reason = hub_unreachable()
    try:
        if reason is None:
            return datasets.load_dataset(hub_id, config, revision=revision)
        with (mock.patch.object(constants, "HF_HUB_OFFLINE", True),
              mock.patch.object(datasets.config, "HF_HUB_OFFLINE", True)):
            return datasets.load_dataset(hub_id, config, revision=revision)
    except (ConnectionError, FileNotFoundError) as error:
        if reason is None and not isinstance(error, ConnectionError):
            raise
        why = reason or f"the connection failed: {str(error).strip().splitlines()[0]}"
        raise ValueError(f"{what} comes from the Hub ({hub_id}), which cannot be reached ({why}), and no copy is in "
                         f"the local datasets cache. {way_out}") from None


# ------------------------------------------------------------------------------------------------ entry point
def load_task(
    task_name: str,
    *,
    data_dir: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    text_columns: list[str] | None = None,
    label_column: str = "label",
    tacred_mode: str = "ner",
) -> tuple[TaskSpec, datasets.DatasetDict]:
    """Data for a task with `train` and its validation split(s), in the task's columns plus `label`.

    Sources: `--train_file/--validation_file` (csv/tsv/json/jsonl, GLUE schema or `--text_columns`), `--data_dir`
    (original GLUE TSV layout), the embedded offline tasks, else the Hub GLUE dataset (online). TACRED: its JSON
    (`--data_dir` or the two files), its entities marked as `tacred_mode` says (glue/tacred.py).
    """
    if task_name == "tacred":
        from encoder_zoo.glue.tacred import load_tacred

        return load_tacred(get_task(task_name), data_dir, train_file, validation_file, tacred_mode)
    if train_file or validation_file:
        return _load_files(task_name, train_file, validation_file, text_columns, label_column)
    task = get_task(task_name)
    if task.loader is not None:  # an embedded set, built-in or a plugin's
        return task, shuffled_once(task.loader())
    if data_dir:
        folder = Path(data_dir)
        folder = folder / task.tsv_folder if (folder / task.tsv_folder).is_dir() else folder
        splits = {"train": read_glue_tsv(folder / "train.tsv", task)}
        for split, file in zip(task.validation_splits, task.tsv_dev_files):
            splits[split] = read_glue_tsv(folder / file, task)
        return task, datasets.DatasetDict(splits)
    hub = load_hub_dataset(GLUE_HUB_ID, task.name, f"--task_name {task.name}", OFFLINE_TASKS_HELP)
    return task, datasets.DatasetDict({k: hub[k] for k in ("train", *task.validation_splits)})


def check_texts(data: datasets.Dataset, columns, where: str) -> None:
    """Every value of a text column is a string; else name the column, the row and what it holds instead (a number
    left unquoted, an empty cell, a list), before any tokenizer sees it."""
    for column in columns:
        values = data[column]
        feature = data.features[column]
        if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string") and None not in values:
            continue
        for row, value in enumerate(values):
            if not isinstance(value, str):
                shown = "an empty cell (null)" if value is None else f"{_short(value)} ({type(value).__name__})"
                raise ValueError(f"Text column {column!r} of {where} holds {shown} at row {row}, not a string. Every "
                                 "row of a text column needs text: fix or drop that row (quote numbers as text), or "
                                 "name other columns with --text_columns.")


def _short(value, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def checked_files(train_file, validation_file) -> dict[str, str]:
    """{"train": ..., "validation": ...}, both given and existing, or one line saying which is not."""
    files = {"train": train_file, "validation": validation_file}
    for split, path in files.items():
        if path is None:
            raise ValueError(f"Pass both --train_file and --validation_file (missing the {split} file).")
        if not Path(path).is_file():
            what = "is a folder, not a file" if Path(path).is_dir() else "does not exist"
            raise FileNotFoundError(f"--{split}_file {path} {what}.")
    return files


def _load_files(task_name, train_file, validation_file, text_columns, label_column):
    files = checked_files(train_file, validation_file)
    suffix = Path(train_file).suffix.lower()
    builder = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json"}.get(suffix)
    if builder is None:
        raise ValueError(f"Unsupported data file type {suffix!r}: use .csv, .tsv, .json or .jsonl.")
    known = _tasks().get(task_name) if task_name != CUSTOM else None
    columns = list(text_columns or (known.text_columns if known else ()))
    if not columns:
        raise ValueError("Custom data needs --text_columns (one column, or two for sentence pairs).")
    if len(columns) > 2:
        raise ValueError(f"--text_columns takes one or two columns, got {columns}.")
    if len(set(columns)) < len(columns):
        raise ValueError(f"--text_columns names {columns[0]!r} twice; name two different columns for sentence pairs, "
                         "or one.")
    if label_column in columns:
        raise ValueError(f"--label_column {label_column!r} is also a text column; the label needs a column of its own.")
    kwargs = {"delimiter": "\t"} if suffix == ".tsv" else {}
    raw = datasets.load_dataset(builder, data_files=files, **kwargs)
    for split, data in raw.items():
        for column in [*columns, label_column]:
            if column not in data.column_names:
                flag = ("--label_column" if column == label_column else "--text_columns" if text_columns
                        else f"--task_name {task_name} reads {list(columns)}; --text_columns")
                raise ValueError(f"Column {column!r} not found in the {split} file {files[split]}; its columns are "
                                 f"{data.column_names}. Set {flag} to the columns to read.")
        if len(data) == 0:
            raise ValueError(f"The {split} file {files[split]} has no rows.")
    raw = raw.select_columns([*columns, label_column])
    if label_column != "label":
        raw = raw.rename_column(label_column, "label")
    where = {split: f"the {split} file {files[split]}" for split in raw}
    for split, data in raw.items():
        check_texts(data, columns, where[split])
    labels = {split: list(data["label"]) for split, data in raw.items()}
    for split, values in labels.items():
        for row, value in enumerate(values):
            if not (value is None or isinstance(value, (str, int, float))):
                raise ValueError(f"The label at row {row} of {where[split]} (--label_column {label_column}) is "
                                 f"{_short(value)}, not a class name or a number; fix that row.")
        if all(v is None or isinstance(v, (int, float)) for v in values):  # csv/json read NaN as None
            check_finite(values, f"{where[split]} (--label_column {label_column})")
        elif None in values:
            raise ValueError(f"Row {values.index(None)} of {where[split]} has no label (--label_column "
                             f"{label_column}); fix or drop that row.")
    values = labels["train"]
    if known:
        task = known
    else:
        regression = all(isinstance(v, float) for v in values) and any(v != int(v) for v in values)
        numeric = all(isinstance(v, (int, float)) for v in values)
        # String labels (pos/neg) are sorted by name, as transformers' run_glue.py does; numbers by value.
        label_names = () if regression else tuple(
            str(v) for v in sorted(set(values) if numeric else {str(v) for v in values}))
        if not regression and len(label_names) < 2:
            raise ValueError(f"--label_column {label_column!r} of {where['train']} holds one class only "
                             f"({label_names[0]!r}): a classifier needs examples of at least two classes. Add rows of "
                             "the other classes; for regression, the labels must be numbers with decimals (e.g. 2.5).")
        task = TaskSpec(CUSTOM, tuple(columns), 1 if regression else len(label_names),
                        ("pearson", "spearmanr") if regression
                        else ("accuracy", "f1") if len(label_names) == 2 else ("accuracy",),
                        label_names=label_names)
    if task.is_regression:
        for split, values in labels.items():
            text = next((row for row, v in enumerate(values) if isinstance(v, str)), None)
            if text is not None:
                raise ValueError(f"{task.name} is a regression task, but the label at row {text} of {where[split]} is "
                                 f"{values[text]!r}, not a number; fix that row.")
        return task, raw.cast_column("label", datasets.Value("float32"))
    # Classes: the task's names (or, for a GLUE task, their ids 0..n-1); custom data: the training file's labels.
    mapping = {name: i for i, name in enumerate(task.label_names)}
    if known:
        mapping.update({str(i): i for i in range(task.num_labels)})

    def key(value) -> str:  # a GLUE task's class id may come as 1.0 from a csv
        return str(int(value)) if known and isinstance(value, float) and value.is_integer() else str(value)

    for split, values in labels.items():
        for row, value in enumerate(values):
            if key(value) not in mapping:
                source = f"{task.name}'s classes" if known else f"the classes of {where['train']}"
                raise ValueError(f"The label {value!r} at row {row} of {where[split]} (--label_column {label_column}) "
                                 f"is not one of {source}: {list(mapping)}. Fix or drop that row.")
    features = raw["train"].features.copy()
    features["label"] = datasets.ClassLabel(names=list(task.label_names) or [str(i) for i in range(task.num_labels)])
    return task, raw.map(lambda b: {"label": [mapping[key(v)] for v in b["label"]]}, batched=True, features=features)


def first_samples(raw: datasets.DatasetDict, task: TaskSpec, max_train: int | None,
                  max_eval: int | None) -> datasets.DatasetDict:
    """The first `max_train` training and `max_eval` validation rows of each split (None: all): what
    --max_train_samples/--max_eval_samples train and score on."""
    raw = datasets.DatasetDict(raw)
    if max_train:
        raw["train"] = raw["train"].select(range(min(max_train, len(raw["train"]))))
    if max_eval:
        for split in task.validation_splits:
            raw[split] = raw[split].select(range(min(max_eval, len(raw[split]))))
    return raw


def majority_class_accuracy(labels) -> float:
    """Accuracy of always predicting the label most frequent among `labels`: the best a classifier that learned
    nothing from the text (one constant answer) can score on those rows."""
    from collections import Counter

    return Counter(labels).most_common(1)[0][1] / len(labels)
