"""The client matrix: every family's tiny export through the clients researchers point at it (pipelines, Auto
classes, resize_token_embeddings, PEFT LoRA, sentence-transformers, gradient checkpointing, torch.compile), each
family in one fresh process where this repository is not importable. The results feed README's "Works with" table
(`python tests/works_with.py`; set `UPDATE_WORKS_WITH=1` to refresh `tests/works_with.json`)."""

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers import run_isolated
from test_bertac import cnn_export  # noqa: F401 (the shared part-1 BERTAC export fixture)
from transformers import AutoTokenizer, BertConfig, BertModel

from encoder_zoo import models
from encoder_zoo.models.bertac.modeling_bertac import BertacForSequenceClassification
from encoder_zoo.models.cloze.configuration_cloze import TwoTowerClozeConfig
from encoder_zoo.models.cloze.modeling_cloze import TwoTowerCloze
from encoder_zoo.models.hire.configuration_hire import HireConfig
from encoder_zoo.models.hire.modeling_hire import HireRobertaForSequenceClassification
from encoder_zoo.models.spanbert.configuration_spanbert import SpanBertConfig
from encoder_zoo.models.spanbert.modeling_spanbert import SpanBertForPreTraining
from encoder_zoo.models.teams.configuration_teams import TeamsConfig
from encoder_zoo.models.teams.modeling_teams import TeamsForPreTraining
from encoder_zoo.training.data.resources import minilm_path

CHILD = Path(__file__).with_name("clients_child.py")
RESULTS = Path(__file__).with_name("works_with.json")
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64)
ENCODER_CLIENTS = ["feature-extraction", "text-classification", "resize_token_embeddings",
                   "PEFT LoRA (sequence classification)", "sentence-transformers", "gradient checkpointing",
                   "torch.compile", "attn_implementation (explicit, set_attn_implementation)",
                   "quiet load (AutoModel, no load report)"]
# The clients each family supports: HIRE and BERTAC have no masked-LM head; HIRE has no pretraining head (it is
# built over a pretrained encoder), BERTAC's is its part-1 CNN's (the GAN's F and D).
CLIENTS = {
    "spanbert": ["fill-mask", "pretraining-head inference", *ENCODER_CLIENTS],
    "teams": ["fill-mask", "pretraining-head inference", *ENCODER_CLIENTS],
    "electra": ["fill-mask", "pretraining-head inference", *ENCODER_CLIENTS],
    "cloze": ["fill-mask", "pretraining-head inference", *ENCODER_CLIENTS],
    "bertac": ["pretraining-head inference", *ENCODER_CLIENTS],
    "hire": ENCODER_CLIENTS,
}
ELECTRA = dict(pretraining_tasks="rtd", task_head_type="ffn", layer_tying="none", generator_hidden_size=16,
               generator_intermediate_size=32, generator_num_attention_heads=1)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, cnn_export):  # noqa: F811
    """Tiny random exports of every family (config with auto_map, code, safetensors, the MiniLM tokenizer)."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    vocab = len(tokenizer)
    root = tmp_path_factory.mktemp("exports")
    backbone = BertConfig(vocab_size=vocab, **TINY)
    builders = {
        "spanbert": lambda: SpanBertForPreTraining(SpanBertConfig(vocab_size=vocab, **TINY)),
        "teams": lambda: TeamsForPreTraining(TeamsConfig(vocab_size=vocab, embedding_size=32, **TINY)),
        "electra": lambda: TeamsForPreTraining(TeamsConfig(vocab_size=vocab, embedding_size=32, **TINY, **ELECTRA)),
        "cloze": lambda: TwoTowerCloze(TwoTowerClozeConfig(vocab_size=vocab, **TINY)),
        "hire": lambda: HireRobertaForSequenceClassification(
            HireConfig(backbone_config=backbone.to_dict(), num_labels=2, gru_hidden_size=8)),
    }
    paths = {}
    for family, build in builders.items():
        torch.manual_seed(0)
        paths[family] = root / family
        build().save_pretrained(paths[family])
        tokenizer.save_pretrained(paths[family])
    encoder = root / "bert"
    BertModel(backbone).save_pretrained(encoder)
    tokenizer.save_pretrained(encoder)
    paths["bertac"] = root / "bertac"
    bertac = BertacForSequenceClassification.from_pretrained_parts(str(encoder), cnn_export, num_labels=2)
    bertac.save_pretrained(paths["bertac"])
    tokenizer.save_pretrained(paths["bertac"])
    paths = {family: str(path) for family, path in paths.items()}
    paths["bertac_cnn"] = cnn_export
    return paths


def run_family(family: str, exports: dict) -> dict:
    """All of one family's clients in one fresh process: `{client: "ok" | the error}`."""
    model_type = "teams" if family == "electra" else family
    export, pretraining_export = exports[family], exports["bertac_cnn" if family == "bertac" else family]
    header = (f"EXPORT = {export!r}\nPRETRAINING_EXPORT = {pretraining_export!r}\nFAMILY = {family!r}\n"
              f"CLIENTS = {CLIENTS[family]!r}\nLORA_TARGETS = {models.PEFT_TARGET_MODULES[model_type]!r}\n")
    output = run_isolated(header + CHILD.read_text(), timeout=600)
    return json.loads(output.rsplit("\nRESULTS ", 1)[1])


@pytest.mark.slow
def test_every_family_works_with_every_client(exports, tmp_path):
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(CLIENTS, pool.map(run_family, CLIENTS, [exports] * len(CLIENTS))))
    (tmp_path / "works_with.json").write_text(json.dumps(results, indent=1))
    if os.environ.get("UPDATE_WORKS_WITH"):
        RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    failures = {f"{family} / {name}": outcome for family, outcome in results.items()
                for name, outcome in outcome.items() if outcome != "ok"}
    assert not failures, "\n\n".join(f"{key}: {error}" for key, error in failures.items())
    assert all(set(results[family]) == set(CLIENTS[family]) for family in CLIENTS)


def test_registered_peft_defaults_need_no_target_modules(exports):
    from peft import LoraConfig, TaskType, get_peft_model

    from encoder_zoo.models.spanbert.modeling_spanbert import SpanBertForSequenceClassification

    models.register_peft_target_modules()
    model = get_peft_model(SpanBertForSequenceClassification.from_pretrained(exports["spanbert"], num_labels=2),
                           LoraConfig(task_type=TaskType.SEQ_CLS, r=4))
    names = [name for name, _ in model.named_parameters()]
    assert any("query.lora_A" in name for name in names) and any("value.lora_A" in name for name in names)
    assert any("classifier.modules_to_save" in name for name in names)
