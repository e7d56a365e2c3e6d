"""Padding-free packed batches (`pretrain.py --packing`): the packed row gives the padded batch's losses and
gradients, SBO boundaries and TEAMS's per-position work included, and a packed pretraining run trains end to end.
(Models that cannot read packed rows are refused: tests/test_bad_input.py.)"""

import json

import pytest
import torch
from helpers import pretrain
from transformers import AutoTokenizer

from encoder_zoo import models  # noqa: F401  (registers the families)
from encoder_zoo.models.spanbert.configuration_spanbert import SpanBertConfig
from encoder_zoo.models.spanbert.modeling_spanbert import SpanBertForPreTraining
from encoder_zoo.models.teams.configuration_teams import TeamsConfig
from encoder_zoo.models.teams.modeling_teams import TeamsForPreTraining
from encoder_zoo.training.data.blocks import add_example_index, pack_blocks
from encoder_zoo.training.data.corpus import load_corpus
from encoder_zoo.training.data.packing import PackedBatchCollator, pack_batch
from encoder_zoo.training.data.resources import minilm_path
from encoder_zoo.training.masking.spans import SpanMaskingCollator

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def blocks(tokenizer):
    """Real Wikipedia blocks of 64 word pieces at most, of many lengths (document tails are short)."""
    return add_example_index(pack_blocks(load_corpus(max_documents=40), tokenizer, max_seq_length=64))


def varied_batch(blocks, size=6):
    """`size` blocks of different lengths, so the padded batch really has padding."""
    by_length = sorted(range(len(blocks)), key=lambda i: len(blocks[i]["input_ids"]))
    picks = [by_length[round(k * (len(by_length) - 1) / (size - 1))] for k in range(size)]
    return [blocks[i] for i in picks]


def spanbert(tokenizer, sbo=True, attn="sdpa", **overrides):
    torch.manual_seed(0)
    config = SpanBertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64, use_span_boundary_objective=sbo,
                            **NO_DROPOUT, **overrides)
    config._attn_implementation = attn
    return SpanBertForPreTraining(config)


def teams(tokenizer, attn="sdpa", **overrides):
    torch.manual_seed(0)
    config = TeamsConfig(vocab_size=len(tokenizer), embedding_size=16, hidden_size=32, num_hidden_layers=4,
                         num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, **NO_DROPOUT,
                         **overrides)
    config._attn_implementation = attn
    return TeamsForPreTraining(config)


def losses_and_gradients(model, batch, seed=0):
    torch.manual_seed(seed)  # TEAMS samples: the same draws in the same (row-major) order for both layouts
    out = model(**batch)
    out.loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return {k: v.detach() for k, v in out.items() if k.endswith("loss") or k.endswith("accuracy")}, gradients


def assert_same_training_signal(model, padded, packed):
    padded_losses, padded_gradients = losses_and_gradients(model, padded)
    packed_losses, packed_gradients = losses_and_gradients(model, packed)
    assert padded_losses.keys() == packed_losses.keys()
    for name in padded_losses:
        torch.testing.assert_close(packed_losses[name], padded_losses[name], rtol=1e-5, atol=1e-6, msg=name)
    assert padded_gradients.keys() == packed_gradients.keys()
    for name in padded_gradients:
        torch.testing.assert_close(packed_gradients[name], padded_gradients[name], rtol=1e-4, atol=1e-6, msg=name)


