"""TACRED relation extraction as a sentence-classification task of run_glue.py (`--task_name tacred`).

Reads TACRED's JSON (Zhang et al. 2017; LDC2018T24, not on the Hub): a list of examples with `token`, `subj_start`,
`subj_end`, `obj_start`, `obj_end` (inclusive word indices), `subj_type`, `obj_type` and `relation`, as the SpanBERT
authors' `code/run_tacred.py` reads it (JSON lines are read too). Each example becomes one text whose entities are
marked as that script's `--feature_mode` does (`TACRED_MODES`); the markers are new tokens the harness adds to the
tokenizer, resizing the model's embeddings (the authors map them onto BERT's `[unusedN]` rows instead).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import datasets

NEGATIVE_RELATION = "no_relation"  # id 0, left out of precision and recall (run_tacred.py's compute_f1)
# run_tacred.py's --feature_mode values offered here (its `ner_text` is not: it needs [SEP]s inside one segment).
TACRED_MODES = {
    "ner": "each entity replaced by a marker of its type, [SUBJ-PERSON] ... [OBJ-CITY] (the paper's input)",
    "text": "the words kept, each entity between markers, [SUBJ-START] ... [SUBJ-END]",
    "text_ner": "as text, with the two type markers as a second segment",
}
FIELDS = {"token": list, "subj_start": int, "subj_end": int, "obj_start": int, "obj_end": int, "subj_type": str,
          "obj_type": str, "relation": str}
PTB_BRACKETS = {"-lrb-": "(", "-rrb-": ")", "-lsb-": "[", "-rsb-": "]", "-lcb-": "{", "-rcb-": "}"}
LAYOUT_HELP = ("pass --data_dir with TACRED's train.json and dev.json (score the test set with --train_file "
               "train.json --validation_file test.json), or --train_file/--validation_file in its JSON format")


def load_tacred(task, data_dir: str | None, train_file: str | None, validation_file: str | None,
                mode: str = "ner"):
    """The task (its relations, text columns and marker tokens filled in) and its train/validation splits: the marked
    text(s) and the relation id, no_relation first and the rest by frequency in the training file, as the authors'
    `get_labels` orders them."""
    if mode not in TACRED_MODES:
        raise ValueError(f"--tacred_mode {mode!r}: choose one of {', '.join(TACRED_MODES)}.")
    files = tacred_files(data_dir, train_file, validation_file)
    examples = {split: read_tacred(path) for split, path in files.items()}
    counts = Counter(example["relation"] for example in examples["train"])
    relations = [NEGATIVE_RELATION] + [name for name, _ in counts.most_common() if name != NEGATIVE_RELATION]
    known = set(relations)
    for row, example in enumerate(examples["validation"]):
        if example["relation"] not in known:
            raise ValueError(f"{files['validation']}, example {row}: relation {example['relation']!r} is not in the "
                             f"training file {files['train']} (its relations: {', '.join(sorted(known))}). Fix or "
                             "drop that example.")
    columns = ("sentence", "entities") if mode == "text_ner" else ("sentence",)
    markers, splits = set(), {}
    for split, rows in examples.items():
        texts = [mark_entities(example, mode) for example in rows]
        markers.update(marker for text in texts for part in text for marker in part.split() if is_marker(marker))
        data = {column: [text[i] for text in texts] for i, column in enumerate(columns)}
        data["label"] = [relations.index(example["relation"]) for example in rows]
        features = datasets.Features({**{column: datasets.Value("string") for column in columns},
                                      "label": datasets.ClassLabel(names=relations)})
        splits[split] = datasets.Dataset.from_dict(data, features=features)
    task = dataclasses.replace(task, text_columns=columns, num_labels=len(relations), label_names=tuple(relations),
                               new_tokens=tuple(sorted(markers)))
    return task, datasets.DatasetDict(splits)


def tacred_files(data_dir: str | None, train_file: str | None, validation_file: str | None) -> dict[str, Path]:
    if train_file or validation_file:
        if not (train_file and validation_file):
            raise ValueError(f"--task_name tacred: pass both --train_file and --validation_file ({LAYOUT_HELP}).")
        files = {"train": Path(train_file), "validation": Path(validation_file)}
    elif data_dir:
        files = {"train": Path(data_dir) / "train.json", "validation": Path(data_dir) / "dev.json"}
    else:
        raise ValueError(f"--task_name tacred: TACRED is distributed by the LDC (LDC2018T24), not the Hub: "
                         f"{LAYOUT_HELP}.")
    for split, path in files.items():
        if not path.is_file():
            raise FileNotFoundError(f"--task_name tacred: the {split} file {path} does not exist ({LAYOUT_HELP}).")
    return files


def read_tacred(path: Path) -> list[dict]:
    """The examples of a TACRED JSON file (a list, or one object a line), each checked: a missing or mistyped field,
    or a span outside the sentence, is named by its file, position and id."""
    text = path.read_text(encoding="utf-8")
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is neither TACRED's JSON (a list of examples) nor JSON lines: {error}.") from None
    if isinstance(rows, dict):
        rows = [rows]
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path} holds no TACRED examples: expected a JSON list of objects with "
                         f"{', '.join(FIELDS)}.")
    for row, example in enumerate(rows):
        problem = example_problem(example)
        if problem:
            name = f" (id {example.get('id')})" if isinstance(example, dict) and example.get("id") else ""
            raise ValueError(f"{path}, example {row}{name}: {problem}. Fix or drop that example.")
    return rows


def example_problem(example) -> str | None:
    if not isinstance(example, dict):
        return f"expected an object with {', '.join(FIELDS)}, got {type(example).__name__}"
    for name, kind in FIELDS.items():
        value = example.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"field {name!r} is {'missing' if value is None else repr(value)}, not {kind.__name__}"
    words = example["token"]
    if not words or not all(isinstance(word, str) for word in words):
        return "'token' must be a non-empty list of strings"
    for who in ("subj", "obj"):
        start, end = example[f"{who}_start"], example[f"{who}_end"]
        if not 0 <= start <= end < len(words):
            return (f"{who}_start {start} .. {who}_end {end} is not a span of its {len(words)} tokens (inclusive "
                    "indices from 0)")
    return None


def is_marker(word: str) -> bool:
    return word.startswith(("[SUBJ-", "[OBJ-")) and word.endswith("]")


def mark_entities(example: dict, mode: str) -> tuple[str, ...]:
    """The example's text(s) with its entities marked as `run_tacred.py`'s `convert_examples_to_features` does, at
    the word level (words joined by spaces; the tokenizer splits them after). PTB brackets (-LRB-) become ( as
    there."""
    words = [PTB_BRACKETS.get(word.lower(), word) for word in example["token"]]
    subj = (example["subj_start"], example["subj_end"])
    obj = (example["obj_start"], example["obj_end"])
    subj_type, obj_type = f"[SUBJ-{example['subj_type']}]", f"[OBJ-{example['obj_type']}]"
    marked = []
    for i, word in enumerate(words):
        if mode == "ner":
            if i == subj[0]:
                marked.append(subj_type)
            if i == obj[0]:
                marked.append(obj_type)
            if not (subj[0] <= i <= subj[1] or obj[0] <= i <= obj[1]):
                marked.append(word)
        else:
            if i == subj[0]:
                marked.append("[SUBJ-START]")
            if i == obj[0]:
                marked.append("[OBJ-START]")
            marked.append(word)
            if i == subj[1]:
                marked.append("[SUBJ-END]")
            if i == obj[1]:
                marked.append("[OBJ-END]")
    sentence = " ".join(marked)
    return (sentence, f"{subj_type} {obj_type}") if mode == "text_ner" else (sentence,)
