"""What a run leaves as its record: a resumed pretraining run's card and training_log.json are the uninterrupted run's
(loss rows, run mean, `train_loss`), but for the wall-clock fields named here; a fine-tuning run's saved arguments
name no path of the machine that trained it."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from helpers import pretrain
from test_resume import start, tiny_trainer, wait_for
from test_resume_exact import SMALL

# The only fields of training_log.json that may differ between two runs of the same steps: wall-clock timings.
TIMINGS = ("tokens_per_second", "train_runtime", "train_samples_per_second", "train_steps_per_second",
           "eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


def without_timings(history: list[dict]) -> list[dict]:
    return [{key: value for key, value in entry.items() if key not in TIMINGS} for entry in history]


def test_a_checkpoint_between_two_logs_is_logged_so_a_resumed_trainer_logs_the_same(tmp_path):
    """Checkpoints every 3 steps, logs every 4, 7 steps: each checkpoint and the last step are logged too (3, 4, 6,
    7), so a trainer resumed from checkpoint-3 logs every loss and objective of the uninterrupted one, and the run's
    mean loss from its log is the same number; without the log at step 3, its step-4 entry averaged step 4 alone."""
    from encoder_zoo.training.run.export import mean_logged_loss

    def trainer(folder: Path):
        made = tiny_trainer(folder, "spanbert", max_steps=7, seed=5)  # logs every step, saves nothing: changed here
        made.args.logging_steps, made.args.save_strategy, made.args.save_steps = 4, "steps", 3
        return made

    reference = trainer(tmp_path / "a")
    reference.train()
    logged = [entry for entry in reference.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [3, 4, 6, 7]
    assert {"mlm_loss", "sbo_loss"} <= set(logged[1])  # each objective's interval mean as well

    shutil.copytree(tmp_path / "a" / "run", tmp_path / "b" / "run")
    for name in ("checkpoint-6", "checkpoint-7"):  # as if killed after checkpoint-3
        shutil.rmtree(tmp_path / "b" / "run" / name)
    resumed = trainer(tmp_path / "b")
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "run" / "checkpoint-3"))

    history = [entry for entry in resumed.state.log_history if "train_runtime" not in entry]
    expected = [entry for entry in reference.state.log_history if "train_runtime" not in entry]
    assert without_timings(history) == without_timings(expected)
    assert mean_logged_loss(resumed.state.log_history, 7) == mean_logged_loss(reference.state.log_history, 7)
    assert mean_logged_loss(reference.state.log_history, 7) == pytest.approx(
        (3 * logged[0]["loss"] + logged[1]["loss"] + 2 * logged[2]["loss"] + logged[3]["loss"]) / 7)


@pytest.mark.slow
def test_a_run_killed_between_two_logs_resumes_to_the_uninterrupted_runs_card_and_log(tmp_path):
    """pretrain.py, 7 steps, logs every 4, checkpoints every 3; one run uninterrupted, one SIGKILLed once checkpoint-3
    exists and resumed: the cards are equal (last-logged loss at step 7, the run-mean row, the held-out rows) and
    training_log.json is equal but for `TIMINGS`, `train_loss` included. Before the log at each checkpoint, the
    resumed card's last-logged loss averaged step 4 alone and its run-mean row and `train_loss` were missing."""
    args = [*SMALL, "--max_steps", "7", "--logging_steps", "4", "--save_steps", "3"]
    reference, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    pretrain(*args, "--output_dir", str(reference))
    process = start(*args, "--output_dir", str(resumed))
    wait_for(resumed / "checkpoint-3", process, timeout=300)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert not (resumed / "checkpoint-6").exists() and not (resumed / "export").exists()
    result = pretrain(*args, "--output_dir", str(resumed), "--resume_from_checkpoint", "true")
    assert "checkpoint-3, the newest complete checkpoint" in result.stderr

    card = (resumed / "export" / "README.md").read_text()
    assert card == (reference / "export" / "README.md").read_text()
    rows = [line for line in card.splitlines() if line.startswith("| training loss")]
    assert [row.split("|")[1].strip() for row in rows] == ["training loss, last logged (step 7)",
                                                           "training loss, mean over the run"], rows

    def log_of(out: Path) -> list[dict]:
        return json.loads((out / "export" / "training_log.json").read_text())

    assert without_timings(log_of(resumed)) == without_timings(log_of(reference))
    assert [e["step"] for e in log_of(resumed) if "loss" in e] == [3, 4, 6, 7]
    summary = next(e for e in log_of(resumed) if "train_runtime" in e)
    assert f"| training loss, mean over the run | {round(summary['train_loss'], 4)} |" in card
    assert all(key in summary for key in ("train_runtime", "train_samples_per_second"))  # the named timings exist
