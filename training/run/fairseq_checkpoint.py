"""The SpanBERT authors' fairseq checkpoint (`model.pt`, e.g. their `spanbert_large_with_head`) as a `--init_from`
start: read without fairseq and without running its pickle, and presented under SpanBERT's parameter names.

Their file is a dict pickled by their trainer (`utils.save_state`): `args` (an `argparse.Namespace` whose `config` is
their own `fairseq.models.pair_bert.BertConfig`), the trainer's bookkeeping (`optimizer_history`,
`last_optimizer_state`, `extra_state` with its `train_meters`: `fairseq.meters` objects) and `model`, the state dict
of their `BertForPreTraining` under `decoder.`: the encoder `decoder.bert.*` (BERT's names, LayerNorm as
`gamma`/`beta`), the MLM head `decoder.cls.predictions.*`, the pair-target (SBO) head
`decoder.cls.pair_target_predictions.*` (`position_embeddings`, `mlp_layer_norm.linear1`, `layer_norm1`, `linear2`,
`layer_norm2`, `decoder`, `bias`) and, without `--no-nsp`, BERT's pooler and NSP head.

The pickle is read by torch's weights-only unpickler, which builds tensors, storages and plain containers and, here,
`argparse.Namespace` and stand-ins for their `BertConfig` and their meters (objects that only hold attributes): any
other class the file asks for is refused by name before anything of it runs. The bookkeeping is read as inert data
and ignored. A bare state dict under their key names (`decoder.bert.*`, as a conversion of the released
`spanbert_large_with_head` `model.pt` reads it) holds no `args`: its architecture comes from their config.json beside
it (their BertConfig's fields, no `model_type`) or `--config_name`.
"""

from __future__ import annotations

import argparse
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

THEIR_CONFIG = "fairseq.models.pair_bert.BertConfig"
# What their trainer pickles besides tensors and containers: extra_state['train_meters'] (fairseq/meters.py).
THEIR_METERS = ("fairseq.meters.AverageMeter", "fairseq.meters.TimeMeter", "fairseq.meters.StopwatchMeter")
ALLOWED = ("argparse.Namespace", THEIR_CONFIG, *THEIR_METERS)
ALLOWED_WORDS = f"tensors, argparse.Namespace, {THEIR_CONFIG} and their fairseq.meters"
# Their BertConfig's fields (code/pytorch_pretrained_bert/modeling.py), as its to_json_string writes them.
THEIR_CONFIG_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "hidden_act",
                       "intermediate_size", "hidden_dropout_prob", "attention_probs_dropout_prob",
                       "max_position_embeddings", "type_vocab_size", "initializer_range")
PREFIX = "decoder."
# Their module names inside the pair-target head's MLP -> SpanBERT's `sbo.mlp` indices (Linear, act, LayerNorm, ...).
SBO_MLP = {"mlp_layer_norm.linear1": "mlp.0", "mlp_layer_norm.layer_norm1": "mlp.2",
           "mlp_layer_norm.linear2": "mlp.3", "mlp_layer_norm.layer_norm2": "mlp.5"}
# Their BertConfig fields that are SpanBertConfig's under the same name and meaning.
CONFIG_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
                 "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
                 "initializer_range")


class TheirBertConfig:
    """Stands in for `fairseq.models.pair_bert.BertConfig` while unpickling: holds its attributes, runs no code."""


class TheirMeter:
    """Stands in for their `fairseq.meters` classes while unpickling: holds their attributes (val, avg, sum, count,
    start, ...), runs no code; read and ignored."""


STAND_INS = [argparse.Namespace, (TheirBertConfig, THEIR_CONFIG),
             *((type(name.rsplit(".", 1)[1], (TheirMeter,), {}), name) for name in THEIR_METERS)]


@dataclass(frozen=True)
class AuthorsCheckpoint:
    """What their `model.pt` holds, under SpanBERT's names: its architecture (a SpanBERT config.json's fields), its
    tensors (`tensors`: ours -> tensor), where each came from (`renamed`: ours -> theirs), and what the load table
    should say about it (`notes`)."""

    config: dict
    tensors: dict = field(repr=False)
    renamed: dict = field(repr=False)
    notes: tuple[str, ...] = ()


def is_fairseq_checkpoint(path: Path) -> bool:
    return path.is_file() and path.suffix == ".pt"


