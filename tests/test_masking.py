"""Span masking statistics and invariants on real Wikipedia blocks."""

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from encoder_zoo.training.data.blocks import add_example_index, pack_blocks, unigram_distribution
from encoder_zoo.training.data.corpus import load_corpus
from encoder_zoo.training.data.resources import minilm_path
from encoder_zoo.training.masking.spans import SpanMaskingCollator, truncated_geometric_probs


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def blocks(tokenizer):
    corpus = load_corpus(max_documents=1500)
    packed = add_example_index(pack_blocks(corpus, tokenizer, max_seq_length=512))
    return [packed[i] for i in range(len(packed)) if len(packed[i]["input_ids"]) > 128][:192]


@pytest.fixture(scope="module")
def unigram(tokenizer, blocks):
    import datasets

    return unigram_distribution(datasets.Dataset.from_list(blocks), len(tokenizer), tokenizer.all_special_ids)


def runs(mask_row):
    """(start, end) of maximal runs of True."""
    padded = np.concatenate([[False], mask_row, [False]])
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return list(zip(edges[::2], edges[1::2]))


def collate(collator, blocks, batch=32):
    return [collator(blocks[i : i + batch]) for i in range(0, len(blocks), batch)]


def test_truncated_geometric_mean_is_the_papers_3_8():
    probs = truncated_geometric_probs(0.2, 10)
    assert probs.sum() == pytest.approx(1.0)
    assert (np.arange(1, 11) * probs).sum() == pytest.approx(3.8, abs=0.01)


def test_sampled_span_lengths_follow_the_distribution(tokenizer):
    collator = SpanMaskingCollator(tokenizer, random_token_distribution="uniform", seed=0)
    lengths = collator.span_lengths(np.random.default_rng(0).random(200_000))
    assert lengths.min() == 1 and lengths.max() == 10
    assert lengths.mean() == pytest.approx(3.8, abs=0.03)
    observed = np.bincount(lengths, minlength=11)[1:] / len(lengths)
    np.testing.assert_allclose(observed, truncated_geometric_probs(0.2, 10), atol=0.005)


@pytest.mark.parametrize("scheme", ["subword", "whole_word", "span"])
def test_budget_is_fifteen_percent_of_word_pieces(tokenizer, blocks, unigram, scheme):
    collator = SpanMaskingCollator(tokenizer, scheme=scheme, unigram_probs=unigram, seed=1)
    for batch in collate(collator, blocks):
        masked = (batch["labels"] != -100).numpy()
        text_tokens = batch["attention_mask"].numpy().sum(1) - 2  # [CLS], [SEP]
        budget = np.ceil(0.15 * text_tokens)
        # Exact budget (token-by-token enforcement); rarely a touch under when candidates run out.
        assert (masked.sum(1) <= budget).all()
        assert masked.sum() / budget.sum() > 0.99
        structural = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}  # [UNK] is text (see below)
        assert not np.isin(batch["labels"].numpy()[masked], list(structural)).any()
        assert not (masked & ~batch["attention_mask"].numpy().astype(bool)).any()


def word_starts(blocks, batch_index, batch, width):
    ws = np.zeros((len(blocks[batch_index : batch_index + batch]), width), dtype=bool)
    for row, example in enumerate(blocks[batch_index : batch_index + batch]):
        ws[row, : len(example["word_start"])] = example["word_start"]
    return ws


def test_spans_start_at_word_starts_and_mean_length_is_near_3_8_words(tokenizer, blocks, unigram):
    collator = SpanMaskingCollator(tokenizer, scheme="span", unigram_probs=unigram, seed=2)
    lengths, starts_ok = [], []
    for index in range(0, len(blocks), 32):
        batch = collator(blocks[index : index + 32])
        masked = (batch["labels"] != -100).numpy()
        ws = word_starts(blocks, index, 32, masked.shape[1])
        for row in range(masked.shape[0]):
            for start, end in runs(masked[row]):
                starts_ok.append(ws[row, start])
                # Whole words except the budget's last, token-by-token cut: count words by their starts.
                lengths.append(ws[row, start:end].sum())
    assert np.mean(starts_ok) == 1.0
    # Merging adjacent spans lengthens runs, the budget cut shortens the last one: both small at 15%.
    assert 3.3 < np.mean(lengths) < 4.4, np.mean(lengths)


