"""Plugins: an installed package adds a model family, a recipe, a task and an experiment through entry points
(`encoder_zoo.models`, `.recipes`, `.tasks`, `.experiments`), with no library file naming them. The package is
tests/fixtures/toy_plugin/ (toy_zoo with its toy_zoo-0.1.dist-info), put on the path the way `pip install` would."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from encoder_zoo import models
from encoder_zoo.glue import tasks as glue_tasks
from encoder_zoo.repro import experiments
from encoder_zoo.training.recipes import registry

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "tests" / "fixtures" / "toy_plugin"


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(PLUGIN), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONWARNINGS": "ignore"}


def run(*command: str, cwd=REPO, timeout=900) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, *command], cwd=cwd, env=env(), capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture
def installed(monkeypatch):
    """The toy plugin importable and its entry points visible in this process, for this test only."""
    monkeypatch.syspath_prepend(str(PLUGIN))
    yield
    for name in [name for name in sys.modules if name == "toy_zoo" or name.startswith("toy_zoo.")]:
        del sys.modules[name]


def test_no_library_file_names_the_plugin():
    for root in ("models", "training", "glue", "qa", "repro"):
        for path in (REPO / root).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            assert not any(word in text for word in ("toy_zoo", "toyenc", "toy_sentiment", "toy_masking")), path


def test_each_registry_finds_the_installed_plugin(installed):
    assert {e.name: e.value for e in importlib.metadata.entry_points(group=models.PLUGIN_GROUP)}["toyenc"] == (
        "toy_zoo.toyenc")
    assert models._family_packages()["toyenc"] == "toy_zoo.toyenc"
    assert "toy_zoo.recipes" in registry.recipe_modules() and "toy_zoo.recipes" in registry.family_modules()
    assert registry.all_recipes()["toyenc"].family == "toyenc" and "spanbert" in registry.all_recipes()
    tasks = glue_tasks.with_plugins(glue_tasks.BUILT_IN_TASKS, "TASKS", "glue/tasks.py")
    assert tasks["toy_sentiment"].scoring.chance == "majority_class" and "rotten_tomatoes" in tasks
    data = tasks["toy_sentiment"].loader()
    assert (len(data["train"]), len(data["validation"])) == (72, 24) and set(data["train"]["label"]) == {0, 1}
    found = experiments.all_experiments()
    assert [a.name for a in found["toy_masking"].arms] == ["toy_mask15", "toy_mask40"]
    assert set(experiments.EXPERIMENTS) < set(found)  # the built-in list itself is left as it is


def fake_entry_points(monkeypatch, group: str, name: str, value: str):
    """`importlib.metadata.entry_points(group=...)` answering one entry point in `group`, none elsewhere."""
    point = importlib.metadata.EntryPoint(name=name, value=value, group=group)
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [point] if group == point.group else [])


def plugin_module(tmp_path, monkeypatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_a_plugin_name_clashing_with_a_built_in_is_refused_naming_both(tmp_path, monkeypatch):
    fake_entry_points(monkeypatch, models.PLUGIN_GROUP, "spanbert", "clash_zoo.spanbert")
    with pytest.raises(ValueError, match=r"entry point 'spanbert' \(clash_zoo.spanbert\) clashes with the family "
                                         r"'spanbert' of encoder_zoo.models.spanbert"):
        models._family_packages()

    module = plugin_module(tmp_path, monkeypatch, "clash_recipes", (
        "from encoder_zoo.training.recipes.spanbert import RECIPES as SPANBERT\n"
        "RECIPES = {'bert': SPANBERT['bert']}\n"))
    fake_entry_points(monkeypatch, registry.PLUGIN_GROUP, "clash", module)
    with pytest.raises(ValueError, match="'bert' is defined twice: in encoder_zoo.training.recipes.spanbert and in "
                                         "clash_recipes"):
        registry.all_recipes()

    module = plugin_module(tmp_path, monkeypatch, "clash_tasks", (
        "from encoder_zoo.glue.tasks import BUILT_IN_TASKS\n"
        "from encoder_zoo.qa.tasks import BUILT_IN_QA_TASKS\n"
        "TASKS = {'rotten_tomatoes': BUILT_IN_TASKS['rotten_tomatoes']}\n"
        "QA_TASKS = {'wiki_cloze': BUILT_IN_QA_TASKS['wiki_cloze']}\n"))
    fake_entry_points(monkeypatch, glue_tasks.PLUGIN_GROUP, "clash", module)
    with pytest.raises(ValueError, match="'rotten_tomatoes' of clash_tasks.TASKS clashes with the task "
                                         "'rotten_tomatoes' of glue/tasks.py"):
        glue_tasks.with_plugins(glue_tasks.BUILT_IN_TASKS, "TASKS", "glue/tasks.py")
    from encoder_zoo.qa import tasks as qa_tasks

    with pytest.raises(ValueError, match="'wiki_cloze' of clash_tasks.QA_TASKS clashes with the task 'wiki_cloze' "
                                         "of qa/tasks.py"):
        glue_tasks.with_plugins(qa_tasks.BUILT_IN_QA_TASKS, "QA_TASKS", "qa/tasks.py")

    module = plugin_module(tmp_path, monkeypatch, "clash_experiments", (
        "from encoder_zoo.repro.experiments import EXPERIMENTS as BUILT_IN\n"
        "EXPERIMENTS = [BUILT_IN['teams']]\n"))
    fake_entry_points(monkeypatch, experiments.PLUGIN_GROUP, "clash", module)
    with pytest.raises(ValueError, match="'teams' of clash_experiments.EXPERIMENTS clashes with the experiment "
                                         "'teams' of repro/experiments.py"):
        experiments.all_experiments()


def test_the_plugin_family_is_registered_with_the_auto_classes_in_a_fresh_process():
    out = run("-c", (
        "import transformers\n"
        "from encoder_zoo import models\n"
        "config = transformers.AutoConfig.for_model('toyenc', hidden_size=32, num_hidden_layers=1, "
        "num_attention_heads=2, intermediate_size=64, vocab_size=100)\n"
        "print(type(config).__name__, type(transformers.AutoModel.from_config(config)).__name__,\n"
        "      type(transformers.AutoModelForPreTraining.from_config(config)).__name__,\n"
        "      models.get_class('toyenc', 'AutoModelForSequenceClassification').__name__,\n"
        "      models.PEFT_TARGET_MODULES['toyenc'], models.FSDP_LAYER_CLASSES['toyenc'])\n")).stdout
    assert out.split() == ["ToyEncConfig", "ToyEncModel", "ToyEncForPreTraining", "ToyEncForSequenceClassification",
                           "['query',", "'value']", "BertLayer"]


def test_the_plugin_family_joins_the_client_matrix_with_no_test_file_edited(tmp_path):
    """The client matrix (tests/test_clients.py) and its table (tests/works_with.py) read their columns from the
    families' declarations: the toy family's is among them, after the built-in ones, and its tiny export, built as it
    declares, passes one of its clients in a process where neither this repository nor the plugin is importable."""
    out = run("-c", (
        "import json, sys\n"
        f"sys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from pathlib import Path\n"
        "import test_clients, works_with\n"
        "from encoder_zoo.training.recipes import client_columns\n"
        "column = client_columns()['toyenc']\n"
        f"export = test_clients.build_export(column, Path({str(tmp_path / 'toyenc')!r}))\n"
        "clients = ['pretraining-head inference']\n"
        "print(json.dumps({'columns': works_with.FAMILIES, 'clients': column.clients,\n"
        "                  'results': test_clients.run_clients(export, clients)}))\n")).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert found["columns"][-1] == "toyenc" and {"spanbert", "electra", "hire"} < set(found["columns"])
    assert "fill-mask" in found["clients"] and "quiet load (AutoModel, no load report)" not in found["clients"]
    assert found["results"] == {"pretraining-head inference": "ok"}


@pytest.mark.slow
def test_the_plugin_pretrains_exports_fine_tunes_and_runs_a_repro_sweep(tmp_path):
    """pretrain.py --model toyenc, run_glue.py on the export over toy_sentiment, and repro/run.py toy_masking at the
    smoke budget (one unit): about 2 minutes on 2 cores."""
    pre = tmp_path / "pretrain"
    run("training/pretrain.py", "--model", "toyenc", "--model_size", "tiny", "--max_seq_length", "64",
        "--max_documents", "60", "--tokenizer_vocab_size", "500", "--per_device_train_batch_size", "4",
        "--validation_documents", "6", "--dataloader_num_workers", "0", "--max_steps", "4", "--output_dir", str(pre))
    export = pre / "export"
    assert json.loads((export / "config.json").read_text())["model_type"] == "toyenc"
    assert (export / "modeling_toyenc.py").exists()  # travels with the export, as a built-in family's

    run("glue/run_glue.py", "--model_name_or_path", str(export), "--task_name", "toy_sentiment", "--output_dir",
        str(tmp_path / "finetune"), "--num_train_epochs", "1", "--per_device_train_batch_size", "8",
        "--max_seq_length", "32")
    results = json.loads((tmp_path / "finetune" / "glue_results.json").read_text())
    assert 0 <= results["tasks"]["toy_sentiment"]["median"]["accuracy"] <= 100

    run("repro/run.py", "toy_masking", "--budget", "smoke", "--units", "1", "--tasks", "toy_sentiment",
        "--output_dir", str(tmp_path / "repro"))
    folder = tmp_path / "repro" / "toy_masking" / "smoke"
    report = (folder / "report.md").read_text()
    results = json.loads((folder / "results.json").read_text())
    assert set(results["arms"]) == {"toy_mask15", "toy_mask40"}
    assert all(entry["failed"] == [] for entry in results["arms"].values())
    assert all(len(entry["tasks"]["toy_sentiment"]["runs"]) == 1 for entry in results["arms"].values())
    for text in ("toy_mask15", "toy_mask40", "toy_sentiment accuracy", "No paper: toy rows."):
        assert text in report, text