def load_restricted(file: Path, flag: str) -> dict:
    """Their pickle through torch's weights-only unpickler, with `argparse.Namespace` and the stand-ins for their
    `BertConfig` and meters allowed; any other class it names is refused, naming it, before any of it is built. A bare
    state dict comes back as `{"model": it}`."""
    where = f"{flag} {file}"
    if file.stat().st_size == 0:
        raise OSError(f"{where} is empty (0 bytes): a copy or download that did not finish; fetch the authors' "
                      "model.pt again.")
    try:
        asked = torch.serialization.get_unsafe_globals_in_checkpoint(str(file))
    except Exception:  # a file in torch's legacy (pre-1.6, non-zip) format: the unpickler below refuses the same way
        asked = []
    refused = [name for name in asked if name not in ALLOWED]
    if refused:
        raise ValueError(f"{where}: its pickle asks for {', '.join(refused)}; only {ALLOWED_WORDS} are read from a "
                         "fairseq checkpoint, so nothing of it was run or loaded.")
    try:
        with torch.serialization.safe_globals(STAND_INS):
            loaded = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"GLOBAL ([\w.]+)", str(error))
        if not found:  # no class asked for: bytes the unpickler cannot read at all (torch's reason, e.g. an opcode)
            reason = re.search(r"WeightsUnpickler error:\s*(.+)", str(error))
            raise OSError(f"{where} is truncated or not a PyTorch file ({reason[1] if reason else 'not a pickle'}); "
                          "fetch the authors' model.pt again.") from None
        asked_for = found[1]
        raise ValueError(f"{where}: its pickle asks for {asked_for}; only {ALLOWED_WORDS} are read from a fairseq "
                         "checkpoint, so nothing of it was run or loaded.") from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:  # ValueError: bytes that are no pickle at all
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise OSError(f"{where} is truncated or not a PyTorch file ({detail}); fetch the authors' model.pt "
                      "again.") from None
    if isinstance(loaded, dict) and loaded and all(isinstance(v, torch.Tensor) for v in loaded.values()):
        return {"model": loaded}  # a bare state dict
    if not isinstance(loaded, dict) or "model" not in loaded:
        raise ValueError(f"{where}: not a fairseq checkpoint (a dict with 'model' and 'args') nor a state dict; pass "
                         "the authors' model.pt, or a model folder.")
    return loaded


def our_name(key: str) -> str | None:
    """SpanBERT's parameter name for one of their keys (`decoder.` stripped), or None where SpanBERT has none."""
    key = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", key))
    if key.startswith("bert."):
        return "spanbert." + key.removeprefix("bert.")
    if key.startswith(("cls.predictions.", "cls.seq_relationship.")):
        return key
    if key.startswith("cls.pair_target_predictions."):
        rest = key.removeprefix("cls.pair_target_predictions.")
        for theirs, ours in SBO_MLP.items():
            if rest.startswith(theirs + "."):
                return f"sbo.{ours}.{rest.removeprefix(theirs + '.')}"
        return f"sbo.{rest}"
    return None