def test_whole_word_masks_complete_words(tokenizer, blocks, unigram):
    collator = SpanMaskingCollator(tokenizer, scheme="whole_word", unigram_probs=unigram, seed=3)
    batch = collator(blocks[:32])
    masked = (batch["labels"] != -100).numpy()
    ws = word_starts(blocks, 0, 32, masked.shape[1])
    text = batch["attention_mask"].numpy().astype(bool) & ~np.isin(batch["labels"].numpy(), tokenizer.all_special_ids)
    complete = 0
    for row in range(masked.shape[0]):
        for start, end in runs(masked[row]):
            assert ws[row, start]
            complete += (end >= masked.shape[1]) or ws[row, end] or not text[row, end] or not masked[row, end]
    assert complete > 0


def test_80_10_10_is_decided_once_per_span(tokenizer, blocks, unigram):
    collator = SpanMaskingCollator(tokenizer, scheme="span", unigram_probs=unigram, seed=4)
    kinds = {"mask": 0, "keep": 0, "random": 0}
    mixed = 0
    for batch in collate(collator, blocks):
        masked = (batch["labels"] != -100).numpy()
        inputs, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
        for row in range(masked.shape[0]):
            for start, end in runs(masked[row]):
                is_mask = inputs[row, start:end] == tokenizer.mask_token_id
                is_keep = inputs[row, start:end] == labels[row, start:end]
                if is_mask.all():
                    kinds["mask"] += 1
                elif is_keep.all():
                    kinds["keep"] += 1
                elif not is_mask.any() and (~is_keep).sum() >= 1:
                    kinds["random"] += 1  # a random draw may equal the original now and then
                else:
                    mixed += 1
    total = sum(kinds.values())
    assert mixed == 0
    assert kinds["mask"] / total == pytest.approx(0.8, abs=0.04)
    assert kinds["keep"] / total == pytest.approx(0.1, abs=0.03)
    assert kinds["random"] / total == pytest.approx(0.1, abs=0.03)


def test_random_replacements_follow_the_unigram_distribution(tokenizer, blocks, unigram):
    collator = SpanMaskingCollator(tokenizer, scheme="subword", unigram_probs=unigram, mask_replace_prob=0.0,
                                   random_replace_prob=1.0, seed=5)
    drawn = np.concatenate([b["input_ids"].numpy()[(b["labels"] != -100).numpy()] for b in collate(collator, blocks)])
    assert not np.isin(drawn, tokenizer.all_special_ids).any()
    top = np.argsort(unigram)[::-1][:20]
    # The corpus's most frequent pieces dominate the draws, as they dominate the corpus.
    assert np.isin(drawn, top).mean() == pytest.approx(unigram[top].sum(), abs=0.05)
    uniform = SpanMaskingCollator(tokenizer, scheme="subword", random_token_distribution="uniform",
                                  mask_replace_prob=0.0, random_replace_prob=1.0, seed=5)
    drawn_uniform = np.concatenate([b["input_ids"].numpy()[(b["labels"] != -100).numpy()]
                                    for b in collate(uniform, blocks)])
    assert np.isin(drawn_uniform, top).mean() < 0.01


def test_sbo_targets_use_outside_boundaries_and_skip_edge_spans(tokenizer, blocks, unigram):
    collator = SpanMaskingCollator(tokenizer, scheme="span", unigram_probs=unigram, seed=6)
    seen_edge = 0
    for batch in collate(collator, blocks):
        masked = (batch["labels"] != -100).numpy()
        left, right = batch["span_left"].numpy(), batch["span_right"].numpy()
        text = batch["attention_mask"].numpy().astype(bool)
        for row in range(masked.shape[0]):
            length = int(text[row].sum())
            for start, end in runs(masked[row]):
                touches_edge = start == 1 or end == length - 1
                if touches_edge:
                    seen_edge += 1
                    assert (left[row, start:end] == -1).all()
                else:  # every token of the merged span; the model drops those past config.max_span_targets
                    assert (left[row, start:end] == start - 1).all()
                    assert (right[row, start:end] == end).all()
        assert ((left >= 0) <= masked).all()
    assert seen_edge > 0


