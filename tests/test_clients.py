"""The client matrix: every family's tiny export through the clients researchers point at it (pipelines, Auto
classes, resize_token_embeddings, PEFT LoRA, sentence-transformers, gradient checkpointing, torch.compile), each
column in one fresh process where this repository is not importable. The columns, their clients and how to build
each export are what the families declare (`Family.client_matrix`, plugins' included): a new family joins with no
edit here. The results feed docs/clients.md's "Works with" table (`python tests/works_with.py`; set
`UPDATE_WORKS_WITH=1` to refresh `tests/works_with.json`)."""

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers import run_isolated
from transformers import AutoTokenizer

from encoder_zoo import models
from encoder_zoo.training.data.resources import minilm_path
from encoder_zoo.training.recipes import ClientColumn, TinyExport, client_columns

CHILD = Path(__file__).with_name("clients_child.py")
RESULTS = Path(__file__).with_name("works_with.json")


def build_export(column: ClientColumn, folder: Path) -> TinyExport:
    """`column`'s tiny random export under `folder`, saved with the embedded MiniLM tokenizer."""
    folder.mkdir(parents=True)
    torch.manual_seed(0)
    return column.build(folder, AutoTokenizer.from_pretrained(minilm_path()))


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, TinyExport]:
    """Every column's tiny random export (config with auto_map, code, safetensors, the MiniLM tokenizer)."""
    root = tmp_path_factory.mktemp("exports")
    return {name: build_export(column, root / name) for name, column in client_columns().items()}


def run_clients(export: TinyExport, clients) -> dict:
    """`clients` on one export in one fresh process: `{client: "ok" | the error}`. A standard copy (bert, electra)
    takes PEFT's own LoRA targets for its model type."""
    model_type = json.loads((export.folder / "config.json").read_text())["model_type"]
    header = (f"EXPORT = {str(export.folder)!r}\nPRETRAINING_EXPORT = {str(export.pretraining or export.folder)!r}\n"
              f"CLIENTS = {list(clients)!r}\nLORA_TARGETS = {models.PEFT_TARGET_MODULES.get(model_type)!r}\n")
    output = run_isolated(header + CHILD.read_text(), timeout=600)
    return json.loads(output.rsplit("\nRESULTS ", 1)[1])


@pytest.mark.slow
def test_every_family_works_with_every_client(exports, tmp_path):
    columns = client_columns()
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(columns, pool.map(lambda name: run_clients(exports[name], columns[name].clients), columns)))
    (tmp_path / "works_with.json").write_text(json.dumps(results, indent=1))
    if os.environ.get("UPDATE_WORKS_WITH"):
        RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    failures = {f"{name} / {client}": outcome for name, outcome in results.items()
                for client, outcome in outcome.items() if outcome != "ok"}
    assert not failures, "\n\n".join(f"{key}: {error}" for key, error in failures.items())
    assert all(set(results[name]) == set(column.clients) for name, column in columns.items())


def test_registered_peft_defaults_need_no_target_modules(exports):
    from peft import LoraConfig, TaskType, get_peft_model

    from encoder_zoo.models.spanbert.modeling_spanbert import SpanBertForSequenceClassification

    models.register_peft_target_modules()
    model = get_peft_model(SpanBertForSequenceClassification.from_pretrained(exports["spanbert"].folder, num_labels=2),
                           LoraConfig(task_type=TaskType.SEQ_CLS, r=4))
    names = [name for name, _ in model.named_parameters()]
    assert any("query.lora_A" in name for name in names) and any("value.lora_A" in name for name in names)
    assert any("classifier.modules_to_save" in name for name in names)
