"""Token classification (NER) data for run_ner.py: tagged sentences from the Hub (`--dataset conll2003`) or from
local files, checked and turned into string tags, and their sub-token labels.

Files: JSON lines (`.json`/`.jsonl`, one sentence an object with a list of `tokens` and a list of string `ner_tags`),
or CoNLL column files (any other suffix: a token and its columns a line, whitespace-separated, the tag last, a blank
line between sentences, `-DOCSTART-` lines skipped; read by `datasets`' `conll` builder). Tags are `O`, `B-TYPE` or
`I-TYPE`: BIO (IOB2), or IOB1 as CoNLL-2003's original files tag them; the scorer reads both as conlleval does.
No labelled NER set ships in a package this project can install, so there is no embedded offline NER task.
"""

from __future__ import annotations

import re
from pathlib import Path

import datasets

# The Hub copy of CoNLL-2003 (English) that the name conll2003 stands for. Its main branch holds a loading script,
# which datasets >= 4 no longer runs: the Hub's Parquet conversion of it is read instead.
NER_HUB_IDS = {"conll2003": "eriktks/conll2003"}
HUB_REVISIONS = {"eriktks/conll2003": "refs/convert/parquet"}
TAG = re.compile(r"O|[BI]-\S+")
JSON_SUFFIXES = (".json", ".jsonl")
FILES_HELP = ("pass --train_file/--validation_file: JSON lines with 'tokens' and string 'ner_tags', or CoNLL column "
              "files (the tag in the last column)")


def load_ner(dataset: str | None, train_file: str | None, validation_file: str | None, tokens_column: str = "tokens",
             tags_column: str = "ner_tags") -> tuple[list[str], datasets.DatasetDict]:
    """The sorted tag names (the classifier's labels, as transformers' run_ner.py sorts them) and the `train` and
    `validation` splits, each sentence's `tokens` and string `ner_tags`, every row checked."""
    if train_file or validation_file:
        raw, where = read_files(train_file, validation_file, tokens_column, tags_column)
    else:
        raw, where = read_hub(dataset, tokens_column, tags_column)
    for split, data in raw.items():
        check_sentences(data, where[split])
    labels = sorted({tag for tags in raw["train"]["ner_tags"] for tag in tags})
    known = set(labels)
    for row, tags in enumerate(raw["validation"]["ner_tags"]):
        unknown = [tag for tag in tags if tag not in known]
        if unknown:
            raise ValueError(f"{where['validation']}, sentence {row}: tag {unknown[0]!r} never occurs in the training "
                             f"data (its tags: {', '.join(labels)}); the classifier cannot predict it. Fix or drop "
                             "that sentence.")
    return labels, raw


def read_files(train_file, validation_file, tokens_column, tags_column):
    from encoder_zoo.glue.tasks import checked_files

    files = checked_files(train_file, validation_file)
    where = {split: f"the {split} file {path}" for split, path in files.items()}
    splits = {}
    for split, path in files.items():
        if Path(path).suffix.lower() in JSON_SUFFIXES:
            data = datasets.load_dataset("json", data_files={split: path})[split]
            words, tags = tokens_column, tags_column
            for column, flag in ((words, "--tokens_column"), (tags, "--tags_column")):
                if column not in data.column_names:
                    raise ValueError(f"Column {column!r} not found in {where[split]}; its columns are "
                                     f"{data.column_names}. Set {flag} to the column to read.")
        else:
            columns = conll_columns(Path(path))
            data = datasets.load_dataset("conll", data_files={split: path}, column_names=columns)[split]
            words, tags = columns[0], columns[-1]
        splits[split] = as_tokens_and_tags(data, words, tags)
    return datasets.DatasetDict(splits), where


