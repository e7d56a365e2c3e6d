"""Exact, restartable runs: a killed run resumes bitwise, a save killed half-way is never resumed from, a signal
saves and exits with a status a scheduler can read, evaluation is deterministic, epochs get new masks."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import PRETRAIN, pretrain, pretrain_env
from safetensors.torch import load_file

from training.trainer import SAVE_PAUSE_ENV, STAGING_DIR

# ~15 steps per epoch: 30 steps cross an epoch boundary, and checkpoint-20 lies in the second epoch.
SMALL = ["--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "40", "--tokenizer_vocab_size", "1000",
         "--per_device_train_batch_size", "8", "--validation_documents", "4", "--max_steps", "30", "--logging_steps", "1",
         "--save_steps", "10", "--save_total_limit", "5", "--warmup_steps", "5"]


def start(*args, **env):
    return subprocess.Popen([sys.executable, PRETRAIN, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=pretrain_env(**env), start_new_session=True)


def wait_for(path: Path, process, timeout=400):
    deadline = time.time() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"the run ended ({process.returncode}) before {path} appeared:\n{process.stderr.read()[-3000:]}")
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def step_logs(out: Path, step: int) -> dict[int, dict]:
    """Per-step training logs (and held-out losses) of checkpoint-`step`, timing fields dropped."""
    history = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["log_history"]
    timing = ("tokens_per_second", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second")
    logs: dict[int, dict] = {}
    for entry in history:
        if "loss" in entry or "eval_loss" in entry:
            logs.setdefault(entry["step"], {}).update({k: v for k, v in entry.items() if k not in timing})
    return logs


def assert_same_weights(a: Path, b: Path):
    left, right = load_file(a), load_file(b)
    assert left.keys() == right.keys()
    for name in left:
        assert torch.equal(left[name], right[name]), name


@pytest.mark.parametrize("model, workers", [("spanbert", 0), ("spanbert", 2), ("teams", 0), ("teams", 2)])
def test_run_killed_after_a_checkpoint_resumes_bitwise(tmp_path, model, workers):
    """SIGKILL after checkpoint-20 (in the second epoch), then --resume_from_checkpoint true: every step's losses,
    the held-out losses and the final weights equal those of an uninterrupted run bitwise, which itself ran with
    the other number of DataLoader workers (masks depend on neither)."""
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    pretrain("--model", model, *SMALL, "--dataloader_num_workers", str(2 - workers), "--output_dir", str(reference))
    args = ["--model", model, *SMALL, "--dataloader_num_workers", str(workers), "--output_dir", str(resumed)]
    process = start(*args)
    wait_for(resumed / "checkpoint-20", process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert not (resumed / "checkpoint-30").exists() and not (resumed / "export").exists()
    result = pretrain(*args, "--resume_from_checkpoint", "true")
    assert "Resuming from" in result.stderr and "checkpoint-20" in result.stderr

    expected, actual = step_logs(reference, 30), step_logs(resumed, 30)
    assert sorted(actual) == list(range(1, 31)) and actual == expected  # every logged float, bitwise
    assert expected[30]["epoch"] == 2.0 and 1 < expected[20]["epoch"] < 2  # resumed inside the second epoch
    assert_same_weights(reference / "export" / "model.safetensors", resumed / "export" / "model.safetensors")
    optimizer = [torch.load(out / "checkpoint-30" / "optimizer.pt", weights_only=False)["state"] for out in (reference, resumed)]
    for key in optimizer[0]:
        for name, value in optimizer[0][key].items():
            assert torch.equal(value, optimizer[1][key][name])


def test_run_killed_in_the_middle_of_a_save_resumes_from_the_last_complete_checkpoint(tmp_path):
    """A save killed half-way (files written, not yet published) leaves no checkpoint-20; resume picks checkpoint-10
    and says so. A partial checkpoint-25 left by another tool is set aside, outside the save_total_limit rotation."""
    out = tmp_path / "run"
    args = ["--model", "bert", *SMALL, "--dataloader_num_workers", "0", "--output_dir", str(out), "--save_total_limit", "2"]
    process = start(*args, **{SAVE_PAUSE_ENV: "60"})
    wait_for(out / "checkpoint-10", process)
    wait_for(out / STAGING_DIR / "checkpoint-20" / "trainer_state.json", process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert not (out / "checkpoint-20").exists()
    assert (out / STAGING_DIR / "checkpoint-20" / "model.safetensors").exists()  # the partial save, out of sight
    (out / "checkpoint-25").mkdir()
    (out / "checkpoint-25" / "model.safetensors").write_bytes(b"partial")  # a crash of an older version

    result = pretrain(*args, "--resume_from_checkpoint", "true")
    assert "checkpoint-10, the newest complete checkpoint" in result.stderr
    assert "checkpoint-25" in result.stderr and "partial checkpoint save" in result.stderr
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-20", "checkpoint-30"]  # rotation kept 2
    assert (out / "incomplete-checkpoint-25").is_dir() and not (out / STAGING_DIR).exists()
    assert json.loads((out / "checkpoint-30" / "trainer_state.json").read_text())["global_step"] == 30


def read_until_training(process, timeout=400) -> str:
    """Stderr up to the first progress-bar update (a step has run); universal newlines split tqdm's \\r lines."""
    deadline, seen = time.time() + timeout, []
    for line in process.stderr:
        seen.append(line)
        if "s/it]" in line or "it/s]" in line:
            return "".join(seen)
        assert time.time() < deadline
    raise AssertionError(f"the run ended before training:\n{''.join(seen)[-3000:]}")


def test_sigterm_to_the_process_group_saves_then_exits_143_and_the_run_resumes(tmp_path):
    """A scheduler's SIGTERM reaches every process of the job, DataLoader workers included: the run finishes its
    step, saves, and exits with 128 + 15; nothing is exported; --resume_from_checkpoint continues it."""
    out = tmp_path / "run"
    args = ["--model", "spanbert", *SMALL, "--max_steps", "200", "--save_steps", "1000", "--dataloader_num_workers", "2",
            "--output_dir", str(out)]
    process = start(*args)
    read_until_training(process)
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=120) == 128 + signal.SIGTERM
    stderr = process.stderr.read()
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr
    saved = [p.name for p in out.glob("checkpoint-*")]
    assert len(saved) == 1 and not (out / "export").exists()
    step = int(saved[0].split("-")[1])
    assert 0 < step < 200 and f"at step {step}" in stderr


def test_demo_stopped_by_ctrl_c_exits_130_and_continues_on_the_next_run(tmp_path):
    """`training/demo.py` after a Ctrl-C: a clear line and status 130, no traceback; the next run resumes."""
    command = [sys.executable, "-m", "training.demo", "--output_dir", "runs/demo", "--max_steps", "60", "--model_size", "tiny"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                               env=pretrain_env(), start_new_session=True)
    read_until_training(process)
    os.killpg(process.pid, signal.SIGINT)
    assert process.wait(timeout=120) == 128 + signal.SIGINT
    stderr = process.stderr.read()
    assert "Traceback" not in stderr and "stopped by SIGINT" in stderr and "runs/demo" in stderr
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=pretrain_env(), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Resuming from" in result.stderr and "==== SpanBERT demo summary ====" in result.stdout
