"""Tokenizers: loading a trained one, or training a deterministic WordPiece or word-level one on a corpus."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PreTrainedTokenizerFast


def load_tokenizer(name: str, flag: str | None = None):
    """A tokenizer folder or Hub id; `flag` names where it comes from in the error (default `--tokenizer_name NAME`)."""
    from transformers import AutoTokenizer

    where = flag or f"--tokenizer_name {name}"
    if lacks_tokenizer_files(name):
        raise OSError(f"{where}: {name} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, vocab.txt, "
                      "...); pass the folder a tokenizer was saved to (its save_pretrained), or a Hub id.")
    try:
        tokenizer = without_loading_state(AutoTokenizer.from_pretrained(name))
    except (OSError, ValueError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise OSError(f"{where}: not a local tokenizer folder nor a loadable Hub id ({reason}); pass "
                      "--tokenizer_name PATH_OR_HUB_ID.") from None
    special = set(tokenizer.all_special_ids)
    if all(index in special for index in tokenizer.get_vocab().values()):
        names = ", ".join(tokenizer.all_special_tokens)
        raise OSError(f"{where}: its {len(tokenizer)} tokens are all special ({names}), so it reads any text as the "
                      "unknown token; pass a tokenizer trained on text.")
    return tokenizer


# What transformers' from_pretrained records in a tokenizer's init_kwargs about how this machine loaded it, and
# save_pretrained would write into tokenizer_config.json: a published folder would carry this machine's state. A loader
# overwrites both with its own (so from the Hub they do nothing), but they are not the model's.
LOADING_STATE = ("is_local", "local_files_only")


def without_loading_state(tokenizer):
    """`tokenizer`, its loading state (`LOADING_STATE`) dropped so that no folder it is saved to carries it."""
    for key in LOADING_STATE:
        tokenizer.init_kwargs.pop(key, None)
    return tokenizer


# The files that make a tokenizer (vocabulary, merges, special tokens, settings), and any sentencepiece `*.model`.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt")


def lacks_tokenizer_files(name: str | Path) -> bool:
    """Whether `name` is a local folder holding none of a tokenizer's files (transformers would then ask to install
    sentencepiece or tiktoken, as if a converter were what is missing)."""
    folder = Path(name).expanduser()
    return folder.is_dir() and not any((folder / file).is_file() for file in TOKENIZER_FILES) and not any(
        folder.glob("*.model"))


def tokenizer_files_digest(folder: str | Path) -> str | None:
    """A hash of the tokenizer files in `folder` (names and bytes; None when it holds none): what keys a reused
    tokenizer by its content, whatever path it was read from."""
    import hashlib

    folder = Path(folder).expanduser()
    files = sorted(p for p in folder.iterdir() if p.is_file() and (p.name in TOKENIZER_FILES or p.suffix == ".model")
                   ) if folder.is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def tokenizer_source_digest(name: str) -> str:
    """What a tokenizer named by `name` (a folder or a Hub id) is made of: the hash of its files (a Hub id's in the
    local cache), or the Hub id itself when no file can be found."""
    if not Path(name).expanduser().is_dir():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(name, "tokenizer_config.json")
        except ValueError:  # not a valid Hub id either: the loader names it
            cached = None
        if not isinstance(cached, str):
            return name
        name = str(Path(cached).parent)
    return tokenizer_files_digest(name) or name


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
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase,
                                                          strip_accents=False if not lowercase else None)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        return tokenizer

    probe = new_tokenizer()  # vocab_size 1: stops after the alphabet, before any merge
    probe.train_from_iterator(
        iter(texts), trainer=trainers.WordPieceTrainer(vocab_size=1, special_tokens=special, show_progress=False))
    continuations = sorted(t for t in probe.get_vocab() if t.startswith("##") and len(t) == 3)
    tokenizer = new_tokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=special + continuations)
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

    normalizer, pre_tokenizer = (normalizers.BertNormalizer(lowercase=False, strip_accents=False),
                                 pre_tokenizers.BertPreTokenizer())
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
