"""Runs that fail loudly and never mix: a diverging run stops at its step with status 3 and exports nothing, one run
per output folder (a killed holder leaves no stale lock), exports that are complete or invisible, resumes that refuse
other data settings, and failed saves that lose nothing.

Most runs call the entry points' `cli()` in this process (as tests/test_bad_input.py does), to pay the imports once."""

from __future__ import annotations

import errno
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import PRETRAIN, pretrain_env, save_tiny_spanbert
from safetensors.torch import load_file

TINY = ["--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "60", "--tokenizer_vocab_size", "500",
        "--validation_documents", "0", "--dataloader_num_workers", "0", "--logging_steps", "1",
        "--disable_tqdm", "true"]
SCRIPTS = {"pretrain.py": "encoder_zoo.training.pretrain", "run_glue.py": "encoder_zoo.glue.run_glue",
           "run_qa.py": "encoder_zoo.qa.run_qa", "run_open_qa.py": "encoder_zoo.qa.run_open_qa",
           "init_hire.py": "encoder_zoo.glue.init_hire", "init_bertac.py": "encoder_zoo.glue.init_bertac"}


@pytest.fixture(autouse=True)
def stop_signals_restored():
    """In-process pretraining installs SaveOnSignal's SIGTERM/SIGINT handlers: give pytest its own back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def run(script: str, args: list, monkeypatch, capsys) -> tuple[int, str]:
    """`python script args` in this process: its exit status and stderr."""
    monkeypatch.setattr(sys, "argv", [script, *map(str, args)])
    monkeypatch.delenv("PRETRAIN_TRACEBACK", raising=False)
    capsys.readouterr()
    try:
        importlib.import_module(SCRIPTS[script]).cli()
        code = 0
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def all_finite(weights: Path) -> bool:
    return all(torch.isfinite(t).all() for t in load_file(weights).values())


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 2-step spanbert run (checkpoint-2 and its export); tests work on copies of it."""
    from encoder_zoo.training.pretrain import main

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    out = tmp_path_factory.mktemp("finished") / "run"
    main(["--model", "spanbert", *TINY, "--max_steps", "2", "--save_steps", "2", "--learning_rate", "1e-3",
          "--output_dir", str(out)])
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    return out


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    return out


# ------------------------------------------------------------------------------------------------ divergence
@pytest.mark.parametrize("model", ["spanbert", "teams", "cloze"])
def test_a_diverging_pretraining_stops_at_its_step_with_status_3_and_exports_nothing(tmp_path, monkeypatch, capsys,
                                                                                      model):
    out = tmp_path / "run"
    code, stderr = run("pretrain.py", ["--model", model, *TINY, "--max_steps", "4", "--warmup_steps", "0",
                                       "--learning_rate", "1e30", "--save_steps", "1", "--output_dir", out],
                       monkeypatch, capsys)
    assert code == 3, stderr[-3000:]
    message = stderr.strip().splitlines()[-1]
    found = re.search(r"training diverged at step (\d+): (\w+_loss)\b.* became non-finite", message)
    assert found, message  # the step and the objective
    step = int(found.group(1))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{s}" for s in range(1, step)]
    # The weights of the step before, finite but blown up by the 1e30 update, gave the NaN: no good checkpoint.
    assert f"{out / f'checkpoint-{step - 1}'} holds the weights that gave the first non-finite value" in message
    assert "No good checkpoint was saved before it. Rerun with a lower --learning_rate" in message
    assert not (out / "export").exists() and not list(out.glob(".export*"))  # no export, no card of a diverged run


