"""`--init_from model.pt`: the SpanBERT authors' fairseq checkpoint (their `BertForPreTraining` under `decoder.`,
LayerNorm as gamma/beta, the pair-target head, `args` with their own BertConfig, and their trainer's bookkeeping: the
`fairseq.meters` objects in `extra_state['train_meters']`, `optimizer_history`, `last_optimizer_state`) starts a
spanbert run with its MLM and SBO heads loaded and BERT's encoder; so does a bare `decoder.*` state dict with their
config.json beside it or --config_name. Another architecture, or a pickle asking for any other class, is refused with
nothing of it run. The checkpoints are tiny ones built here as their trainer writes them (facebookresearch/SpanBERT
pretraining/: fairseq/utils.py save_state, fairseq/trainer.py's meters, train.py's extra_state, fairseq/meters.py's
classes under their module path, pair_bert.py's key names and config fields); no fairseq is needed or imported."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import types
from collections import OrderedDict

import pytest
import torch
import transformers
from helpers import call_cli
from test_init_from import TINY, sentences, started_model

from encoder_zoo.hub_cards.metadata import display_name
from encoder_zoo.training.data.resources import minilm_path
from encoder_zoo.training.recipes import get_recipe
from encoder_zoo.training.run.export import starting_origin

TARGETS, POSITION_WIDTH = 15, 8  # their max_pair_targets; the pair-target position embedding width (200 in theirs)


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(minilm_path())


# fairseq/meters.py's three classes as their trainer pickles them (their code, without its numpy/scipy imports).
class AverageMeter(object):
    def __init__(self):
        self.reset()

    def reset(self):
        self.val = 0
        self.avg = 0
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


class TimeMeter(object):
    def __init__(self, init=0):
        self.reset(init)

    def reset(self, init=0):
        self.init = init
        self.start = time.time()
        self.n = 0

    def update(self, val=1):
        self.n += val


class StopwatchMeter(object):
    def __init__(self):
        self.reset()

    def start(self):
        self.start_time = time.time()

    def stop(self, n=1):
        if self.start_time is not None:
            self.sum += time.time() - self.start_time
            self.n += n
            self.start_time = None

    def reset(self):
        self.sum = 0
        self.n = 0
        self.start_time = None


@contextlib.contextmanager
def their_module():
    """`fairseq.models.pair_bert.BertConfig` (a plain attribute holder here) and `fairseq.meters`' classes as pickle
    finds them while saving: under their own module paths."""
    names = ("fairseq", "fairseq.models", "fairseq.models.pair_bert", "fairseq.meters")
    modules = {name: types.ModuleType(name) for name in names}

    class BertConfig:
        pass

    BertConfig.__module__, BertConfig.__qualname__ = names[2], "BertConfig"
    modules[names[2]].BertConfig = BertConfig
    for meter in (AverageMeter, TimeMeter, StopwatchMeter):
        setattr(modules["fairseq.meters"], meter.__name__, meter)
    saved = {meter: (meter.__module__, meter.__qualname__) for meter in (AverageMeter, TimeMeter, StopwatchMeter)}
    for meter in saved:
        meter.__module__, meter.__qualname__ = "fairseq.meters", meter.__name__
    sys.modules.update(modules)
    try:
        yield BertConfig
    finally:
        for name in names:
            sys.modules.pop(name)
        for meter, (module, qualname) in saved.items():
            meter.__module__, meter.__qualname__ = module, qualname


def their_meters(fp16: bool) -> OrderedDict:
    """fairseq/trainer.py's init_meters, after two updates of their train_step (and, under --fp16, the loss scale)."""
    meters = OrderedDict()
    for name in ("train_loss", "train_nll_loss", "valid_loss", "valid_nll_loss"):
        meters[name] = AverageMeter()
    meters["wps"], meters["ups"] = TimeMeter(), TimeMeter()
    for name in ("wpb", "bsz", "gnorm", "clip", "oom"):
        meters[name] = AverageMeter()
    if fp16:
        meters["loss_scale"] = AverageMeter()
    meters["wall"], meters["train_wall"] = TimeMeter(), StopwatchMeter()
    for _ in range(2):
        meters["train_wall"].start()
        meters["wps"].update(640)
        meters["ups"].update(1.)
        meters["wpb"].update(640)
        meters["bsz"].update(8)
        meters["gnorm"].update(torch.tensor(3.25))  # clip_grad_norm_ returns a tensor in today's torch
        meters["clip"].update(1.)
        meters["oom"].update(0)
        meters["train_loss"].update(9.5, 640)
        if fp16:
            meters["loss_scale"].reset()
            meters["loss_scale"].update(128.0)
        meters["train_wall"].stop()
    return meters


