"""GLUE tasks, the two embedded offline tasks, and every way to load their data.

Each task is described once (`TaskSpec`): its text columns in the Hub GLUE schema, label count, validation splits,
metrics, and where its columns sit in the original GLUE TSV distribution.
"""

from __future__ import annotations

import bz2
import csv
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import datasets

from encoder_zoo.training.run import resource_path

GLUE_HUB_ID = "nyu-mll/glue"


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

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1


TASKS: dict[str, TaskSpec] = {
    "cola": TaskSpec("cola", ("sentence",), 2, ("matthews_correlation",), label_names=("unacceptable", "acceptable"),
                     tsv_folder="CoLA", tsv_columns={"sentence": 3, "label": 1}, tsv_has_header=False),
    "sst2": TaskSpec("sst2", ("sentence",), 2, ("accuracy",), label_names=("negative", "positive"),
                     tsv_folder="SST-2", tsv_columns={"sentence": "sentence", "label": "label"}),
    "mrpc": TaskSpec("mrpc", ("sentence1", "sentence2"), 2, ("f1", "accuracy"), label_names=("not_equivalent", "equivalent"),
                     tsv_folder="MRPC", tsv_columns={"sentence1": "#1 String", "sentence2": "#2 String", "label": "Quality"}),
    "qqp": TaskSpec("qqp", ("question1", "question2"), 2, ("f1", "accuracy"), label_names=("not_duplicate", "duplicate"),
                    tsv_folder="QQP", tsv_columns={"question1": "question1", "question2": "question2", "label": "is_duplicate"}),
    "stsb": TaskSpec("stsb", ("sentence1", "sentence2"), 1, ("pearson", "spearmanr"),
                     tsv_folder="STS-B", tsv_columns={"sentence1": "sentence1", "sentence2": "sentence2", "label": "score"}),
    "mnli": TaskSpec("mnli", ("premise", "hypothesis"), 3, ("accuracy",),
                     validation_splits=("validation_matched", "validation_mismatched"),
                     label_names=("entailment", "neutral", "contradiction"), tsv_folder="MNLI",
                     tsv_dev_files=("dev_matched.tsv", "dev_mismatched.tsv"),
                     tsv_columns={"premise": "sentence1", "hypothesis": "sentence2", "label": "gold_label"}),
    "qnli": TaskSpec("qnli", ("question", "sentence"), 2, ("accuracy",), label_names=("entailment", "not_entailment"),
                     tsv_folder="QNLI", tsv_columns={"question": "question", "sentence": "sentence", "label": "label"}),
    "rte": TaskSpec("rte", ("sentence1", "sentence2"), 2, ("accuracy",), label_names=("entailment", "not_entailment"),
                    tsv_folder="RTE", tsv_columns={"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"}),
    "wnli": TaskSpec("wnli", ("sentence1", "sentence2"), 2, ("accuracy",), label_names=("not_entailment", "entailment"),
                     tsv_folder="WNLI", tsv_columns={"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"}),
    # Embedded offline tasks built from real data shipped in PyPI packages.
    "rotten_tomatoes": TaskSpec("rotten_tomatoes", ("sentence",), 2, ("accuracy",), label_names=("rotten", "fresh")),
    "movie_sentiment_regression": TaskSpec("movie_sentiment_regression", ("sentence",), 1, ("pearson", "spearmanr")),
}
GLUE_TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")
EMBEDDED_TASKS = ("rotten_tomatoes", "movie_sentiment_regression")
CUSTOM = "custom"


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"Unknown task {name!r}. Choose one of: {', '.join(TASKS)} (or pass --train_file/--validation_file).")
    return TASKS[name]


# ------------------------------------------------------------------------------------------------ embedded tasks
def _fixed_split(keys: list[str], validation_fraction: float) -> list[bool]:
    """A split that never changes: an example is validation when the hash of its text says so."""
    return [int(hashlib.md5(key.encode("utf-8")).hexdigest(), 16) % 1000 < validation_fraction * 1000 for key in keys]


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


# ------------------------------------------------------------------------------------------------ TSV distribution
def read_glue_tsv(path: Path, task: TaskSpec) -> datasets.Dataset:
    """One file of the original GLUE TSV distribution, mapped onto the Hub schema's columns."""
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: --data_dir should hold the GLUE folder layout ({task.tsv_folder}/train.tsv, "
                                f"{task.tsv_folder}/{task.tsv_dev_files[0]}).")
    with open(path, encoding="utf-8") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    header = rows.pop(0) if task.tsv_has_header else None
    columns = {}
    for target, source in task.tsv_columns.items():
        if isinstance(source, str):
            if source not in header:
                raise ValueError(f"{path}: column {source!r} (for {target!r}) missing; the header is {header}.")
            index = header.index(source)
        else:
            index = source
        columns[target] = [row[index] if index < len(row) else "" for row in rows]
    if task.is_regression:
        columns["label"] = [float(v) for v in columns["label"]]
        check_finite(columns["label"], str(path))
    elif task.label_names and not all(v.lstrip("-").isdigit() for v in columns["label"]):
        names = {name: i for i, name in enumerate(task.label_names)}
        unknown = sorted(set(columns["label"]) - set(names))
        if unknown:
            raise ValueError(f"{path}: unknown labels {unknown[:5]}; expected {list(names)}.")
        columns["label"] = [names[v] for v in columns["label"]]
    else:
        columns["label"] = [int(v) for v in columns["label"]]
    return datasets.Dataset.from_dict(columns)


