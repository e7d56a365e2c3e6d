"""BERTAC's pretraining data: entity-masked Wikipedia sentences, the CNN's word tokenizer and its fastText vectors.

- Pages stream lazily out of a MediaWiki XML dump (`.xml` or `.bz2`; the embedded default is the real enwiki
  excerpt shipped by gensim) into an on-disk `datasets.Dataset`, so a full dump never sits in memory.
- A `datasets.map` (any `num_proc`) turns each page's wikitext into plain sentences with the character spans of
  their internal links (`mwparserfromhell`); a second one draws ONE link mention per sentence, from the seed and the
  sentence alone, and replaces it whole by `[EM]` (paper Section 3.1).
- Words follow one rule everywhere (GAN data, fastText text, the CNN vocabulary, BERTAC's inputs): BERT's basic
  tokenisation, i.e. lowercase, strip accents, split on whitespace and punctuation (`tokenizers`' `BertNormalizer`
  + `BertPreTokenizer`). The CNN's vocabulary is a `PreTrainedTokenizerFast` (`WordLevel`) with `[PAD]`, `[UNK]` and
  `[EM]`, saved with every export.
- Word vectors are trained with fastText on the pretraining sentences (or read from a user's `.bin`/`.vec`) and
  cached under the output folder, keyed by everything that determines them.
"""

from __future__ import annotations

import bz2
import hashlib
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import datasets
import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from encoder_zoo.training.data.corpus import sentence_spans
from encoder_zoo.training.data.resources import resource_path

logger = logging.getLogger(__name__)

# `datasets` hashes module-level map functions by name, not code: the caches below are keyed by this file's source
# (and the parser's version) too, so a changed parser never reuses stale sentences.
_SOURCE_DIGEST = hashlib.blake2b(Path(__file__).read_bytes(), digest_size=8).hexdigest()

EMBEDDED_DUMP = "enwiki_excerpt"
WIKILINK_SOURCE = "wikilink"
PAD, UNK, ENTITY_MASK = "[PAD]", "[UNK]", "[EM]"
SPECIAL_TOKENS = [PAD, UNK, ENTITY_MASK]

# Links whose target has one of these prefixes are not entity mentions (files, categories, other wikis, ...).
NAMESPACES = {
    "media", "special", "talk", "user", "user talk", "wikipedia", "wikipedia talk", "wp", "project", "file", "image",
    "file talk", "image talk", "mediawiki", "template", "template talk", "help", "help talk", "category",
    "category talk", "portal", "portal talk", "book", "draft", "education program", "timedtext", "module", "gadget",
    "topic", "wikt", "wiktionary", "w", "s", "q", "n", "b", "v", "m", "c", "commons", "meta", "wikisource",
    "wikiquote", "wikinews", "wikibooks", "wikiversity", "wikivoyage", "wikidata", "d", "species", "mw", "simple",
}
_LANGUAGE_PREFIX = re.compile(r"[a-z]{2,3}(-[a-z]{2,8})*")
# Content of these tags is not running text.
_DROPPED_TAGS = {
    "ref", "references", "table", "gallery", "math", "chem", "timeline", "score", "syntaxhighlight", "source", "pre",
    "code", "imagemap", "graph", "mapframe", "maplink", "hiero", "templatedata", "nowiki", "poem", "blockquote",
}
_LIST_MARKERS = ("*", "#", ":", ";", "|", "!", "{", "}")
_WHITESPACE = re.compile(r"\s+")
# Brackets left empty by removed templates ("Albedo ({{IPA}}) is" -> "Albedo () is") and the space before a
# comma or stop left by a removed reference.
_EMPTY_BRACKETS = re.compile(r"\(\s*[,;]?\s*\)|\[\s*\]")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+(?=[,.;:!?])")


# ----------------------------------------------------------------------------------------------------------- words
def word_tokenization_steps():
    """The one word rule: BERT's basic tokenisation (lowercase, strip accents, split on punctuation)."""
    from tokenizers import normalizers, pre_tokenizers

    return normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()