def test_a_diverged_run_resumes_from_its_last_good_checkpoint_at_a_lower_learning_rate(finished_run, tmp_path,
                                                                                         monkeypatch, capsys, caplog):
    """Resumed at --learning_rate 1e30 (a resumed run trains at its own rate), the run diverges at step 5: it names
    checkpoint-2 as the last good one (checkpoint-4 holds the weights that gave the NaN), saves nothing of step 5 and
    keeps the earlier export. Resumed from checkpoint-2 at 1e-4, it finishes."""
    out = copy_of(finished_run, tmp_path)
    export_before = snapshot(out / "export")
    args = ["--model", "spanbert", *TINY, "--save_steps", "2", "--max_steps", "6", "--output_dir", out]
    code, stderr = run("pretrain.py", [*args, "--learning_rate", "1e30", "--resume_from_checkpoint", "true"],
                       monkeypatch, capsys)
    message = stderr.strip().splitlines()[-1]
    assert code == 3 and "training diverged at step 5: " in message, stderr[-3000:]
    assert f"{out / 'checkpoint-4'} holds the weights that gave the first non-finite value" in message
    assert f"The last good checkpoint is {out / 'checkpoint-2'}: resume from it at a lower learning rate" in message
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert snapshot(out / "export") == export_before

    code, stderr = run("pretrain.py",
                       [*args, "--learning_rate", "1e-4", "--resume_from_checkpoint", out / "checkpoint-2"],
                       monkeypatch, capsys)
    assert code == 0, stderr[-3000:]
    assert "at --learning_rate 0.0001; it was trained at 0.001" in caplog.text
    logs = [e for e in json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())["log_history"]
            if "loss" in e]
    assert [e["step"] for e in logs] == [1, 2, 3, 4, 5, 6]
    assert all(e["learning_rate"] <= 1e-4 for e in logs[2:]) and logs[3]["learning_rate"] > 1e-5
    assert all(e["loss"] < 20 for e in logs)
    assert all_finite(out / "export" / "model.safetensors")
    assert len(list(out.glob("export.replaced-*"))) == 1  # the first export, kept


class Poisoned(torch.nn.Module):
    """Loss (w.x)^2, reported as `aux_loss` too; at the training steps in `poisoned` it is NaN, gradients included."""

    def __init__(self, poisoned: set[int]):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2))
        self.poisoned, self.calls = poisoned, 0

    def forward(self, x):
        self.calls += 1
        loss = ((x @ self.weight) ** 2).mean() * (float("nan") if self.calls in self.poisoned else 1.0)
        return {"loss": loss, "aux_loss": loss}


