"""How full the single-sequence blocks are: a block holds whole sentences of one document (SpanBERT's), so the
embedded lead sections fill a fraction of a 512-token block; the log says so, with its numbers, and is quiet about it
where the blocks are full."""

import logging

import datasets
import pytest
from transformers import AutoTokenizer

from encoder_zoo.training.data.blocks import pack_blocks
from encoder_zoo.training.data.corpus import load_corpus
from encoder_zoo.training.data.resources import minilm_path


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(minilm_path())


def test_short_documents_give_short_blocks_and_the_log_says_how_full(tokenizer, caplog):
    corpus = load_corpus(max_documents=200)
    with caplog.at_level(logging.INFO, logger="encoder_zoo.training.data.blocks"):
        long_blocks = pack_blocks(corpus, tokenizer, max_seq_length=512)
    lengths = [len(ids) for ids in long_blocks["input_ids"]]
    mean = sum(lengths) / len(lengths)
    assert len(long_blocks) >= len(corpus) - 5 and mean < 256  # about one block per lead section, never merged
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{len(long_blocks)} blocks of at most 512 tokens average {mean:.0f} ({100 * mean / 512:.0f}% full)" in \
        warning.getMessage() and "one document" in warning.getMessage()

    caplog.clear()
    two_documents = datasets.Dataset.from_dict({"text": [" ".join(["A short sentence of words here."] * 30)] * 2})
    with caplog.at_level(logging.INFO, logger="encoder_zoo.training.data.blocks"):
        full = pack_blocks(two_documents, tokenizer, max_seq_length=64)
    assert all(len(ids) > 32 for ids in full["input_ids"][:-1])
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("blocks of at most 64 tokens" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("annotate", [None, "named_entity"])
def test_the_backend_tokenizer_path_packs_what_transformers_call_packs(tokenizer, annotate):
    """The packer calls the `tokenizers` backend directly; a backend set to truncate (which transformers' call would
    switch off) takes transformers' call instead: both give the same blocks, word starts and spans."""
    import copy

    from encoder_zoo.training.data.blocks import block_packer
    from encoder_zoo.training.data.corpus import load_corpus

    texts = {"text": load_corpus(max_documents=120)["text"]}
    direct = block_packer(tokenizer, 64, annotate)(texts)
    wrapped = copy.deepcopy(tokenizer)
    wrapped.backend_tokenizer.enable_truncation(10**6)  # forces transformers' call, which disables it per call
    through_transformers = block_packer(wrapped, 64, annotate)(texts)
    assert direct == through_transformers
    assert sum(map(len, direct["input_ids"])) > 5_000 and any(0 in starts[1:-1] for starts in direct["word_start"])
    if annotate:
        assert any(max(units) >= 0 for units in direct["linguistic_span"])