def conll_columns(path: Path) -> list[str]:
    """Column names for a CoNLL file from its first token line: the token, the middle columns, the tag last."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip() and not line.startswith("-DOCSTART-"):
                count = len(line.split())
                break
        else:
            raise ValueError(f"{path} holds no tagged tokens: a CoNLL file has a token and its tag a line.")
    if count < 2:
        raise ValueError(f"{path}: its first token line {line.strip()!r} has no tag column; a CoNLL file has the "
                         "token first and the tag last, whitespace-separated (JSON lines need a .jsonl suffix).")
    return ["tokens", *(f"column_{i}" for i in range(1, count - 1)), "ner_tags"]


def read_hub(dataset: str | None, tokens_column: str, tags_column: str):
    from encoder_zoo.glue.tasks import load_hub_dataset

    if not dataset:
        raise ValueError(f"Name --dataset (e.g. conll2003), or {FILES_HELP}.")
    hub_id = NER_HUB_IDS.get(dataset, dataset)
    raw = load_hub_dataset(hub_id, None, f"--dataset {dataset}",
                           f"No labelled NER set ships with this project's packages: {FILES_HELP}.",
                           revision=HUB_REVISIONS.get(hub_id))
    for split in ("train", "validation"):
        if split not in raw:
            raise ValueError(f"--dataset {dataset} ({hub_id}) has no {split} split; it has {', '.join(raw)}.")
    splits = {}
    for split in ("train", "validation"):
        data = raw[split]
        for column in (tokens_column, tags_column):
            if column not in data.column_names:
                raise ValueError(f"--dataset {dataset}: column {column!r} not found; its columns are "
                                 f"{data.column_names}. Set --tokens_column/--tags_column.")
        data = data.select_columns([tokens_column, tags_column])
        feature = data.features[tags_column]
        names = getattr(getattr(feature, "feature", None), "names", None)  # Sequence(ClassLabel): ids to tag names
        if names:
            data = data.map(lambda batch: {tags_column: [[names[i] for i in tags] for tags in batch[tags_column]]},
                            batched=True, features=datasets.Features({
                                tokens_column: data.features[tokens_column],
                                tags_column: datasets.Sequence(datasets.Value("string"))}))
        splits[split] = as_tokens_and_tags(data, tokens_column, tags_column)
    return datasets.DatasetDict(splits), {split: f"--dataset {dataset} ({split})" for split in splits}


def as_tokens_and_tags(data: datasets.Dataset, words: str, tags: str) -> datasets.Dataset:
    data = data.select_columns([words, tags])
    return data.rename_columns({old: new for old, new in ((words, "tokens"), (tags, "ner_tags")) if old != new})


def check_sentences(data: datasets.Dataset, where: str) -> None:
    """Every sentence has words (strings) and one tag (O, B-X or I-X) per word; else name the sentence and the word."""
    if len(data) == 0:
        raise ValueError(f"{where} has no sentences.")
    for row, (tokens, tags) in enumerate(zip(data["tokens"], data["ner_tags"])):
        if not isinstance(tokens, list) or not tokens or not all(isinstance(token, str) for token in tokens):
            raise ValueError(f"{where}, sentence {row}: 'tokens' must be a non-empty list of words (strings), got "
                             f"{short(tokens)}. Fix or drop that sentence.")
        if not isinstance(tags, list) or len(tags) != len(tokens):
            raise ValueError(f"{where}, sentence {row}: {len(tokens)} words but "
                             f"{len(tags) if isinstance(tags, list) else short(tags)} tags; give one tag per word.")
        for position, tag in enumerate(tags):
            if not isinstance(tag, str) or not TAG.fullmatch(tag):
                raise ValueError(f"{where}, sentence {row}, word {position} ({tokens[position]!r}): tag {tag!r} is "
                                 "not O, B-TYPE or I-TYPE (BIO or IOB1 tags as strings). Fix that tag.")


def short(value, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def align_labels(word_ids: list[int | None], tags: list[str], label2id: dict[str, int],
                 label_all_tokens: bool) -> list[int]:
    """One label per sub-token, as transformers' run_ner.py aligns them: the word's tag on its first sub-token; on
    the others -100 (not trained), or with `label_all_tokens` the word's tag again, B- turned into I- where the
    labels have that I- tag. Special tokens get -100."""
    labels, previous = [], None
    for word in word_ids:
        if word is None:
            labels.append(-100)
        elif word != previous:
            labels.append(label2id[tags[word]])
        elif label_all_tokens:
            tag = tags[word]
            inside = "I-" + tag[2:] if tag.startswith("B-") else tag
            labels.append(label2id.get(inside, label2id[tag]))
        else:
            labels.append(-100)
        previous = word
    return labels


def first_sub_tokens(word_ids: list[int | None]) -> list[int]:
    """The position of each word's first sub-token, word by word (shorter than the sentence where the tokenizer cut
    it to --max_seq_length)."""
    positions, previous = [], None
    for position, word in enumerate(word_ids):
        if word is not None and word != previous:
            positions.append(position)
        previous = word
    return positions