_NORMALIZER, _PRE_TOKENIZER = word_tokenization_steps()


def split_words(text: str) -> list[str]:
    """Words of `text` under the one rule (the CNN tokenizer gives the same words, plus `[EM]` kept whole)."""
    return [word for word, _ in _PRE_TOKENIZER.pre_tokenize_str(_NORMALIZER.normalize_str(text))]


def train_word_tokenizer(texts, vocab_size: int, min_frequency: int = 1,
                         model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """The CNN's word vocabulary: the `vocab_size` most frequent words of `texts` plus `[PAD]` (0), `[UNK]`, `[EM]`."""
    from tokenizers import Tokenizer, models, trainers

    normalizer, pre_tokenizer = word_tokenization_steps()
    tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=SPECIAL_TOKENS)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        unk_token=UNK,
        mask_token=ENTITY_MASK,
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=model_max_length,
    )


# ----------------------------------------------------------------------------------------------------------- pages
def dump_files(dataset: str | None) -> list[str]:
    """The MediaWiki XML dump files behind `--dataset` (default: the embedded enwiki excerpt)."""
    if dataset in (None, "", EMBEDDED_DUMP):
        return [str(resource_path("enwiki_xml"))]
    path = Path(dataset).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith((".xml", ".bz2")))
        if not files:
            raise FileNotFoundError(f"No MediaWiki XML dump (.xml or .xml.bz2) in {path}.")
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(
            f"Dataset path {dataset!r} does not exist. --model bertac_cnn reads MediaWiki XML dumps (.xml or .xml.bz2, "
            "e.g. enwiki-latest-pages-articles.xml.bz2 from dumps.wikimedia.org, or a folder of its parts); omit "
            f"--dataset for the embedded {EMBEDDED_DUMP!r}."
        )
    for file in files:
        with _open_dump(file) as stream:
            head = stream.read(4096)
        if b"<mediawiki" not in head:
            raise ValueError(f"{file} is not a MediaWiki XML dump (no <mediawiki> element at its start).")
    return [str(file) for file in files]


class DamagedDumpError(ValueError):
    """A dump file that stops being well-formed XML (or bz2) part-way: named with the fix, not a `datasets` error."""


def _open_dump(path):
    with open(path, "rb") as raw:
        magic = raw.read(3)
    return bz2.open(path, "rb") if magic == b"BZh" else open(path, "rb")


def iter_article_pages(paths: list[str], max_pages: int | None = None, cache_key=None) -> Iterator[dict[str, str]]:
    """Articles (namespace 0, no redirects) of dump files, parsed lazily: `{"title", "wikitext"}` per page.

    `cache_key` is unused here; it keys `Dataset.from_generator`'s cache to the files (size, mtime) and this code.
    """
    count = 0
    for path in paths:
        with _open_dump(path) as stream:
            root = None
            try:
                for event, element in ElementTree.iterparse(stream, events=("start", "end")):
                    if root is None:
                        root = element
                    if event != "end" or element.tag.rsplit("}", 1)[-1] != "page":
                        continue
                    if element.findtext("{*}ns") == "0" and element.find("{*}redirect") is None:
                        yield {"title": element.findtext("{*}title") or "",
                               "wikitext": element.findtext("{*}revision/{*}text") or ""}
                        count += 1
                    root.clear()  # finished pages must not pile up under the root
                    if max_pages is not None and count >= max_pages:
                        return
            except (ElementTree.ParseError, EOFError, OSError) as error:
                raise DamagedDumpError(
                    f"--dataset: {path} is damaged after {count} article page{'' if count == 1 else 's'}, not "
                    f"well-formed MediaWiki XML ({type(error).__name__}: {error}); re-download the dump (check a .bz2 "
                    "with `bzip2 -t`), or pass --max_documents to stop before the damage."
                ) from None