def their_config_json(file: Path, config_name: str | None, where: str) -> tuple[dict, str]:
    """A bare state dict's architecture: `--config_name` (a config.json, or a folder holding one), else their
    config.json (or bert_config.json, their older name) beside it; refused in one line where there is none."""
    import json

    if config_name:
        given = Path(config_name).expanduser()
        candidates, how = [given / "config.json" if given.is_dir() else given], f"--config_name {config_name}"
    else:
        candidates, how = [file.parent / "config.json", file.parent / "bert_config.json"], None
    found = next((candidate for candidate in candidates if candidate.is_file()), None)
    if found is None:
        raise ValueError(
            f"{where}: a bare state dict (their tensors, no args): its architecture is not in it"
            + (f", and {how} is no config.json" if how else ", and no config.json lies beside it")
            + "; put their config.json (their BertConfig's fields: hidden_size, num_hidden_layers, ...) beside it, "
            "or pass --config_name CONFIG_JSON.")
    try:
        config = json.loads(found.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{where}: {found} is not valid JSON ({error}).") from None
    lacking = [key for key in THEIR_CONFIG_FIELDS[1:5] if key not in config]
    if lacking:
        raise ValueError(f"{where}: {found} lacks {', '.join(lacking)}: not a BERT config (their BertConfig's "
                         "fields); pass --config_name with the config.json the weights were trained with.")
    return config, how or f"their `{found.name}` beside it"


def read_fairseq_checkpoint(file: Path, name: str, flag: str, config_name: str | None = None) -> AuthorsCheckpoint:
    """Their `model.pt` as a SpanBERT checkpoint: config from `args.config` (a bare state dict's: `their_config_json`)
    and the tensors' shapes, tensors renamed. Refuses another architecture (no `decoder.bert.` encoder), naming what it
    holds."""
    loaded = load_restricted(file, flag)
    state, args = loaded["model"], loaded.get("args")
    where = f"{flag} {name}"
    prefix = PREFIX if any(key.startswith(PREFIX) for key in state) else ""
    if not any(key.startswith(prefix + "bert.embeddings.") for key in state):
        tops = sorted({".".join(key.split(".")[:2]) for key in state})
        raise ValueError(f"{where}: a fairseq checkpoint of another architecture (its tensors are under "
                         f"{', '.join(tops[:6])}; arch {getattr(args, 'arch', 'unknown')!r}), not the SpanBERT "
                         "authors' BertForPreTraining (decoder.bert.*); --init_from takes their pair_bert "
                         "checkpoints only.")
    bare = args is None
    if bare:
        fields, config_source = their_config_json(file, config_name, where)
        config = TheirBertConfig()
        config.__dict__.update(fields)
    else:
        if config_name:
            raise ValueError(f"--config_name applies to a bare state dict; {name} holds its own architecture (its "
                             "args' config). Drop --config_name.")
        config = getattr(args, "config", None)
        if not isinstance(config, TheirBertConfig):
            raise ValueError(f"{where}: its args hold no config (their BertConfig); the architecture comes from it.")
    layer = getattr(args, "pair_target_layer", -1)
    if layer not in (-1, None):
        raise ValueError(f"{where}: its pair-target head reads layer {layer}; SpanBERT's SBO head reads the last "
                         "layer (-1), so this checkpoint's head cannot be continued.")
    renamed, unknown = {}, []
    for key, tensor in state.items():
        ours = our_name(key.removeprefix(prefix)) if key.startswith(prefix) else None
        if ours is None:
            unknown.append(key)
            continue
        renamed[ours] = key
    if unknown:
        raise ValueError(f"{where}: tensors SpanBERT has no place for ({', '.join(unknown[:4])}); is it a pair_bert "
                         "checkpoint of the SpanBERT authors' code?")
    tensors = {ours: state[key] for ours, key in renamed.items()}
    words = tensors["spanbert.embeddings.word_embeddings.weight"]
    architecture = {"model_type": "spanbert", "vocab_size": words.shape[0], "layer_norm_eps": 1e-12,
                    **{k: getattr(config, k) for k in CONFIG_FIELDS if hasattr(config, k)}}
    under = f"under `{prefix}`" if prefix else "at the top"
    if bare:
        notes = [f"Read from the SpanBERT authors' bare state dict `{file.name}` (their BertForPreTraining {under}; "
                 "LayerNorm `gamma`/`beta` read as `weight`/`bias`); the architecture from "
                 f"{config_source}, the pair-target head taken as reading the last layer (their default)."]
    else:
        notes = [f"Read from the SpanBERT authors' fairseq checkpoint `{file.name}` (their BertForPreTraining {under}; "
                 "LayerNorm `gamma`/`beta` read as `weight`/`bias`)."]
        if any(key in loaded for key in ("extra_state", "optimizer_history", "last_optimizer_state")):
            notes.append("Their trainer's bookkeeping (extra_state with its train_meters, optimizer_history, "
                         "last_optimizer_state) was read as data and not used: a --init_from run starts a new "
                         "optimiser and schedule.")
    positions = tensors.get("sbo.position_embeddings.weight")
    if positions is not None:
        architecture.update(max_span_targets=positions.shape[0], sbo_position_embedding_size=positions.shape[1])
        from encoder_zoo import models

        fields = models.get_class("spanbert", "AutoConfig").__dataclass_fields__
        recipe = (fields["max_span_targets"].default, fields["sbo_position_embedding_size"].default)
        same = tuple(positions.shape) == recipe
        notes.append(f"SBO head: their pair-target head, {positions.shape[0]} target positions x {positions.shape[1]} "
                     f"wide, kept as it is{'' if same else f' (the recipe has {recipe[0]} x {recipe[1]})'}: the "
                     "architecture comes from the checkpoint.")
    if getattr(config, "clamp_attention", False):
        notes.append("clamp_attention: their attention clamps scores to [-10000, 10000] before the padding mask (a "
                     "guard for fp16); SpanBERT's attention does not clamp. The softmax is the same unless two scores "
                     "of one row both exceed 10,000 (both one-hot otherwise), so it is honoured by equivalence.")
    return AuthorsCheckpoint(architecture, tensors, renamed, tuple(notes))
