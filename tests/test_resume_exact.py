"""Resume counts steps exactly: a run killed at any point (before its last step, between its last checkpoint and its
export, during its export) and rerun with --resume_from_checkpoint true ends at --max_steps with an export bitwise
equal to the uninterrupted run's; a rerun of a finished run changes nothing; a resume loads quietly.

Every run is a fresh process (as in tests/test_resume.py), so that all runs compute with the same threads."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from helpers import card_without_time, pretrain
from test_bad_input import snapshot
from test_failures import run
from test_resume import start, wait_for

from encoder_zoo.training.run.folders import EXPORT_PAUSE_ENV, TRAINED_PAUSE_ENV
from encoder_zoo.training.run.locks import LOCK_FILES

STEPS = 6
# ~11 steps per epoch, checkpoints at 3 and 6, a held-out set: the tiny settings of tests/test_resume.py, fewer steps.
SMALL = ["--model", "spanbert", "--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "40",
         "--tokenizer_vocab_size", "1000", "--per_device_train_batch_size", "8", "--validation_documents", "4",
         "--max_steps", str(STEPS), "--logging_steps", "1", "--save_steps", "3", "--save_total_limit", "5",
         "--warmup_steps", "2", "--dataloader_num_workers", "0", "--disable_tqdm", "true"]


def run_args(out: Path) -> list[str]:
    return [*SMALL, "--output_dir", str(out)]


def checkpoint_steps(out: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    pretrain(*run_args(out))
    return out


def kill_when(path: Path, out: Path, **env) -> None:
    """Start the run in `out`, SIGKILL it once `path` exists."""
    process = start(*run_args(out), **env)
    wait_for(path, process, timeout=300)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)


def assert_resumed_like(uninterrupted: Path, out: Path, stderr: str) -> None:
    """The resumed run ended at --max_steps (no checkpoint past it), its export equals the uninterrupted one's byte
    for byte, no export was set aside, and the resume was quiet about tied weights."""
    assert checkpoint_steps(out) == [3, STEPS], checkpoint_steps(out)
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == STEPS
    exported = (out / "export" / "model.safetensors").read_bytes()
    assert exported == (uninterrupted / "export" / "model.safetensors").read_bytes()
    assert not list(out.glob("export.replaced-*")) and not list(out.glob(".export*"))
    assert "There were missing keys" not in stderr and "do not match the ones in the `trainer_state.json`" not in stderr
    assert not any((out / name).exists() for name in LOCK_FILES)  # removed when the run ended
    # The card is that of the run: its loss rows from the whole run's log.
    card = (out / "export" / "README.md").read_text()
    reference = (uninterrupted / "export" / "README.md").read_text()
    for row in ("training loss, last logged (step 6)", "training loss, mean over the run", "validation loss"):
        line = next(line for line in reference.splitlines() if row in line)
        assert line in card, (row, card)


@pytest.mark.slow
def test_killed_before_the_last_step_resumes_to_the_same_export(uninterrupted, tmp_path):
    out = tmp_path / "run"
    kill_when(out / "checkpoint-3", out)
    assert not (out / f"checkpoint-{STEPS}").exists() and not (out / "export").exists()
    result = pretrain(*run_args(out), "--resume_from_checkpoint", "true")
    assert "checkpoint-3, the newest complete checkpoint" in result.stderr
    assert_resumed_like(uninterrupted, out, result.stderr)


@pytest.mark.slow
def test_killed_between_the_last_checkpoint_and_the_export_only_exports(uninterrupted, tmp_path):
    """The checkpoint is at --max_steps: the rerun trains nothing (Trainer alone would train step 7 and save
    checkpoint-7) and exports the checkpoint's weights, with the run's summary made from the checkpoint's log."""
    out = tmp_path / "run"
    kill_when(out / f"checkpoint-{STEPS}" / "trainer_state.json", out, **{TRAINED_PAUSE_ENV: "1"})
    assert not (out / "export").exists() and not (out / "trainer_state.json").exists()
    result = pretrain(*run_args(out), "--resume_from_checkpoint", "true")
    assert f"checkpoint-{STEPS} is at the run's last step ({STEPS}): nothing left to train" in result.stderr
    assert_resumed_like(uninterrupted, out, result.stderr)
    log = json.loads((out / "export" / "training_log.json").read_text())
    assert max(entry["step"] for entry in log) == STEPS
    assert not any(e.get("train_loss") == 0 for e in log)  # no summary of the session that trained nothing


@pytest.mark.slow
def test_killed_during_the_export_resumes_to_the_same_export(uninterrupted, tmp_path):
    """Killed while its export waited in the staging folder: the rerun trains nothing, exports again (the first
    attempt's summary of the run kept in the log) and sets nothing aside."""
    out = tmp_path / "run"
    kill_when(out / ".export.staging" / "README.md", out, **{EXPORT_PAUSE_ENV: "1"})
    assert not (out / "export").exists()
    result = pretrain(*run_args(out), "--resume_from_checkpoint", "true")
    assert "the partial export of a run killed or failed while exporting" in result.stderr
    assert_resumed_like(uninterrupted, out, result.stderr)
    summaries = [e for e in json.loads((out / "export" / "training_log.json").read_text()) if "train_runtime" in e]
    assert len(summaries) == 1 and summaries[0]["train_runtime"] > 0 and summaries[0]["step"] == STEPS