def load_article_pages(dataset: str | None = None, max_documents: int | None = None,
                       num_proc: int | None = None) -> datasets.Dataset:
    """Stream a dump's articles into an on-disk Dataset (`title`, `wikitext`); several dump files load in parallel."""
    files = dump_files(dataset)
    stamps = [(Path(f).stat().st_size, Path(f).stat().st_mtime_ns) for f in files]
    try:
        pages = datasets.Dataset.from_generator(
            iter_article_pages,
            gen_kwargs={"paths": files, "max_pages": max_documents, "cache_key": (stamps, _SOURCE_DIGEST)},
            num_proc=min(num_proc or 1, len(files)) if len(files) > 1 else None,
            split="train",
        )
    except datasets.exceptions.DatasetGenerationError as error:
        cause = error
        while cause is not None and not isinstance(cause, DamagedDumpError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise DamagedDumpError(str(cause)) from None  # one line instead of the generator's wrapped traceback
    if max_documents is not None and len(pages) > max_documents:
        pages = pages.select(range(max_documents))
    if len(pages) == 0:
        raise ValueError(f"{dataset or EMBEDDED_DUMP!r} holds no article page (namespace 0, not a redirect).")
    return pages


# ------------------------------------------------------------------------------------------ wikitext -> sentences
def is_entity_link(target: str) -> bool:
    """An internal link to an article: no namespace, no other-wiki or language prefix, no bare section link."""
    target = target.strip()
    if not target or target.startswith(("#", ":")):
        return False
    if ":" in target:
        prefix = target.split(":", 1)[0].strip().lower()
        if prefix in NAMESPACES or _LANGUAGE_PREFIX.fullmatch(prefix):
            return False
    return True


def _render(code, pieces: list[str], links: list[tuple[int, int, str]], length: list[int]) -> None:
    """Append the running text of `code` to `pieces`, recording `(start, end, target)` of each entity link."""
    import mwparserfromhell.nodes as nodes

    def emit(text: str):
        pieces.append(text)
        length[0] += len(text)

    for node in code.nodes:
        if isinstance(node, nodes.Text):
            emit(str(node))
        elif isinstance(node, nodes.Wikilink):
            target = str(node.title)
            if not is_entity_link(target):
                continue
            start = length[0]
            _render(node.text if node.text is not None else node.title, pieces, links, length)
            links.append((start, length[0], target.split("#", 1)[0].strip()))
        elif isinstance(node, nodes.Tag):
            tag = str(node.tag).lower()
            if tag in ("li", "dt", "dd"):
                emit(str(node.wiki_markup or "*"))  # list lines are dropped below, as WikiExtractor does
            elif tag == "br":
                emit("\n")
            elif tag not in _DROPPED_TAGS and node.contents is not None:
                _render(node.contents, pieces, links, length)
        elif isinstance(node, nodes.HTMLEntity):
            emit(node.normalize())
        elif isinstance(node, nodes.ExternalLink):
            if node.title is not None:
                _render(node.title, pieces, links, length)
        elif isinstance(node, nodes.Heading):
            emit("\n\n")
        # Templates, comments, arguments: dropped.


def _rewrite(pattern: re.Pattern, replacement: str, text: str, offsets: np.ndarray) -> tuple[str, np.ndarray]:
    """`pattern.sub(replacement, text)`, moving character `offsets` along with the text they point into (an offset
    inside a replaced stretch moves into its replacement)."""
    matches = np.array([(m.start(), m.end()) for m in pattern.finditer(text)], dtype=np.int64).reshape(-1, 2)
    if not len(matches) or not len(offsets):
        return pattern.sub(replacement, text), offsets
    starts, ends = matches.T
    removed = np.concatenate([[0], np.cumsum(ends - starts - len(replacement))])
    before = np.searchsorted(ends, offsets, side="right")  # matches that end at or before each offset
    shifted = offsets - removed[before]
    following = np.minimum(before, len(starts) - 1)
    inside = (before < len(starts)) & (starts[following] < offsets)
    into = starts[following] - removed[before] + np.minimum(offsets - starts[following], len(replacement))
    return pattern.sub(replacement, text), np.where(inside, into, shifted)


def wikitext_sentences(wikitext: str) -> list[tuple[str, list[tuple[int, int, str]]]]:
    """Plain sentences of an article's paragraphs, each with the `(start, end, target)` of its entity links.

    A link's span covers its whole anchor plus MediaWiki's link trail (`[[bus]]es` is the mention "buses"). List,
    table and heading lines are not paragraphs; a sentence boundary never cuts a link.
    """
    import mwparserfromhell

    pieces: list[str] = []
    links: list[tuple[int, int, str]] = []
    _render(mwparserfromhell.parse(wikitext), pieces, links, [0])
    text = "".join(pieces)
    sentences = []
    position = 0
    for line in text.split("\n"):
        line_start, position = position, position + len(line) + 1
        stripped = line.strip()
        if not stripped or stripped.startswith(_LIST_MARKERS):
            continue
        line_links = [(s - line_start, e - line_start, t) for s, e, t in links
                      if line_start <= s and e <= line_start + len(line)]
        offsets = np.array([x for s, e, _ in line_links for x in (s, _trail_end(line, e))], dtype=np.int64)
        for pattern, replacement in ((_EMPTY_BRACKETS, ""), (_SPACE_BEFORE_PUNCTUATION, ""), (_WHITESPACE, " ")):
            line, offsets = _rewrite(pattern, replacement, line, offsets)
        spans = [(int(offsets[2 * i]), int(offsets[2 * i + 1]), t) for i, (_, _, t) in enumerate(line_links)]
        sentences.extend(_split_keeping_links(line, spans))
    return sentences


def _trail_end(line: str, end: int) -> int:
    """MediaWiki's link trail: lowercase letters right after a link belong to its text."""
    while end < len(line) and "a" <= line[end] <= "z":
        end += 1
    return end


def _split_keeping_links(line: str, links: list[tuple[int, int, str]]) -> list[tuple[str, list[tuple[int, int, str]]]]:
    spans: list[list[int]] = []
    for start, end in sentence_spans(line):
        if spans and any(s < start and e > spans[-1][1] for s, e, _ in links):
            spans[-1][1] = end  # a link straddles this boundary ("the [[U.S. Army]]"): one sentence
        else:
            spans.append([start, end])
    return [
        (line[start:end], [(s - start, e - start, t) for s, e, t in links if start <= s < e <= end])
        for start, end in spans
    ]


def page_sentences(batch: dict[str, list]) -> dict[str, list]:
    """`datasets.map` function: pages -> one row per sentence with its link mentions (character spans)."""
    out = {"title": [], "sentence": [], "mention_starts": [], "mention_ends": [], "mention_targets": []}
    for title, wikitext in zip(batch["title"], batch["wikitext"]):
        for sentence, links in wikitext_sentences(wikitext):
            out["title"].append(title)
            out["sentence"].append(sentence)
            out["mention_starts"].append([s for s, _, _ in links])
            out["mention_ends"].append([e for _, e, _ in links])
            out["mention_targets"].append([t for _, _, t in links])
    return out


def article_sentences(pages: datasets.Dataset, num_proc: int | None = None) -> datasets.Dataset:
    """Every paragraph sentence of the pages, with the spans of its entity links (cached by `datasets`)."""
    import mwparserfromhell

    return pages.map(page_sentences, batched=True, batch_size=16, remove_columns=pages.column_names, num_proc=num_proc,
                     new_fingerprint=_fingerprint(pages, "sentences", mwparserfromhell.__version__),
                     desc="Parsing wikitext")


def _fingerprint(dataset: datasets.Dataset, *parts) -> str:
    from datasets.fingerprint import Hasher

    return Hasher.hash([dataset._fingerprint, _SOURCE_DIGEST, *parts])


# ------------------------------------------------------------------------------------------------ sentence pairs
def draw_index(seed: int, key: str, count: int) -> int:
    """A uniform choice among `count` that depends only on the seed and the key (not on order or process)."""
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % count


def mask_one_mention(batch: dict[str, list], seed: int) -> dict[str, list]:
    """`datasets.map` function: each sentence with at least one link -> one (mention, masked sentence) pair."""
    out = {"title": [], "sentence": [], "entity": [], "masked": [], "target": [], "source": []}
    for title, sentence, starts, ends, targets in zip(
        batch["title"], batch["sentence"], batch["mention_starts"], batch["mention_ends"], batch["mention_targets"]
    ):
        if not starts:
            continue
        pick = draw_index(seed, f"{title}\x00{sentence}", len(starts))
        start, end = starts[pick], ends[pick]
        while start < end and sentence[start].isspace():
            start += 1
        while end > start and sentence[end - 1].isspace():
            end -= 1
        entity, masked = sentence[start:end], f"{sentence[:start]}{ENTITY_MASK}{sentence[end:]}"
        # A mention without words, or a sentence that is nothing but the mention, makes no pair.
        if not split_words(entity) or not split_words(sentence[:start] + " " + sentence[end:]):
            continue
        out["title"].append(title)
        out["sentence"].append(sentence)
        out["entity"].append(entity)
        out["masked"].append(masked)
        out["target"].append(targets[pick])
        out["source"].append(WIKILINK_SOURCE)
    return out


def entity_masked_pairs(pages: datasets.Dataset, seed: int, num_proc: int | None = None) -> datasets.Dataset:
    """Pairs of an entity mention `e` and its sentence `m` with that mention replaced whole by `[EM]`.

    Columns: `entity`, `masked`, `sentence` (unmasked), `title`, `target` (the linked article) and `source`
    ("wikilink": every pair here comes from a real internal link).
    """
    sentences = article_sentences(pages, num_proc)
    return sentences.map(mask_one_mention, batched=True, fn_kwargs={"seed": seed},
                         remove_columns=sentences.column_names,
                         num_proc=num_proc, new_fingerprint=_fingerprint(sentences, "pairs", seed),
                         desc="Masking one mention per sentence")


def encode_pairs(pairs: datasets.Dataset, tokenizer, max_words: int, num_proc: int | None = None) -> datasets.Dataset:
    """Word ids: `input_ids` (the masked sentence, cut to `max_words` around `[EM]`) and `entity_ids`."""
    mask_id = tokenizer.mask_token_id

    def encode(batch):
        # Every sequence is cut to `max_words` below (around [EM], so only once its word ids are known): transformers'
        # warning that a sequence is longer than the tokenizer's maximum (verbose) would name a length never used.
        sentences = tokenizer(batch["masked"], add_special_tokens=False, verbose=False)["input_ids"]
        entities = tokenizer(batch["entity"], add_special_tokens=False, verbose=False)["input_ids"]
        windows = []
        for ids in sentences:
            if len(ids) > max_words:
                middle = ids.index(mask_id) if mask_id in ids else 0
                start = min(max(middle - max_words // 2, 0), len(ids) - max_words)
                ids = ids[start : start + max_words]
            windows.append(ids)
        return {"input_ids": windows, "entity_ids": [ids[:max_words] for ids in entities]}

    return pairs.map(encode, batched=True, remove_columns=pairs.column_names, num_proc=num_proc, desc="Word ids")


class EntityPairCollator:
    """Pads the masked sentences (`input_ids`, `attention_mask`) and the mentions (`entity_ids`,
    `entity_attention_mask`) of a batch with `[PAD]`."""

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = 8):
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def _pad(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.tensor([len(ids) for ids in sequences])
        width = max(int(lengths.max()), 1)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        ids = torch.full((len(sequences), width), self.pad_token_id, dtype=torch.long)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = torch.as_tensor(sequence, dtype=torch.long)
        return ids, (torch.arange(width)[None, :] < lengths[:, None]).long()

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = self._pad([example["input_ids"] for example in examples])
        entity_ids, entity_attention_mask = self._pad([example["entity_ids"] for example in examples])
        return {"input_ids": input_ids, "attention_mask": attention_mask, "entity_ids": entity_ids,
                "entity_attention_mask": entity_attention_mask}


# ------------------------------------------------------------------------------------------------ word vectors
FASTTEXT_SETTINGS = {"model": "skipgram", "epoch": 5, "minCount": 3, "minn": 3, "maxn": 6, "bucket": 200_000,
                     "lr": 0.05, "ws": 5}

# fastText's Python binding fails ("Encountered NaN") on every second training in one process, so each training
# runs in a fresh interpreter that writes the standard .vec text format.
_FASTTEXT_TRAINING = """
import json, sys
import fasttext
text, out, dim, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
settings = json.loads(sys.argv[5])
model = fasttext.train_unsupervised(text, dim=dim, thread=threads, verbose=0, **settings)
words = model.get_words()
with open(out, "w", encoding="utf-8") as handle:
    handle.write(f"{len(words)} {dim}\\n")
    for word in words:
        handle.write(word + " " + " ".join(f"{x:.8g}" for x in model.get_word_vector(word)) + "\\n")
"""


def fasttext_vectors(sentences: datasets.Dataset, dim: int, cache_dir: str | Path, threads: int = 1) -> Path:
    """Train skipgram fastText vectors on the word-split sentences and return a `.vec` file of them, cached in
    `cache_dir` under a key of the text and every setting, so a resumed or repeated run reuses them.

    fastText is deterministic only on one thread (several threads race on shared weights): `threads=1`, the
    default, gives the same vectors for the same text; more threads are faster but not reproducible. (Its Python
    binding fixes the seed of unsupervised training at 0, so `--seed` does not change the vectors.)
    """
    import importlib.metadata
    import json
    import subprocess
    import sys

    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    text_path = cache_dir / "fasttext-input.txt"
    if importlib.util.find_spec("fasttext") is None:
        raise OSError("Training word vectors needs fastText: `pip install fasttext-numpy2`, or pass --word_vectors.")
    version = next((importlib.metadata.version(d) for d in ("fasttext-numpy2", "fasttext") if _installed(d)), "")
    digest = hashlib.blake2b(repr((sorted(FASTTEXT_SETTINGS.items()), dim, threads, version)).encode(), digest_size=16)
    with open(text_path, "w", encoding="utf-8") as handle:
        for batch in sentences.iter(batch_size=1000):
            lines = "".join(" ".join(split_words(s)) + "\n" for s in batch["sentence"])
            digest.update(lines.encode())
            handle.write(lines)
    vectors_path = cache_dir / f"fasttext-{dim}d-{digest.hexdigest()[:16]}.vec"
    if vectors_path.exists():
        logger.info("Reusing the fastText vectors %s", vectors_path)
    else:
        logger.info("Training %d-d fastText vectors on %s (%s, %d thread(s))", dim, text_path, FASTTEXT_SETTINGS,
                    threads)
        partial = vectors_path.with_suffix(".partial")
        result = subprocess.run(
            [sys.executable, "-c", _FASTTEXT_TRAINING, str(text_path), str(partial), str(dim), str(threads),
             json.dumps(FASTTEXT_SETTINGS)], capture_output=True, text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"fastText training failed: {result.stderr.strip().splitlines()[-1:]}")
        partial.rename(vectors_path)  # a run killed while writing never leaves a truncated cache behind
    text_path.unlink()
    return vectors_path


def frequent_word_coverage(tokenizer, vectors, top: int = 1000) -> tuple[int, int]:
    """(how many of the CNN's `top` most frequent words have a vector, how many there are). The word tokenizer
    numbers its words by frequency, after its special tokens."""
    ordered = sorted((index, word) for word, index in tokenizer.get_vocab().items() if word not in SPECIAL_TOKENS)
    frequent = [word for _, word in ordered[:top]]
    return sum(word in vectors for word in frequent), len(frequent)


def _installed(distribution: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


FASTTEXT_MAGIC = 793712314  # the first int32 of every fastText .bin model
WORD_VECTOR_FORMATS = ("a fastText .bin model, or a .vec text file (an optional 'count dim' header line, then "
                       "'word v1 ... vd' per line)")


def check_word_vectors(path: str | Path) -> None:
    """`--word_vectors` at parse time, before any corpus is read: an existing fastText `.bin` (its magic number) or a
    `.vec` whose first lines are words followed by numbers. Raises naming the flag, the file and the formats."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"--word_vectors {path}: no such file (a fastText .bin or .vec).")
    with open(path, "rb") as handle:
        head = handle.read(1 << 16)
    if path.suffix == ".bin":
        if len(head) < 4 or int.from_bytes(head[:4], "little") != FASTTEXT_MAGIC:
            raise ValueError(f"--word_vectors {path} is not a fastText .bin model (no fastText header); pass "
                             f"{WORD_VECTOR_FORMATS}, or drop --word_vectors to train vectors on the pretraining "
                             "sentences.")
        return
    lines = head.decode("utf-8", errors="replace").splitlines()[:5]
    if len(head) == 1 << 16:
        lines = lines[:-1]  # the last line read may be cut
    if not lines:
        raise ValueError(f"--word_vectors {path} is empty; pass {WORD_VECTOR_FORMATS}.")
    for number, line in enumerate(lines, start=1):
        problem = vector_line_problem(line, header=number == 1)
        if problem:
            raise ValueError(f"--word_vectors {path} is not a word-vector file: line {number} {problem}; pass "
                             f"{WORD_VECTOR_FORMATS}, or drop --word_vectors to train vectors on the pretraining "
                             "sentences.")


def vector_line_problem(line: str, header: bool = False) -> str | None:
    """Why a `.vec` line is not `word v1 ... vd` (nor, for the first line, a `count dim` header); None if it is."""
    line = line.rstrip()
    word, _, values = line.partition(" ")
    fields = values.split()
    if header and len(fields) == 1 and word.isdigit() and fields[0].isdigit():
        return None
    try:
        [float(value) for value in fields]
    except ValueError:
        return f"is not a word followed by numbers ({line[:60]!r})"
    return None if fields else f"holds no vector ({line[:60]!r})"


# Trained word vectors have components of order 1; beyond this they are damage (a NaN-free overflow), and a CNN's
# fp32 sums over them overflow within a few layers.
HUGE_WORD_VECTOR = 1e4


class WordVectors(dict):
    """The vectors of the wanted words (word -> array), with what was read: `path`, `dim` (of every vector line),
    `count` (vector lines read) and `header` ((count, dim) from a .vec header line, or None)."""

    path: Path
    dim: int | None = None
    count: int = 0
    header: tuple[int, int] | None = None


class DamagedWordVectors(ValueError):
    """A word-vector file that is not whole: rows of other lengths, fewer rows than its header says, or values that
    are NaN, infinite or huge. `problem` says which, naming lines."""

    def __init__(self, path: Path, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"--word_vectors {path}: {problem}; pass a whole file ({WORD_VECTOR_FORMATS}), e.g. download "
                         "it again.")


def read_word_vectors(path: str | Path, wanted: set[str]) -> WordVectors:
    """Vectors of the `wanted` words from a fastText `.bin` or a `.vec` text file. A file word counts under its
    normalised form (the one word rule), its first (most frequent) occurrence winning: cased vectors serve too.

    The whole file is checked on the way (`DamagedWordVectors`, naming the lines): every vector line has the same
    length (the header's, if any), there are as many as the header says, and the vectors used are finite and not
    huge."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"--word_vectors {path}: no such file (a fastText .bin or .vec).")
    found = WordVectors()
    found.path = path
    bad_values: list[str] = []

    def keep(word: str, vector, line: int | None):
        words = split_words(word)
        if len(words) == 1 and words[0] in wanted and words[0] not in found:
            array = (np.array(vector.split(), dtype=np.float32) if isinstance(vector, str)
                     else np.asarray(vector, dtype=np.float32))
            if not np.isfinite(array).all() or np.abs(array).max(initial=0) > HUGE_WORD_VECTOR:
                where = f"line {line} ({word!r})" if line else repr(word)
                what = "NaN/inf" if not np.isfinite(array).all() else f"values up to {np.abs(array).max():.3g}"
                bad_values.append(f"{where} holds {what}")
            found[words[0]] = array

    if path.suffix == ".bin":
        import fasttext

        model = fasttext.load_model(str(path))
        found.dim = model.get_dimension()
        for word in model.get_words():
            found.count += 1
            keep(word, model.get_word_vector(word), None)
    else:
        _read_vec(path, found, keep)
    if bad_values:
        more = f" (and {len(bad_values) - 1} more vectors)" if len(bad_values) > 1 else ""
        raise DamagedWordVectors(path, f"{bad_values[0]}{more}: word vectors must be finite numbers of order 1 (at "
                                 f"most {HUGE_WORD_VECTOR:g})")
    return found


def _read_vec(path: Path, found: WordVectors, keep) -> None:
    ragged: list[tuple[int, int]] = []  # (line, values) of the lines whose length differs from the file's
    first_line = None  # the first vector line, which fixes the length when there is no header
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            word, _, values = line.rstrip("\n").rstrip().partition(" ")
            if number == 1 and len(values.split()) == 1 and word.isdigit() and values.strip().isdigit():
                found.header = (int(word), int(values))  # the "count dim" header
                found.dim = found.header[1]
                continue
            if not word and not values:
                continue  # a blank line
            length = values.count(" ") + 1 if values else 0
            if length != found.dim:
                length = _vector_length(values)
                if found.dim is None and length:
                    found.dim, first_line = length, number
                elif length != found.dim:
                    ragged.append((number, length))
                    continue
            found.count += 1
            try:
                keep(word, values, number)
            except ValueError:
                raise ValueError(f"--word_vectors {path}: line {number} {vector_line_problem(line)}; pass "
                                 f"{WORD_VECTOR_FORMATS}.") from None
    if ragged:
        expected = (f"the header's {found.dim}" if found.header else f"the {found.dim} of line {first_line}")
        lines = ", ".join(f"line {n} has {k}" for n, k in ragged[:3])
        raise DamagedWordVectors(path, f"{len(ragged)} vector line{'s' if len(ragged) > 1 else ''} of another length "
                                 f"than {expected} values ({lines}{', ...' if len(ragged) > 3 else ''}): the file is "
                                 "ragged or cut mid-line")
    if found.header and found.header[0] != found.count:
        raise DamagedWordVectors(path, f"it holds {found.count:,} vectors but its header line says "
                                 f"{found.header[0]:,}: the file was cut short (or padded)")


def _vector_length(values: str) -> int:
    """How many numbers end a .vec line (a word with spaces in it, as some GloVe files have, is not counted)."""
    fields = values.split()
    count = 0
    for field in reversed(fields):
        try:
            float(field)
        except ValueError:
            break
        count += 1
    return count if count else len(fields)


def embedding_table(tokenizer, vectors: dict[str, np.ndarray], dim: int, seed: int) -> tuple[torch.Tensor, int]:
    """The frozen table: a word's fastText vector where there is one, else U(-0.1, 0.1) (seeded), and 0 for
    `[PAD]`, as the authors' `Generator` does. Returns the table and how many words had a vector."""
    vocabulary = tokenizer.get_vocab()
    table = torch.empty(len(vocabulary), dim).uniform_(-0.1, 0.1, generator=torch.Generator().manual_seed(seed))
    rows = [(index, vectors[word]) for word, index in vocabulary.items() if word in vectors]
    for index, vector in rows:
        if vector.shape != (dim,):
            source = getattr(vectors, "path", None)
            raise ValueError(f"Word vectors{f' in {source}' if source else ''} are {vector.shape[0]}-d but the CNN "
                             f"expects {dim}-d; pass --config_overrides word_embedding_dim={vector.shape[0]} (or "
                             f"{dim}-d vectors).")
    if rows:
        table[torch.tensor([i for i, _ in rows])] = torch.from_numpy(np.stack([v for _, v in rows]))
    table[tokenizer.pad_token_id] = 0.0
    return table, len(rows)
