"""The Hub lineage survives a chain of continued pretraining: phase 2 started from phase 1's export (or TAPT after
DAPT) keeps the first Hub origin in its card's `base_model`, name and text, its init_from.json records the chain, and
the export's standard copy and a model built over it keep it too."""

from __future__ import annotations

import json

import pytest
from helpers import pretrain, save_tiny_spanbert
from test_init_from import started_model

from encoder_zoo.training.data.resources import HUB_ORIGINS, minilm_path
from encoder_zoo.training.recipes import get_recipe
from encoder_zoo.training.run.export import starting_origin
from encoder_zoo.training.run.init_from import RECORD

MINILM_HUB_ID = HUB_ORIGINS["minilm"][0]


def phase_one_export(folder, record: dict):
    """A SpanBERT export as a run continued from MiniLM writes it: weights, tokenizer and its init_from.json."""
    save_tiny_spanbert(folder, "SpanBertForPreTraining", max_position_embeddings=128)
    (folder / RECORD).write_text(json.dumps(record))
    return folder


# Phase 1's record as `InitPlan.record` writes it (the chain of one start), and as records made before the chain
# existed (only its checkpoints).
PHASE_ONE = {"chain": [{"name": MINILM_HUB_ID, "hub_id": MINILM_HUB_ID, "model_type": "bert"}],
             "base_model": MINILM_HUB_ID,
             "checkpoints": {"--init_from": {"name": MINILM_HUB_ID, "hub_id": MINILM_HUB_ID, "model_type": "bert"}}}
OLDER = {"checkpoints": PHASE_ONE["checkpoints"]}


@pytest.mark.parametrize("record", [PHASE_ONE, OLDER], ids=["chain", "older-record"])
def test_phase_two_from_phase_ones_export_keeps_the_first_hub_origin(tmp_path, record):
    export = phase_one_export(tmp_path / "phase1" / "export", record)
    _, init = started_model(tmp_path, "--model", "spanbert", "--init_from", str(export))
    written = init.record()
    assert [start["name"] for start in written["chain"]] == [MINILM_HUB_ID, "phase1/export"]
    assert written["base_model"] == MINILM_HUB_ID and written["checkpoints"]["--init_from"]["hub_id"] is None
    card = starting_origin(written, get_recipe("spanbert"), {"steps": 7})
    assert card["base_model"] == MINILM_HUB_ID
    assert card["model_name"] == "spanbert-from-all-MiniLM-L6-v2"  # not "spanbert-from-export"
    assert f"started from `phase1/export`, which continues `{MINILM_HUB_ID}`" in card["summary"]
    # Phase 3 (TAPT after DAPT after MiniLM) keeps it too, with the whole chain.
    phase_two = phase_one_export(tmp_path / "phase2" / "export", written)
    _, third = started_model(tmp_path / "3", "--model", "spanbert", "--init_from", str(phase_two))
    assert [start["name"] for start in third.record()["chain"]] == [MINILM_HUB_ID, "phase1/export", "phase2/export"]
    assert third.record()["base_model"] == MINILM_HUB_ID


def test_a_start_without_a_hub_origin_names_its_folder_and_has_no_base_model(tmp_path):
    export = tmp_path / "scratch" / "export"
    save_tiny_spanbert(export, "SpanBertForPreTraining", max_position_embeddings=128)
    _, init = started_model(tmp_path, "--model", "spanbert", "--init_from", str(export))
    card = starting_origin(init.record(), get_recipe("spanbert"), {"steps": 7})
    assert card["base_model"] is None and card["model_name"] == "spanbert-from-export"
    assert init.record()["chain"] == [{"name": "scratch/export", "hub_id": None, "model_type": "spanbert"}]


def test_a_model_built_over_a_continued_export_names_the_hub_origin(tmp_path):
    from encoder_zoo.hub_cards.initialised import continued_hub_origin

    export = phase_one_export(tmp_path / "phase1" / "export", PHASE_ONE)
    assert continued_hub_origin(str(export)) == MINILM_HUB_ID
    assert continued_hub_origin(str(tmp_path)) is None


@pytest.mark.slow
def test_phase_two_of_minilm_keeps_its_hub_id_in_the_card_and_the_standard_copy(tmp_path):
    """MiniLM continued twice with SpanBERT (2 steps each, the second from the first's export, with
    --also_export_standard): phase 2's card names MiniLM's Hub id as base_model and in its text, its init_from.json
    records the chain, and its standard BERT copy keeps the base_model."""
    flags = ["--model", "spanbert", "--max_documents", "40", "--validation_documents", "4", "--max_seq_length", "32",
             "--max_steps", "2", "--per_device_train_batch_size", "4", "--save_steps", "1000", "--logging_steps", "1"]
    pretrain(*flags, "--init_from", minilm_path(), "--output_dir", str(tmp_path / "phase1"), timeout=900)
    result = pretrain(*flags, "--init_from", str(tmp_path / "phase1" / "export"), "--also_export_standard",
                      "--output_dir", str(tmp_path / "phase2"), timeout=900)
    # the run's summary names the standard copy; MiniLM's shape is no size preset, and the log does not call it one
    assert f"its standard transformers copy (no remote code) in {tmp_path / 'phase2' / 'export-standard'}." in (
        result.stdout)
    assert "pretrain: spanbert in " in result.stderr and "export's shape: " in result.stderr
    assert not [size for size in get_recipe("spanbert").sizes if f"pretrain: spanbert {size}: " in result.stderr]
    export = tmp_path / "phase2" / "export"
    record = json.loads((export / RECORD).read_text())
    assert [start["name"] for start in record["chain"]] == [MINILM_HUB_ID, "phase1/export"]
    card = (export / "README.md").read_text()
    assert f"base_model: {MINILM_HUB_ID}" in card and f"which continues `{MINILM_HUB_ID}`" in card
    assert "spanbert-from-all-MiniLM-L6-v2" in card
    standard = tmp_path / "phase2" / "export-standard"
    assert json.loads((standard / "config.json").read_text())["model_type"] == "bert"
    assert f"base_model: {MINILM_HUB_ID}" in (standard / "README.md").read_text()