def test_a_finished_run_rerun_changes_nothing(uninterrupted, tmp_path, monkeypatch, capsys, caplog):
    """Resuming a finished run whose export is complete says so and exits 0: no step 7, no export set aside, not a
    byte changed (lock files included: none are left). A --max_steps below the checkpoint's is refused."""
    import logging


    out = tmp_path / "run"
    shutil.copytree(uninterrupted, out)
    before = snapshot(out)
    assert not any(name in before for name in LOCK_FILES)

    def rerun(*extra) -> tuple[int, str]:
        return run("pretrain.py", [*run_args(out), "--resume_from_checkpoint", "true", *extra], monkeypatch, capsys)

    with caplog.at_level(logging.INFO, logger="pretrain"):
        code, _ = rerun()
    assert code == 0
    assert f"Nothing to do: {out / f'checkpoint-{STEPS}'} is the run's last step ({STEPS})" in caplog.text
    assert snapshot(out) == before

    code, stderr = rerun("--max_steps", "4")
    last = stderr.strip().splitlines()[-1]
    assert code == 2 and f"has trained {STEPS} steps, more than this run's 4 (--max_steps)" in last
    assert f"pass --max_steps {STEPS} or more" in last and "checkpoint-3" in last
    assert snapshot(out) == before


def test_an_export_of_another_checkpoint_is_replaced_not_taken(uninterrupted, tmp_path):
    """An export whose log does not continue the final checkpoint's (here: of an earlier checkpoint) is not this
    run's: the rerun exports again, setting the other one aside."""
    from encoder_zoo.training.run.folders import export_of_checkpoint

    out = tmp_path / "run"
    shutil.copytree(uninterrupted, out)
    assert export_of_checkpoint(out / "export", out / f"checkpoint-{STEPS}")
    assert not export_of_checkpoint(out / "export", out / "checkpoint-3")  # it ends at step 6, not 3
    log = json.loads((out / "export" / "training_log.json").read_text())
    log[0]["loss"] += 1.0  # another run's log
    (out / "export" / "training_log.json").write_text(json.dumps(log))
    assert not export_of_checkpoint(out / "export", out / f"checkpoint-{STEPS}")


def test_a_resumed_export_equals_the_uninterrupted_one_and_carries_no_loading_state(uninterrupted, tmp_path,
                                                                                     monkeypatch, capsys):
    """A run resumed from its last checkpoint only exports: its card (FLOPs note included) and training_log.json
    (train_loss included) are the uninterrupted run's but for wall-clock times, and its tokenizer_config.json holds
    none of this machine's loading state, so a copy loads in a fresh process with the loader's own."""
    from helpers import run_isolated

    from encoder_zoo.training.data.tokenizer import LOADING_STATE

    out = tmp_path / "run"
    shutil.copytree(uninterrupted, out)
    shutil.rmtree(out / "export")
    code, stderr = run("pretrain.py", [*run_args(out), "--resume_from_checkpoint", "true"], monkeypatch, capsys)
    assert code == 0, stderr[-2000:]
    card = card_without_time(out / "export")
    assert card == card_without_time(uninterrupted / "export") and "FLOPs (model FLOPs, counted as" in card

    def without_times(folder: Path) -> list[dict]:
        log = json.loads((folder / "export" / "training_log.json").read_text())
        return [{k: v for k, v in e.items() if not k.endswith(("_runtime", "_per_second"))} for e in log]

    assert without_times(out) == without_times(uninterrupted)
    assert any("train_loss" in e for e in without_times(out))
    assert not set(LOADING_STATE) & set(json.loads((out / "export" / "tokenizer_config.json").read_text()))
    copy = shutil.copytree(out / "export", tmp_path / "published")
    loaded = run_isolated(f"""
        import os
        os.environ.pop("HF_HUB_OFFLINE", None)  # as a user loads it: local_files_only unset
        from transformers import AutoModel, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained({str(copy)!r}, trust_remote_code=True)
        model = AutoModel.from_pretrained({str(copy)!r}, trust_remote_code=True)
        print(tokenizer.init_kwargs["local_files_only"], model(**tokenizer("A test.", return_tensors="pt"))[0].ndim)
    """)
    assert loaded.splitlines()[-1].split() == ["False", "3"], loaded


def test_tied_weights_left_out_of_a_checkpoint_are_not_reported_missing(caplog):
    """A decoder tied to the word embeddings is not saved; a resume is quiet about it, not about a real gap."""
    import logging

    from torch.nn.modules.module import _IncompatibleKeys
    from transformers import TrainingArguments

    from encoder_zoo.models.spanbert.configuration_spanbert import SpanBertConfig
    from encoder_zoo.models.spanbert.modeling_spanbert import SpanBertForPreTraining
    from encoder_zoo.training.run.trainer import PretrainingTrainer

    model = SpanBertForPreTraining(SpanBertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                                                  num_attention_heads=2, intermediate_size=32))
    tied = sorted(model.all_tied_weights_keys)
    assert "cls.predictions.decoder.weight" in tied
    trainer = PretrainingTrainer(model=model, args=TrainingArguments("unused", report_to="none", use_cpu=True))
    real = "spanbert.encoder.layer.0.output.dense.weight"
    transformers_logger = logging.getLogger("transformers.trainer")
    transformers_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="transformers.trainer"):
            trainer._issue_warnings_after_load(_IncompatibleKeys(tied, []))
            assert "missing keys" not in caplog.text
            trainer._issue_warnings_after_load(_IncompatibleKeys([*tied, real], []))
    finally:
        transformers_logger.removeHandler(caplog.handler)
    assert f"missing keys in the checkpoint model loaded: ['{real}']" in caplog.text
