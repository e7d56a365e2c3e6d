"""`--init_from model.pt`: the SpanBERT authors' fairseq checkpoint (their `BertForPreTraining` under `decoder.`,
LayerNorm as gamma/beta, the pair-target head, `args` with their own BertConfig) starts a spanbert run with its MLM and
SBO heads loaded and BERT's encoder; another architecture, or a pickle asking for any other class, is refused with
nothing of it run. The checkpoints are tiny ones built here in their layout (their key names and config fields, read
in facebookresearch/SpanBERT pretraining/fairseq/models/pair_bert.py); no fairseq is needed or imported."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import types
from collections import OrderedDict

import pytest
import torch
import transformers
from helpers import call_cli
from test_init_from import TINY, sentences, started_model

from encoder_zoo.training.data.resources import minilm_path

TARGETS, POSITION_WIDTH = 15, 8  # their max_pair_targets; the pair-target position embedding width (200 in theirs)


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(minilm_path())


@contextlib.contextmanager
def their_module():
    """`fairseq.models.pair_bert.BertConfig` as pickle finds it while saving (a plain attribute holder here)."""
    names = ("fairseq", "fairseq.models", "fairseq.models.pair_bert")
    module = types.ModuleType(names[-1])

    class BertConfig:
        pass

    BertConfig.__module__, BertConfig.__qualname__ = names[-1], "BertConfig"
    module.BertConfig = BertConfig
    sys.modules.update({names[0]: types.ModuleType(names[0]), names[1]: types.ModuleType(names[1]), names[2]: module})
    try:
        yield BertConfig
    finally:
        for name in names:
            sys.modules.pop(name)


def their_key(name: str) -> str:
    return "decoder." + name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")


def save_their_checkpoint(path, vocab_size: int, clamp_attention=True, legacy=False, state=None, extra_args=None):
    """A tiny `model.pt` as their fairseq trainer saves it (no NSP, as the released SpanBERT); returns the BERT whose
    encoder and MLM head it holds, and the pair-target tensors."""
    torch.manual_seed(0)
    bert = transformers.BertForPreTraining(transformers.BertConfig(vocab_size=vocab_size, **TINY)).eval()
    words = bert.bert.embeddings.word_embeddings.weight
    hidden = TINY["hidden_size"]
    model = OrderedDict((their_key(k), v) for k, v in bert.state_dict().items()
                        if not k.startswith(("bert.pooler.", "cls.seq_relationship.")))
    pair = {"position_embeddings.weight": torch.randn(TARGETS, POSITION_WIDTH) * 0.02,
            "mlp_layer_norm.linear1.weight": torch.randn(hidden, 2 * hidden + POSITION_WIDTH) * 0.02,
            "mlp_layer_norm.linear1.bias": torch.randn(hidden) * 0.02,
            "mlp_layer_norm.layer_norm1.gamma": 1 + torch.randn(hidden) * 0.02,
            "mlp_layer_norm.layer_norm1.beta": torch.randn(hidden) * 0.02,
            "mlp_layer_norm.linear2.weight": torch.randn(hidden, hidden) * 0.02,
            "mlp_layer_norm.linear2.bias": torch.randn(hidden) * 0.02,
            "mlp_layer_norm.layer_norm2.gamma": 1 + torch.randn(hidden) * 0.02,
            "mlp_layer_norm.layer_norm2.beta": torch.randn(hidden) * 0.02,
            "decoder.weight": words.detach(), "bias": torch.randn(vocab_size) * 0.02}
    model.update({f"decoder.cls.pair_target_predictions.{k}": v for k, v in pair.items()})
    with their_module() as BertConfig:
        config = BertConfig()
        config.__dict__.update(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=TINY["num_hidden_layers"],
                               num_attention_heads=TINY["num_attention_heads"], hidden_act="gelu",
                               intermediate_size=TINY["intermediate_size"], hidden_dropout_prob=0.1,
                               attention_probs_dropout_prob=0.1,
                               max_position_embeddings=TINY["max_position_embeddings"], type_vocab_size=2,
                               initializer_range=0.02, clamp_attention=clamp_attention)
        args = argparse.Namespace(arch="bert_pair", config=config, max_pair_targets=TARGETS,
                                  pair_positional_embedding_size=200, pair_target_layer=-1, no_nsp=True,
                                  **(extra_args or {}))
        checkpoint = {"args": args, "model": state if state is not None else model, "extra_state": {"epoch": 1},
                      "optimizer_history": [{"criterion_name": "SpanBertLoss", "num_updates": 2}]}
        torch.save(checkpoint, path, _use_new_zipfile_serialization=not legacy)
    return bert, pair


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-format"])
def test_their_checkpoint_starts_spanbert_with_both_heads_loaded_and_berts_encoder(tmp_path, tokenizer, legacy):
    file = tmp_path / "spanbert_with_head" / "model.pt"
    file.parent.mkdir()
    bert, pair = save_their_checkpoint(file, len(tokenizer), legacy=legacy)
    model, init = started_model(tmp_path, "--model", "spanbert", "--init_from", str(file), "--tokenizer_name",
                                minilm_path())
    assert not any(name.startswith(("cls.", "sbo.")) for name in init.new)  # 0 new tensors in the MLM and SBO heads
    assert not init.new and not init.unused
    inputs = sentences(tokenizer)
    with torch.no_grad():
        ours, theirs = model.spanbert(**inputs).last_hidden_state, bert.bert(**inputs).last_hidden_state
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)  # BERT's outputs at step 0
        torch.testing.assert_close(model.cls.predictions(ours), bert.cls.predictions(theirs), atol=1e-5, rtol=0)
    assert torch.equal(model.sbo.mlp[2].weight, pair["mlp_layer_norm.layer_norm1.gamma"])
    assert torch.equal(model.sbo.position_embeddings.weight, pair["position_embeddings.weight"])
    assert torch.equal(model.sbo.bias, pair["bias"])
    assert model.config.max_span_targets == TARGETS and model.config.sbo_position_embedding_size == POSITION_WIDTH
    # The load table says what came from where, under their names.
    table = init.table()
    assert "loaded from --init_from `decoder.bert.embeddings.*`" in table
    assert "| `sbo.mlp.*` | 8 | loaded from --init_from `decoder.cls.pair_target_predictions.mlp_layer_norm.*` |" in (
        table)
    assert init.record()["loaded"]["sbo.mlp.2.weight"] == (
        "--init_from decoder.cls.pair_target_predictions.mlp_layer_norm.layer_norm1.gamma")
    assert any(note.startswith("clamp_attention:") for note in init.notes)
    assert any(f"{TARGETS} target positions x {POSITION_WIDTH} wide, kept as it is (the recipe has 15 x 200)" in note
               for note in init.notes)


def refused(tmp_path, file) -> str:
    result = call_cli("encoder_zoo.training.pretrain", "--model", "spanbert", "--init_from", str(file),
                      "--tokenizer_name", minilm_path(), "--output_dir", str(tmp_path / "run"))
    assert result.returncode == 2 and not (tmp_path / "run").exists(), result.stderr
    return result.stderr


def test_a_fairseq_checkpoint_of_another_architecture_is_refused_naming_what_it_holds(tmp_path):
    file = tmp_path / "roberta.pt"
    state = OrderedDict([("decoder.sentence_encoder.embed_tokens.weight", torch.zeros(10, 4)),
                         ("decoder.lm_head.bias", torch.zeros(10))])
    save_their_checkpoint(file, 100, state=state)
    line = refused(tmp_path, file)
    assert "a fairseq checkpoint of another architecture" in line and "decoder.sentence_encoder" in line


class Payload:
    """What a malicious pickle does: run a command when unpickled."""

    def __init__(self, sentinel):
        self.sentinel = sentinel

    def __reduce__(self):
        return os.system, (f"touch {self.sentinel}",)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-format"])
def test_a_pickle_that_asks_for_any_other_class_is_refused_with_nothing_run(tmp_path, legacy):
    sentinel = tmp_path / "ran"
    file = tmp_path / "model.pt"
    save_their_checkpoint(file, 100, legacy=legacy, extra_args={"hook": Payload(sentinel)})
    line = refused(tmp_path, file)
    assert "its pickle asks for" in line and "system" in line and "nothing of it was run" in line
    assert not sentinel.exists()