def test_pack_batch_concatenates_real_tokens_and_shifts_span_boundaries(tokenizer, blocks):
    collator = SpanMaskingCollator(tokenizer, random_token_distribution="uniform", seed=1)
    examples = varied_batch(blocks)
    padded = collator(examples)
    packed = pack_batch(padded)
    lengths = padded["attention_mask"].sum(1)
    total = int(lengths.sum())
    assert padded["input_ids"].numel() > total  # there was padding to drop
    assert "attention_mask" not in packed and packed["input_ids"].shape == (1, total)
    assert packed["cu_seq_lens_q"].tolist() == [0, *lengths.cumsum(0).tolist()]
    assert packed["max_length_q"] == int(lengths.max()) and packed["cu_seq_lens_k"] is packed["cu_seq_lens_q"]
    real = padded["attention_mask"].bool()
    assert torch.equal(packed["input_ids"][0], padded["input_ids"][real])
    assert torch.equal(packed["labels"][0], padded["labels"][real])
    starts = packed["cu_seq_lens_q"][:-1].long()
    for row, start in enumerate(starts.tolist()):
        length = int(lengths[row])
        assert packed["position_ids"][0, start : start + length].tolist() == list(range(length))
        for key in ("span_left", "span_right"):
            boundaries = padded[key][row, :length]
            expected = torch.where(boundaries >= 0, boundaries + start, -1)
            assert torch.equal(packed[key][0, start : start + length], expected)
    # Every SBO boundary stays inside its own example.
    targets = packed["span_left"][0] >= 0
    owner = torch.bucketize(torch.arange(total), packed["cu_seq_lens_q"][1:].long(), right=True)
    for key in ("span_left", "span_right"):
        assert torch.equal(owner[packed[key][0][targets]], owner[targets])


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("sbo", [True, False], ids=["spanbert", "bert"])
def test_packed_spanbert_batch_gives_the_padded_losses_and_gradients(tokenizer, blocks, sbo, attn):
    collator = SpanMaskingCollator(tokenizer, scheme="span" if sbo else "subword", random_token_distribution="uniform",
                                   span_boundary_targets=sbo, seed=3)
    padded = collator(varied_batch(blocks))
    model = spanbert(tokenizer, sbo=sbo, attn=attn)
    assert_same_training_signal(model, padded, pack_batch(padded))
    if sbo:
        out = model(**pack_batch(padded))
        assert out.sbo_logits.shape[0] == int((padded["span_left"] >= 0).sum())  # every SBO target kept


@pytest.mark.parametrize("overrides", [{}, {"task_heads_on_layer": "last"},
                                       {"pretraining_tasks": "rtd", "task_head_type": "ffn"}],
                         ids=["teams", "teams-heads-on-last", "electra-heads"])
def test_packed_teams_batch_gives_the_padded_losses_and_gradients(tokenizer, blocks, overrides):
    collator = SpanMaskingCollator(tokenizer, scheme="subword", random_token_distribution="uniform",
                                   span_boundary_targets=False, seed=5)
    padded = collator(varied_batch(blocks))
    model = teams(tokenizer, **overrides)
    assert_same_training_signal(model, padded, pack_batch(padded))
    # The same generator samples in both layouts: the corrupted tokens match position for position.
    torch.manual_seed(0)
    padded_out = model(**padded)
    torch.manual_seed(0)
    packed_out = model(**pack_batch(padded))
    real = padded["attention_mask"].bool()
    assert torch.equal(packed_out.corrupted_input_ids[0], padded_out.corrupted_input_ids[real])


def test_packed_row_keeps_examples_apart(tokenizer, blocks):
    """Changing one example changes no other example's outputs: no attention across packed examples."""
    collator = SpanMaskingCollator(tokenizer, random_token_distribution="uniform", seed=3)
    packed = pack_batch(collator(varied_batch(blocks, size=3)))
    model = spanbert(tokenizer).eval()
    first_end = int(packed["cu_seq_lens_q"][1])
    changed = {**packed, "input_ids": packed["input_ids"].clone()}
    changed["input_ids"][0, 1:first_end] = tokenizer.mask_token_id
    with torch.no_grad():
        hidden = model.spanbert(packed["input_ids"], position_ids=packed["position_ids"]).last_hidden_state
        hidden_changed = model.spanbert(changed["input_ids"], position_ids=packed["position_ids"]).last_hidden_state
    assert not torch.allclose(hidden[0, :first_end], hidden_changed[0, :first_end])
    torch.testing.assert_close(hidden[0, first_end:], hidden_changed[0, first_end:])