@pytest.mark.parametrize("scheme", ["subword", "span"])
def test_masks_are_a_function_of_seed_epoch_and_example_only(tokenizer, blocks, unigram, scheme):
    """The same example gets the same mask whatever shares its batch or the padding width; a new mask each epoch
    (dynamic masking); another under another seed; held-out masks ignore the epoch."""
    collator = SpanMaskingCollator(tokenizer, scheme=scheme, unigram_probs=unigram, seed=7)
    alone = [collator([example]) for example in blocks[:8]]
    mixed = collator(blocks[:8][::-1] + blocks[100:108])  # reversed, other rows, another padding width
    for row, single in enumerate(alone):
        length = int(single["attention_mask"].sum())
        for key in single:
            assert torch.equal(single[key][0, :length], mixed[key][7 - row, :length]), key
    epoch_0 = collator(blocks[:16])["labels"]
    collator.set_epoch(1)
    epoch_1 = collator(blocks[:16])["labels"]
    assert not torch.equal(epoch_0, epoch_1)
    assert ((epoch_0 != -100) != (epoch_1 != -100)).float().mean() > 0.1  # not a shifted copy: fresh draws
    other_seed = SpanMaskingCollator(tokenizer, scheme=scheme, unigram_probs=unigram, seed=8)
    assert not torch.equal(other_seed(blocks[:16])["labels"], epoch_0)
    held_out = collator.for_evaluation()
    first = held_out(blocks[:16])["labels"]
    collator.set_epoch(5)
    assert torch.equal(first, held_out(blocks[:16])["labels"])
    assert torch.equal(first, collator.for_evaluation()(blocks[:16])["labels"])
    assert not torch.equal(first, epoch_0)  # its own stream, not training epoch 0's masks


def test_sampler_draws_are_keyed_like_the_masks_and_leave_them_unchanged(tokenizer, blocks, unigram):
    """`sampler_draws` (TEAMS's generator) adds each position's own uniforms: the same whatever shares the batch or
    the padding width, in [0, 1), new each epoch, fixed for held-out batches; the masks stay those drawn without
    them, and packing moves the draws with their tokens."""
    from encoder_zoo.training.data.packing import pack_batch

    plain = SpanMaskingCollator(tokenizer, scheme="subword", unigram_probs=unigram, seed=7)
    collator = SpanMaskingCollator(tokenizer, scheme="subword", unigram_probs=unigram, seed=7, sampler_draws=6)
    batch = collator(blocks[:8])
    for key, value in plain(blocks[:8]).items():
        assert torch.equal(value, batch[key]), key
    draws = batch["sampler_uniforms"]
    assert draws.shape == (*batch["input_ids"].shape, 6) and draws.dtype == torch.float32
    real = batch["attention_mask"].bool()
    assert (draws[real] >= 0).all() and (draws[real] < 1).all() and (draws[~real] == 0).all()
    assert abs(draws[real].mean().item() - 0.5) < 0.01
    mixed = collator(blocks[:8][::-1] + blocks[100:104])
    for row in range(8):
        length = int(batch["attention_mask"][row].sum())
        assert torch.equal(draws[row, :length], mixed["sampler_uniforms"][7 - row, :length])
    packed = pack_batch(batch)
    assert torch.equal(packed["sampler_uniforms"][0], draws[real])
    held_out = collator.for_evaluation()(blocks[:8])["sampler_uniforms"]
    collator.set_epoch(1)
    assert not torch.equal(collator(blocks[:8])["sampler_uniforms"], draws)
    assert torch.equal(collator.for_evaluation()(blocks[:8])["sampler_uniforms"], held_out)
    assert not torch.equal(held_out, draws)


@pytest.mark.parametrize("persistent", [False, True])
def test_dataloader_workers_see_the_epoch_and_draw_the_same_masks(tokenizer, blocks, unigram, persistent):
    import datasets

    data = datasets.Dataset.from_list(blocks[:24])
    collator = SpanMaskingCollator(tokenizer, scheme="span", unigram_probs=unigram, seed=11)

    def epochs(num_workers):
        loader = torch.utils.data.DataLoader(data, batch_size=8, collate_fn=collator, num_workers=num_workers,
                                             persistent_workers=persistent and num_workers > 0)
        seen = []
        for epoch in range(2):
            collator.set_epoch(epoch)
            seen.append(torch.cat([batch["labels"].flatten() for batch in loader]))
        return seen

    in_process, in_workers = epochs(0), epochs(2)
    assert all(torch.equal(a, b) for a, b in zip(in_process, in_workers))
    assert not torch.equal(in_workers[0], in_workers[1])  # epoch 2's masks are new, with workers too