def check_finite(labels, where: str) -> None:
    """Regression labels must be finite numbers: a NaN or inf would turn the MSE loss into NaN."""
    import math

    for row, value in enumerate(labels):
        if value is None or not math.isfinite(value):
            shown = "missing (or NaN)" if value is None else value
            raise ValueError(f"Label {shown} at row {row} of {where} is not a finite number; fix or drop that row.")


# ------------------------------------------------------------------------------------------------ entry point
def load_task(
    task_name: str,
    *,
    data_dir: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    text_columns: list[str] | None = None,
    label_column: str = "label",
) -> tuple[TaskSpec, datasets.DatasetDict]:
    """Data for a task with `train` and its validation split(s), in the task's columns plus `label`.

    Sources: `--train_file/--validation_file` (csv/tsv/json/jsonl, GLUE schema or `--text_columns`), `--data_dir`
    (original GLUE TSV layout), the embedded offline tasks, else the Hub GLUE dataset (online).
    """
    if train_file or validation_file:
        return _load_files(task_name, train_file, validation_file, text_columns, label_column)
    task = get_task(task_name)
    if task.name == "rotten_tomatoes":
        return task, load_rotten_tomatoes()
    if task.name == "movie_sentiment_regression":
        return task, load_movie_sentiment_regression()
    if data_dir:
        folder = Path(data_dir)
        folder = folder / task.tsv_folder if (folder / task.tsv_folder).is_dir() else folder
        splits = {"train": read_glue_tsv(folder / "train.tsv", task)}
        for split, file in zip(task.validation_splits, task.tsv_dev_files):
            splits[split] = read_glue_tsv(folder / file, task)
        return task, datasets.DatasetDict(splits)
    hub = datasets.load_dataset(GLUE_HUB_ID, task.name)
    return task, datasets.DatasetDict({k: hub[k] for k in ("train", *task.validation_splits)})


def _load_files(task_name, train_file, validation_file, text_columns, label_column):
    files = {"train": train_file, "validation": validation_file}
    for split, path in files.items():
        if path is None:
            raise ValueError(f"Pass both --train_file and --validation_file (missing the {split} file).")
        if not Path(path).exists():
            raise FileNotFoundError(f"--{split}_file {path} does not exist.")
    suffix = Path(train_file).suffix.lower()
    builder = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json"}.get(suffix)
    if builder is None:
        raise ValueError(f"Unsupported data file type {suffix!r}: use .csv, .tsv, .json or .jsonl.")
    kwargs = {"delimiter": "\t"} if suffix == ".tsv" else {}
    raw = datasets.load_dataset(builder, data_files=files, **kwargs)
    known = TASKS.get(task_name) if task_name != CUSTOM else None
    columns = list(text_columns or (known.text_columns if known else ()))
    if not columns:
        raise ValueError("Custom data needs --text_columns (one column, or two for sentence pairs).")
    if len(columns) > 2:
        raise ValueError(f"--text_columns takes one or two columns, got {columns}.")
    for split, data in raw.items():
        for column in [*columns, label_column]:
            if column not in data.column_names:
                raise ValueError(f"Column {column!r} not found in the {split} file {files[split]}; its columns are "
                                 f"{data.column_names}. Set --text_columns / --label_column.")
    raw = raw.select_columns([*columns, label_column])
    if label_column != "label":
        raw = raw.rename_column(label_column, "label")
    values = list(raw["train"]["label"])
    for split, data in raw.items():
        if all(v is None or isinstance(v, (int, float)) for v in data["label"]):  # csv/json read NaN as None
            check_finite(data["label"], f"the {split} file {files[split]} (--label_column {label_column})")
    if known:
        task = known
    else:
        regression = all(isinstance(v, float) for v in values) and any(v != int(v) for v in values)
        numeric = all(isinstance(v, (int, float)) for v in values)
        # String labels (pos/neg) are sorted by name, as transformers' run_glue.py does; numbers by value.
        label_names = () if regression else tuple(str(v) for v in sorted(set(values) if numeric else {str(v) for v in values}))
        task = TaskSpec(CUSTOM, tuple(columns), 1 if regression else len(label_names),
                        ("pearson", "spearmanr") if regression else ("accuracy", "f1") if len(label_names) == 2 else ("accuracy",),
                        label_names=label_names)
    if not task.is_regression and (task.name == CUSTOM or any(isinstance(v, str) for v in values)):
        mapping = {name: i for i, name in enumerate(task.label_names)}
        for split, data in raw.items():
            unknown = sorted({str(v) for v in data["label"]} - set(mapping))
            if unknown:
                raise ValueError(f"Labels {unknown[:5]} in the {split} file are not among {list(mapping)}.")
        features = raw["train"].features.copy()
        features["label"] = datasets.ClassLabel(names=list(task.label_names))
        raw = raw.map(lambda b: {"label": [mapping[str(v)] for v in b["label"]]}, batched=True, features=features)
    if task.is_regression:
        raw = raw.cast_column("label", datasets.Value("float32"))
    return task, raw


def first_samples(raw: datasets.DatasetDict, task: TaskSpec, max_train: int | None, max_eval: int | None) -> datasets.DatasetDict:
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