def their_save_state(args, model: OrderedDict, fp16: bool) -> dict:
    """fairseq/utils.py save_state's dict, with train.py's extra_state and trainer.py's train_meters in it."""
    parameters = [tensor for key, tensor in model.items() if not key.endswith("pair_target_predictions.decoder.weight")]
    optimizer_state = {"state": {i: {"step": 2, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
                                 for i, p in enumerate(parameters[:3])},
                       "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
                                         "amsgrad": False, "params": list(range(len(parameters)))}]}
    if fp16:
        optimizer_state["loss_scale"] = 128.0  # FP16Optimizer.state_dict
    return {
        "args": args,
        "model": model,
        "optimizer_history": [{"criterion_name": "NoNSPPairLoss",
                               "optimizer_name": "FP16Optimizer" if fp16 else "FairseqAdam",
                               "lr_scheduler_state": {"best": 9.25}, "num_updates": 2}],
        "last_optimizer_state": optimizer_state,
        "extra_state": {"best": 9.25, "train_iterator": {"epoch": 1, "iterations_in_epoch": 2}, "val_loss": 9.25,
                        "train_meters": their_meters(fp16)},
    }


def their_key(name: str) -> str:
    return "decoder." + name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")


def their_config_fields(vocab_size: int) -> dict:
    """Their BertConfig's fields (code/pytorch_pretrained_bert/modeling.py), at the tiny size."""
    return dict(vocab_size=vocab_size, hidden_size=TINY["hidden_size"], num_hidden_layers=TINY["num_hidden_layers"],
                num_attention_heads=TINY["num_attention_heads"], hidden_act="gelu",
                intermediate_size=TINY["intermediate_size"], hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                max_position_embeddings=TINY["max_position_embeddings"], type_vocab_size=2, initializer_range=0.02)


def save_their_checkpoint(path, vocab_size: int, clamp_attention=True, legacy=False, state=None, extra_args=None,
                          fp16=False, bare=False):
    """A tiny `model.pt` as their fairseq trainer saves it (`checkpoint_last.pt`: no NSP, as the released SpanBERT),
    or, `bare`, its `decoder.*` state dict alone; returns the BERT whose encoder and MLM head it holds, and the
    pair-target tensors."""
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
    if bare:
        torch.save(model, path, _use_new_zipfile_serialization=not legacy)
        return bert, pair
    with their_module() as BertConfig:
        config = BertConfig()
        config.__dict__.update(**their_config_fields(vocab_size), clamp_attention=clamp_attention)
        args = argparse.Namespace(arch="bert_pair", config=config, max_pair_targets=TARGETS,
                                  pair_positional_embedding_size=200, pair_target_layer=-1, no_nsp=True, fp16=fp16,
                                  **(extra_args or {}))
        checkpoint = their_save_state(args, state if state is not None else model, fp16)
        torch.save(checkpoint, path, _use_new_zipfile_serialization=not legacy)
    return bert, pair


def test_the_files_are_their_trainers(tmp_path):
    """The test files hold what their trainer pickles: the meters under fairseq.meters, as torch reads them."""
    file = tmp_path / "checkpoint_last.pt"
    save_their_checkpoint(file, 100, fp16=True)
    asked = set(torch.serialization.get_unsafe_globals_in_checkpoint(str(file)))
    assert asked == {"argparse.Namespace", "fairseq.models.pair_bert.BertConfig", "fairseq.meters.AverageMeter",
                     "fairseq.meters.TimeMeter", "fairseq.meters.StopwatchMeter"}