def test_unk_is_masked_like_any_text_token_and_the_budget_is_met(tokenizer, blocks, unigram):
    """The authors' code masks [UNK] like any other token: it is maskable, part of its word and a valid SBO
    boundary, so a block always gets its full 15% budget."""
    unk = tokenizer.unk_token_id
    examples = []
    for example in blocks[:64]:
        ids = list(example["input_ids"])
        ids[3:-3:7] = [unk] * len(ids[3:-3:7])  # every 7th text token becomes [UNK]
        examples.append({**example, "input_ids": ids})
    collator = SpanMaskingCollator(tokenizer, scheme="span", unigram_probs=unigram, seed=12)
    masked_unk = boundary_unk = 0
    for start in range(0, 64, 16):
        batch = collator(examples[start : start + 16])
        labels, left = batch["labels"].numpy(), batch["span_left"].numpy()
        masked = labels != -100
        budget = np.ceil(0.15 * (batch["attention_mask"].numpy().sum(1) - 2))
        assert (masked.sum(1) == budget).all()  # exactly the budget, every block
        masked_unk += (labels == unk).sum()
        inputs = batch["input_ids"].numpy()
        rows, cols = np.nonzero(left >= 0)
        boundary_unk += (inputs[rows, left[rows, cols]] == unk).sum()
    assert masked_unk > 50 and boundary_unk > 0


@pytest.mark.parametrize("scheme", ["named_entity", "noun_phrase"])
def test_linguistic_schemes_mask_whole_spacy_spans(tokenizer, scheme):
    corpus = load_corpus(max_documents=40)
    packed = add_example_index(pack_blocks(corpus, tokenizer, max_seq_length=256, annotate_spans=scheme))
    examples = [packed[i] for i in range(min(32, len(packed)))]
    collator = SpanMaskingCollator(tokenizer, scheme=scheme, random_token_distribution="uniform", seed=8)
    batch = collator(examples)
    masked = (batch["labels"] != -100).numpy()
    covered_units = fully_masked = 0
    for row, example in enumerate(examples):
        units = np.array(example["linguistic_span"])
        assert (units[[0, -1]] == -1).all()
        for unit in np.unique(units[units >= 0]):
            positions = np.flatnonzero(units == unit)
            hit = masked[row, positions]
            covered_units += hit.any()
            fully_masked += hit.all()
    assert covered_units > 0
    # A unit is masked whole unless the budget cut it: most touched units are complete.
    assert fully_masked / covered_units > 0.6


def test_any_fast_tokenizer_works_bpe_without_wordpiece_markers():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    texts = load_corpus(max_documents=200)["text"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=800,
                                                       special_tokens=["<pad>", "<unk>", "<s>", "</s>", "<mask>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", unk_token="<unk>", cls_token="<s>",
                                        sep_token="</s>", mask_token="<mask>")
    packed = add_example_index(pack_blocks(load_corpus(max_documents=30), tokenizer, max_seq_length=128))
    example = packed[0]
    words = tokenizer.convert_ids_to_tokens(example["input_ids"])
    # Word starts come from word ids, not from '##': a BPE piece continuing a word is not a start.
    assert sum(example["word_start"]) < len(words) - 2
    batch = SpanMaskingCollator(tokenizer, scheme="span", random_token_distribution="uniform",
                                seed=9)([packed[i] for i in range(8)])
    masked = (batch["labels"] != -100).numpy()
    for row in range(8):
        ws = np.zeros(masked.shape[1], dtype=bool)
        ws[: len(packed[row]["word_start"])] = packed[row]["word_start"]
        for start, _ in runs(masked[row]):
            assert ws[start]


def test_collator_errors_are_clear(tokenizer):
    with pytest.raises(ValueError, match="Unknown masking scheme"):
        SpanMaskingCollator(tokenizer, scheme="random_words", random_token_distribution="uniform")
    with pytest.raises(ValueError, match="unigram_probs"):
        SpanMaskingCollator(tokenizer, scheme="span")
    collator = SpanMaskingCollator(tokenizer, scheme="span", random_token_distribution="uniform")
    with pytest.raises(ValueError, match="word_start"):
        collator([{"input_ids": [101, 2000, 102]}])
    with pytest.raises(ValueError, match="example_index"):
        collator([{"input_ids": [101, 2000, 102], "word_start": [0, 1, 0]}])