class Examples(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return {"x": torch.tensor([1.0, -2.0])}


@pytest.mark.parametrize("limit", [2, 3])
def test_non_finite_steps_below_the_limit_are_skipped_and_a_longer_streak_stops(tmp_path, limit):
    """Steps 3 and 4 are NaN, their gradients too. With --max_nonfinite_steps 3 they are skipped (applied, they
    would make the weights NaN): the run ends with finite weights. With 2 the run stops at step 4, naming the
    objective."""
    from transformers import Trainer, TrainingArguments

    from encoder_zoo.training.run import DivergenceGuard, TrainingDiverged

    args = TrainingArguments(str(tmp_path), max_steps=6, per_device_train_batch_size=1, learning_rate=0.1, use_cpu=True,
                             save_strategy="no", report_to="none", optim="sgd", lr_scheduler_type="constant",
                             max_grad_norm=0.0, disable_tqdm=True)
    model = Poisoned({3, 4})
    trainer = Trainer(model=model, args=args, train_dataset=Examples(),
                      callbacks=[DivergenceGuard(max_nonfinite_steps=limit)])
    if limit == 2:
        with pytest.raises(TrainingDiverged, match=r"at step 4: 2 steps in a row .*aux_loss.* became non-finite"):
            trainer.train()
        assert trainer.state.global_step == 3
        return
    trainer.train()
    # d(w.x)^2/dw = 2(w.x)x with x = (1, -2), lr 0.1: the first update takes w.x from -1 to 0, where it stays.
    assert trainer.state.global_step == 6 and model.calls == 6
    assert torch.allclose(model.weight, torch.tensor([1.2, 0.6]))
    assert DivergenceGuard().limit(SimpleNamespace(fp16=False)) == 1
    assert DivergenceGuard().limit(SimpleNamespace(fp16=True)) == 20


def squad_file(path: Path) -> Path:
    rows = [{"id": f"q{i}", "question": f"Who wrote book {i}?",
             "answers": [{"text": name, "answer_start": 0}]} for i, name in enumerate(["Ann", "Bob", "Cid", "Dee"] * 2)]
    data = {"data": [{"title": "t", "paragraphs": [{"context": f"{r['answers'][0]['text']} wrote book {r['id'][1:]} in "
                                                                "the spring of that year, far from home.",
                                                     "qas": [r]}]} for r in rows]}
    path.write_text(json.dumps(data))
    return path


def open_qa_file(path: Path) -> Path:
    rows = [{"id": f"q{i}", "question": f"Who wrote book {i}?", "answers": [name],
             "passages": [f"{name} wrote book {i} in spring.", "Rain fell on the town all week."]}
            for i, name in enumerate(["Ann", "Bob", "Cid", "Dee"] * 2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


FINE_TUNING = {
    "run_glue.py": ("SpanBertForSequenceClassification",
                    lambda w: ["--max_train_samples", "16", "--max_eval_samples", "8"]),
    "run_qa.py": ("SpanBertForQuestionAnswering", lambda w: ["--train_file", squad_file(w / "squad.json"),
                                                             "--max_seq_length", "64", "--doc_stride", "16",
                                                             "--max_question_length", "16"]),
    "run_open_qa.py": ("SpanBertForQuestionAnswering", lambda w: ["--train_file", open_qa_file(w / "open.jsonl"),
                                                                  "--max_seq_length", "64", "--doc_stride", "16",
                                                                  "--max_question_length", "16"]),
}


@pytest.mark.parametrize("script", sorted(FINE_TUNING))
def test_a_diverging_fine_tuning_stops_with_status_3_and_saves_no_model(tmp_path, monkeypatch, capsys, script):
    head, data = FINE_TUNING[script]
    model = save_tiny_spanbert(tmp_path / "model", head)
    out = tmp_path / "out"
    code, stderr = run(script, ["--model_name_or_path", model, "--trust_remote_code", "--output_dir", out,
                                *data(tmp_path), "--learning_rate", "1e30", "--warmup_steps", "0", "--max_steps", "4",
                                "--per_device_train_batch_size", "4", "--logging_steps", "1", "--disable_tqdm", "true"],
                       monkeypatch, capsys)
    assert code == 3, stderr[-3000:]
    assert re.search(r"training diverged at step \d+: .*loss.* became non-finite", stderr.strip().splitlines()[-1])
    assert not list(out.rglob("model.safetensors")) and not list(out.rglob("*results.json"))


# ------------------------------------------------------------------------------------- one run per output folder
HOLDER = """
import sys, time
from pathlib import Path
from encoder_zoo.training.run.locks import hold
hold(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(300)
"""


def start_holder(folder: Path) -> subprocess.Popen:
    """Another process that holds `folder`'s lock (as a running run does) until killed."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True,
                              env=pretrain_env())
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.fixture(scope="module")
def held_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("held") / "out"
    holder = start_holder(folder)
    yield folder, holder.pid
    holder.kill()
    holder.wait()


LOCKED_CASES = {  # each script with the held folder as its output; the refusal comes before any work
    "pretrain.py": lambda w, out: ["--model", "spanbert", *TINY, "--max_steps", "2", "--output_dir", out],
    "run_glue.py": lambda w, out: ["--model_name_or_path", minilm(), "--output_dir", out, "--max_steps", "1",
                                   "--max_train_samples", "8", "--max_eval_samples", "8"],
    "run_qa.py": lambda w, out: ["--model_name_or_path", minilm(), "--output_dir", out, "--max_steps", "1",
                                 "--train_file", squad_file(w / "squad.json"), "--max_seq_length", "64",
                                 "--doc_stride", "16", "--max_question_length", "16"],
    "run_open_qa.py": lambda w, out: ["--model_name_or_path", minilm(), "--output_dir", out, "--max_steps", "1",
                                      "--train_file", open_qa_file(w / "open.jsonl"), "--max_seq_length", "64",
                                      "--doc_stride", "16", "--max_question_length", "16"],
    "init_hire.py": lambda w, out: ["--output_dir", out],
    "init_bertac.py": lambda w, out: ["--output_dir", out, "--without_cnn_and_tier"],
}


def minilm() -> str:
    from encoder_zoo.training.data.resources import minilm_path

    return minilm_path()


@pytest.mark.parametrize("script", sorted(LOCKED_CASES))
def test_a_run_in_a_folder_another_run_holds_is_refused_naming_the_holder(tmp_path, monkeypatch, capsys, held_folder,
                                                                          script):
    folder, pid = held_folder
    code, stderr = run(script, LOCKED_CASES[script](tmp_path, folder), monkeypatch, capsys)
    last = stderr.strip().splitlines()[-1]
    assert code == 2 and last.startswith(f"{script}: error: "), stderr[-3000:]
    assert f"{folder} is in use by another run (pid {pid} on " in last and "Wait for it to finish" in last
    # Nothing written.
    assert sorted(p.name for p in folder.iterdir()) == [".encoder-zoo.lock", ".encoder-zoo.lock.json"]


def test_a_killed_run_leaves_no_stale_lock(tmp_path, monkeypatch, capsys):
    """SIGKILL gives a run no chance to clean up: the kernel drops its flock, and the next run takes the folder."""
    out = tmp_path / "run"
    holder = start_holder(out)
    code, stderr = run("pretrain.py", ["--model", "spanbert", *TINY, "--max_steps", "1", "--output_dir", out],
                       monkeypatch, capsys)
    assert code == 2 and f"(pid {holder.pid} on" in stderr
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    code, stderr = run("pretrain.py", ["--model", "spanbert", *TINY, "--max_steps", "1", "--output_dir", out],
                       monkeypatch, capsys)
    assert code == 0, stderr[-3000:]
    assert not (out / ".encoder-zoo.lock").exists() and not (out / ".encoder-zoo.lock.json").exists()  # removed at end
    assert (out / "export" / "model.safetensors").is_file()


SWEEP = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
from encoder_zoo.repro.jobs import Job, Sweep

cache = Path(sys.argv[1])
entry = cache / "init" / "entry"
work = ("import pathlib, time; entry = pathlib.Path(%r); (entry / 'ran.txt').open('a').write('ran\\\\n'); "
        "[time.sleep(0.05) for _ in range(400) if not (entry / 'go').exists()]; "
        "(entry / 'model').mkdir(exist_ok=True); (entry / 'model' / 'config.json').write_text('{}')" % str(entry))
sweep = Sweep.__new__(Sweep)
sweep.experiment, sweep.budget = SimpleNamespace(name="test"), SimpleNamespace(name="test")
sweep.jobs = [Job("init", "arm", "the entry", entry, [sys.executable, "-c", work], [entry / "model" / "config.json"])]
sweep.run(cache / "runs.jsonl")
print(json.dumps([job.status for job in sweep.jobs]))
"""


def test_two_sweeps_sharing_a_cache_run_an_entry_once(tmp_path):
    """The second sweep waits for the entry the first is running, then reuses its result: never a second run, never
    half of one read (or set aside as corrupt)."""
    command = [sys.executable, "-c", SWEEP, str(tmp_path / "cache")]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=pretrain_env())
    entry = tmp_path / "cache" / "init" / "entry"
    deadline = time.time() + 120
    while not (entry / "ran.txt").exists():  # the first sweep runs the entry's job, which waits for `go`
        assert first.poll() is None and time.time() < deadline, first.communicate()
        time.sleep(0.05)
    second = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=pretrain_env(PYTHONUNBUFFERED="1"))
    lines = []
    while not lines or not (lines[-1].startswith("Waiting for") or second.poll() is not None):
        lines.append(second.stdout.readline())
    (entry / "go").touch()
    second_out, first_out = "".join(lines) + second.communicate(timeout=300)[0], first.communicate(timeout=300)[0]
    assert "Waiting for the entry: another sweep is running it (pid" in second_out
    assert json.loads(first_out.splitlines()[-1]) == ["done"] and json.loads(second_out.splitlines()[-1]) == ["cached"]
    assert (entry / "ran.txt").read_text() == "ran\n"  # run once
    assert not list(entry.glob("*corrupt*"))


# --------------------------------------------------------------------------------------------- atomic export
def test_a_run_killed_while_exporting_leaves_no_half_export_and_resumes(tmp_path, monkeypatch, capsys, caplog):
    from encoder_zoo.training.run.folders import EXPORT_PAUSE_ENV

    out = tmp_path / "run"
    args = ["--model", "spanbert", *TINY, "--max_steps", "2", "--save_steps", "2", "--output_dir", str(out)]
    process = subprocess.Popen([sys.executable, PRETRAIN, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env=pretrain_env(**{EXPORT_PAUSE_ENV: "1"}))
    deadline = time.time() + 300
    while not (out / ".export.staging" / "README.md").exists():  # the card: written last
        assert process.poll() is None, f"the run ended before exporting:\n{process.stderr.read()[-3000:]}"
        assert time.time() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert not (out / "export").exists()  # nothing half-written where an export belongs

    code, stderr = run("pretrain.py", [*args, "--resume_from_checkpoint", "true"], monkeypatch, capsys)
    assert code == 0, stderr[-3000:]
    assert "the partial export of a run killed or failed while exporting" in caplog.text
    assert not (out / ".export.staging").exists() and (out / "export" / "training_log.json").is_file()
    assert all_finite(out / "export" / "model.safetensors")


# ------------------------------------------------------------------------------------- resume: same data settings
def test_a_resume_with_other_data_settings_is_refused_naming_each_change(finished_run, tmp_path, monkeypatch, capsys):
    out = copy_of(finished_run, tmp_path)
    before = snapshot(out)
    code, stderr = run("pretrain.py", ["--model", "spanbert", *TINY, "--max_seq_length", "32",
                                       "--mlm_probability", "0.2", "--packing", "--max_steps", "4", "--output_dir", out,
                                       "--resume_from_checkpoint", "true"], monkeypatch, capsys)
    last = stderr.strip().splitlines()[-1]
    assert code == 2 and "the run was trained with other data settings (" in last, stderr[-3000:]
    for change in ("--max_seq_length 64 then, 32 now", "--mlm_probability 0.15 then, 0.2 now",
                   "--packing False then, True now"):
        assert change in last
    assert "--max_steps" not in last  # not a data setting: a resumed run may go on longer
    after = snapshot(out)
    assert ({name: after.get(name) for name in before if "lock" not in name}
            == {n: b for n, b in before.items() if "lock" not in n})


# ------------------------------------------------------------------------------------- failed saves lose nothing
def no_space(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_a_checkpoint_that_cannot_be_written_loses_nothing(finished_run, tmp_path, monkeypatch, capsys):
    """The disk fills up while checkpoint-4 is written: the run stops (status 2) naming the cause, checkpoint-2 and
    the export stay as they were, and nothing of checkpoint-4 is left."""
    from transformers import Trainer

    out = copy_of(finished_run, tmp_path)
    before = snapshot(out)

    def fail(self, output_dir):
        (Path(output_dir) / "optimizer.pt").write_bytes(b"half an optim")
        raise no_space(Path(output_dir) / "optimizer.pt")

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", fail)
    code, stderr = run("pretrain.py", ["--model", "spanbert", *TINY, "--max_steps", "4", "--save_steps", "2",
                                       "--output_dir", out, "--resume_from_checkpoint", "true"], monkeypatch, capsys)
    last = stderr.strip().splitlines()[-1]
    assert code == 2 and "could not save checkpoint-4 (No space left on device writing" in last, stderr[-3000:]
    assert f"the newest checkpoint, {out / 'checkpoint-2'}, is intact" in last
    after = snapshot(out)
    assert {name: after[name] for name in before if name.startswith(("checkpoint-2", "export"))} == {
        name: data for name, data in before.items() if name.startswith(("checkpoint-2", "export"))}
    assert not [name for name in after if "checkpoint-4" in name]


def test_an_export_that_cannot_be_written_leaves_the_earlier_export_in_place(finished_run, tmp_path, monkeypatch,
                                                                             capsys):
    out = copy_of(finished_run, tmp_path)
    before = snapshot(out / "export")

    def fail(meta, folder):
        (Path(folder) / "README.md").write_text("# half a ca")
        raise no_space(Path(folder) / "README.md")

    monkeypatch.setattr("encoder_zoo.training.run.export.write_card", fail)
    code, stderr = run("pretrain.py", ["--model", "spanbert", *TINY, "--max_steps", "4", "--save_steps", "2",
                                       "--output_dir", out, "--resume_from_checkpoint", "true"], monkeypatch, capsys)
    last = stderr.strip().splitlines()[-1]  # (--max_steps 4: at 2, the finished run with its export has nothing to do)
    assert code == 2 and f"could not save the export {out / 'export'} (No space left on device" in last, stderr[-3000:]
    assert snapshot(out / "export") == before  # the earlier export, in place and whole
    assert not list(out.glob(".export*")) and not list(out.glob("export.*"))