@pytest.mark.parametrize("legacy,fp16", [(False, False), (True, True)], ids=["zip", "legacy-format-fp16"])
def test_their_checkpoint_starts_spanbert_with_both_heads_loaded_and_berts_encoder(tmp_path, tokenizer, legacy, fp16):
    file = tmp_path / "spanbert_with_head" / "checkpoint_last.pt"
    file.parent.mkdir()
    bert, pair = save_their_checkpoint(file, len(tokenizer), legacy=legacy, fp16=fp16)
    model, init = started_model(tmp_path, "--model", "spanbert", "--init_from", str(file), "--tokenizer_name",
                                minilm_path())
    assert any(note.startswith("Their trainer's bookkeeping (extra_state with its train_meters") for note in init.notes)
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


def assert_their_encoder_and_heads(model, bert, pair, tokenizer):
    inputs = sentences(tokenizer)
    with torch.no_grad():
        ours, theirs = model.spanbert(**inputs).last_hidden_state, bert.bert(**inputs).last_hidden_state
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.cls.predictions(ours), bert.cls.predictions(theirs), atol=1e-5, rtol=0)
    assert torch.equal(model.sbo.mlp[5].bias, pair["mlp_layer_norm.layer_norm2.beta"])


@pytest.mark.parametrize("where", ["beside", "config_name"])
def test_a_bare_state_dict_starts_spanbert_with_their_config_json(tmp_path, tokenizer, where):
    """A conversion's input: the released spanbert_large_with_head model.pt's `decoder.*` tensors alone, with their
    config.json (their BertConfig's 11 fields, no model_type) beside it or named by --config_name."""
    file = tmp_path / "spanbert_large_with_head" / "model.pt"
    file.parent.mkdir()
    bert, pair = save_their_checkpoint(file, len(tokenizer), bare=True)
    config = (file.parent if where == "beside" else tmp_path) / "config.json"
    config.write_text(json.dumps(their_config_fields(len(tokenizer)), indent=2, sort_keys=True) + "\n")
    flags = ["--config_name", str(config)] if where == "config_name" else []
    model, init = started_model(tmp_path, "--model", "spanbert", "--init_from", str(file), "--tokenizer_name",
                                minilm_path(), *flags)
    assert not init.new and not init.unused
    assert_their_encoder_and_heads(model, bert, pair, tokenizer)
    assert any("bare state dict `model.pt`" in note for note in init.notes)
    # The card says where the tokenizer came from: --tokenizer_name, not the file, which holds none.
    summary = starting_origin(init.record(), get_recipe("spanbert"), {"steps": 3})["summary"]
    assert f"(its weights and architecture; the tokenizer `{display_name(minilm_path())}`)" in summary


def test_a_bare_state_dict_without_a_config_is_refused_saying_how(tmp_path, tokenizer):
    file = tmp_path / "model.pt"
    save_their_checkpoint(file, len(tokenizer), bare=True)
    line = refused(tmp_path, file)
    assert "a bare state dict" in line and "--config_name" in line and "config.json" in line
    assert len(line.strip().splitlines()) == 1