def test_packing_wrapper_hands_epochs_over_and_evaluates_padded(tokenizer, blocks):
    collator = SpanMaskingCollator(tokenizer, random_token_distribution="uniform", seed=3)
    packed = PackedBatchCollator(collator)
    packed.set_epoch(2)
    assert collator.randomness.epoch == 2
    examples = varied_batch(blocks)
    assert torch.equal(packed(examples)["labels"][0],
                       collator(examples)["labels"][collator(examples)["attention_mask"].bool()])
    assert "attention_mask" in packed.for_evaluation()(examples)
    with pytest.raises(ValueError, match="next sentence"):
        pack_batch({**collator(examples), "next_sentence_label": torch.zeros(len(examples), dtype=torch.long)})


@pytest.mark.parametrize("unpad", [False, True])
def test_a_batch_without_targets_is_refused_and_an_empty_row_among_others_trains(tokenizer, blocks, unpad,
                                                                                 monkeypatch):
    """A batch of only padding (empty examples) or special tokens has nothing to predict: the collator refuses it in
    one line, padded, buffered or packed. A row of only padding beside real rows trains, padded and unpadded
    (`--unpad`), with the losses of the real rows alone (TEAMS's samplers without noise: the buffer draws per slot)."""
    from encoder_zoo.models.teams import modeling_teams

    monkeypatch.setattr(modeling_teams, "gumbel_noise", lambda shape, device, generator=None: torch.zeros(shape))
    empty = [{"input_ids": [], "word_start": [], "example_index": i} for i in range(3)]
    specials = [{"input_ids": [tokenizer.cls_token_id, tokenizer.sep_token_id], "word_start": [True, True],
                 "example_index": i} for i in range(3)]
    for scheme in ("span", "subword"):
        collator = SpanMaskingCollator(tokenizer, scheme=scheme, random_token_distribution="uniform", seed=3,
                                       pad_to_multiple_of=8, target_buffer=unpad)
        for examples in (empty, specials):
            for collate in (collator, PackedBatchCollator(collator)):
                with pytest.raises(ValueError, match=r"^SpanMaskingCollator: none of this batch's 3 examples has a "
                                                     r"token to mask .*drop such empty examples") as refusal:
                    collate(examples)
                assert "\n" not in str(refusal.value)

    collator = SpanMaskingCollator(tokenizer, random_token_distribution="uniform", seed=3, target_buffer=unpad)
    real = varied_batch(blocks, size=2)
    alone, with_empty = collator(real), collator([*real, {**empty[0], "example_index": 99}])
    assert not with_empty["attention_mask"][-1].any()
    for build in (lambda **kw: spanbert(tokenizer, **kw), lambda **kw: teams(tokenizer, **kw)):
        model = build(unpad=unpad)
        reference_losses, reference_gradients = losses_and_gradients(model, alone)
        losses, gradients = losses_and_gradients(model, with_empty)
        for name, value in reference_losses.items():
            assert torch.isfinite(losses[name]), name
            torch.testing.assert_close(losses[name], value, rtol=1e-5, atol=1e-6, msg=name)
        assert all(torch.isfinite(gradient).all() for gradient in gradients.values())


@pytest.mark.slow
def test_packed_pretraining_run_trains_and_reports_real_tokens(tmp_path):
    out = tmp_path / "run"
    result = pretrain("--model", "spanbert", "--packing", "--model_size", "tiny", "--max_seq_length", "64",
                      "--max_documents", "200", "--tokenizer_vocab_size", "2000", "--per_device_train_batch_size", "8",
                      "--validation_documents", "20", "--dataloader_num_workers", "0", "--max_steps", "6",
                      "--logging_steps", "3", "--save_steps", "6",
                      "--output_dir", str(out))
    # SDPA on CPU has no varlen kernel: the warning says packing is slower, not merely no faster, and names the way out
    warning = " ".join(result.stderr.split())
    assert "much slower than padding" in warning and "drop --packing" in warning
    logs = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())["log_history"]
    train = [entry for entry in logs if "loss" in entry]
    assert len(train) == 2 and all(entry["sbo_loss"] > 0 and entry["tokens_per_second"] > 0 for entry in train)
    assert any("eval_loss" in entry for entry in logs)  # held-out batches stay padded
    assert (out / "export" / "model.safetensors").exists()