def save_their_hf_folder(folder, tokenizer, names="weight/bias", model_type=None, prefix=""):
    """A folder as their HF code (code/pytorch_pretrained_bert) writes it: config.json from their BertConfig's
    to_json_string (11 fields, sorted, no model_type), pytorch_model.bin from torch.save(model.state_dict()) of their
    BertForMaskedLM (`bert.*`, `cls.predictions.*`; their older LayerNorm names `gamma`/`beta` where `names` says so),
    and the vocabulary. Returns the transformers BERT holding the same weights (LayerNorms away from ones/zeros)."""
    torch.manual_seed(1)
    bert = transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=len(tokenizer), **TINY)).eval()
    with torch.no_grad():
        for name, parameter in bert.named_parameters():
            if "LayerNorm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    folder.mkdir()
    config = their_config_fields(len(tokenizer)) | ({"model_type": model_type} if model_type else {})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    state = OrderedDict()
    for key, value in bert.state_dict().items():
        if key == "cls.predictions.decoder.bias":
            continue  # theirs has cls.predictions.bias only
        if names == "gamma/beta":
            key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        state[prefix + key] = value
    torch.save(state, folder / "pytorch_model.bin")
    tokenizer.save_pretrained(folder)
    return bert


@pytest.mark.parametrize("names,model_type", [("weight/bias", None), ("gamma/beta", None), ("gamma/beta", "bert")])
def test_their_hf_folder_starts_spanbert_as_that_bert(tmp_path, tokenizer, names, model_type):
    """Without model_type it is read as BERT (and the table says so); gamma/beta are LayerNorm weight/bias, as
    transformers' BertForMaskedLM reads them: no LayerNorm starts at ones and zeros."""
    folder = tmp_path / "spanbert_hf"
    bert = save_their_hf_folder(folder, tokenizer, names, model_type)
    reference = transformers.BertForMaskedLM.from_pretrained(folder).eval()  # transformers reads it completely
    model, init = started_model(tmp_path, "--model", "spanbert", "--init_from", str(folder))
    assert all(name.startswith("sbo.") for name in init.new) and not init.unused
    inputs = sentences(tokenizer)
    with torch.no_grad():
        ours = model.spanbert(**inputs).last_hidden_state
        torch.testing.assert_close(ours, bert.bert(**inputs).last_hidden_state, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours, reference.bert(**inputs).last_hidden_state, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.cls.predictions(ours), bert.cls.predictions(ours), atol=1e-5, rtol=0)
    assert any("read as BERT" in note for note in init.notes) == (model_type is None)
    if names == "gamma/beta":
        assert init.record()["loaded"]["spanbert.embeddings.LayerNorm.weight"] == (
            "--init_from bert.embeddings.LayerNorm.gamma")


def test_a_layout_that_would_reset_a_parameter_is_refused_in_one_line(tmp_path, tokenizer):
    """Its tensors under a prefix nothing reads (`module.`, as DataParallel saves them): every parameter would start
    new while a tensor of its shape, under a name that maps to it, goes unused; refused, not reset."""
    folder = tmp_path / "data_parallel"
    save_their_hf_folder(folder, tokenizer, prefix="module.")
    result = call_cli("encoder_zoo.training.pretrain", "--model", "spanbert", "--init_from", str(folder),
                      "--output_dir", str(tmp_path / "run"))
    assert result.returncode == 2 and not (tmp_path / "run").exists(), result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "would go unused while the new model's spanbert." in line
    assert "module.bert." in line and "refused rather than reset" in line


def test_their_hf_folder_with_the_older_config_name_and_their_decoder_prefix_is_read(tmp_path, tokenizer):
    """`bert_config.json` (their from_pretrained's fallback name) and a state dict wholly under `decoder.` (which it
    strips): read as their from_pretrained reads them."""
    folder = tmp_path / "spanbert_hf"
    bert = save_their_hf_folder(folder, tokenizer, "gamma/beta", prefix="decoder.")
    (folder / "config.json").rename(folder / "bert_config.json")
    model, init = started_model(tmp_path, "--model", "spanbert", "--init_from", str(folder))
    assert all(name.startswith("sbo.") for name in init.new) and not init.unused
    assert init.record()["loaded"]["spanbert.encoder.layer.1.output.LayerNorm.bias"] == (
        "--init_from decoder.bert.encoder.layer.1.output.LayerNorm.beta")
    inputs = sentences(tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(model.spanbert(**inputs).last_hidden_state, bert.bert(**inputs).last_hidden_state,
                                   atol=1e-5, rtol=0)
