"""Exact, restartable runs: a killed run resumes bitwise, a save killed half-way is never resumed from, a signal
saves and exits with a status a scheduler can read, evaluation is deterministic, epochs get new masks."""

import json
import math
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

from encoder_zoo.training.run.trainer import SAVE_PAUSE_ENV, STAGING_DIR

# ~15 steps per epoch: 30 steps cross an epoch boundary, and checkpoint-20 lies in the second epoch.
SMALL = ["--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "40", "--tokenizer_vocab_size", "1000",
         "--per_device_train_batch_size", "8", "--validation_documents", "4", "--max_steps", "30",
         "--logging_steps", "1", "--save_steps", "10", "--save_total_limit", "5", "--warmup_steps", "5"]


def start(*args, **env):
    return subprocess.Popen([sys.executable, PRETRAIN, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=pretrain_env(**env), start_new_session=True)


def wait_for(path: Path, process, timeout=400):
    deadline = time.time() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"the run ended ({process.returncode}) before {path} appeared:\n"
                                 f"{process.stderr.read()[-3000:]}")
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


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted 30-step run of each model, without DataLoader workers (made once per test process)."""
    runs = {}

    def run(model):
        if model not in runs:
            runs[model] = tmp_path_factory.mktemp(f"uninterrupted-{model}")
            pretrain("--model", model, *SMALL, "--dataloader_num_workers", "0", "--output_dir", str(runs[model]))
        return runs[model]

    return run


# spanbert without workers in the fast tier; the other three in `make test-all`.
@pytest.mark.parametrize("model, workers", [("spanbert", 0), *(pytest.param(model, workers, marks=pytest.mark.slow)
                                                               for model, workers in [("spanbert", 2), ("teams", 0),
                                                                                      ("teams", 2)])])
def test_run_killed_after_a_checkpoint_resumes_bitwise(tmp_path, uninterrupted, model, workers):
    """SIGKILL after checkpoint-20 (in the second epoch), then --resume_from_checkpoint true: every step's losses,
    the held-out losses and the final weights equal those of the uninterrupted run bitwise, although that one ran
    without DataLoader workers (masks depend on neither workers nor restarts)."""
    reference, resumed = uninterrupted(model), tmp_path / "resumed"
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
    # resumed inside the second epoch (an epoch is whole global batches: the partial last one is left out)
    assert 2 < expected[30]["epoch"] < 3 and 1 < expected[20]["epoch"] < 2
    assert_same_weights(reference / "export" / "model.safetensors", resumed / "export" / "model.safetensors")
    optimizer = [torch.load(out / "checkpoint-30" / "optimizer.pt", weights_only=False)["state"]
                 for out in (reference, resumed)]
    for key in optimizer[0]:
        for name, value in optimizer[0][key].items():
            assert torch.equal(value, optimizer[1][key][name])


def test_run_killed_in_the_middle_of_a_save_resumes_from_the_last_complete_checkpoint(tmp_path):
    """A save killed half-way (files written, not yet published) leaves no checkpoint-20; resume picks checkpoint-10
    and says so. A partial checkpoint-25 left by another tool is set aside, outside the save_total_limit rotation."""
    out = tmp_path / "run"
    args = ["--model", "bert", *SMALL, "--dataloader_num_workers", "0", "--output_dir", str(out),
            "--save_total_limit", "2"]
    process = start(*args, **{SAVE_PAUSE_ENV: "20"})
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


def test_sigterm_to_the_process_group_saves_then_exits_143(tmp_path):
    """A scheduler's SIGTERM reaches every process of the job, DataLoader workers included: the run finishes its
    step, saves, and exits with 128 + 15; nothing is exported."""
    out = tmp_path / "run"
    args = ["--model", "spanbert", *SMALL, "--max_steps", "200", "--save_steps", "1000",
            "--dataloader_num_workers", "2", "--output_dir", str(out)]
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


@pytest.mark.slow
def test_a_signal_passed_on_by_a_launcher_is_the_same_request_and_a_later_one_aborts(monkeypatch):
    """Slurm's --signal and a terminal's Ctrl-C reach the launcher and its workers alike, and the launcher passes the
    signal on: a worker gets it twice within milliseconds. That still saves and stops; only a signal well after the
    first (the user insisting) aborts at once."""
    from encoder_zoo.training.run.trainer import SaveOnSignal

    clock = iter([100.0, 100.01, 100.02, 100.02 + SaveOnSignal.SAME_REQUEST_SECONDS + 1])
    monkeypatch.setattr("encoder_zoo.training.run.trainer.time.monotonic", lambda: next(clock))
    callback = SaveOnSignal()
    callback._request(signal.SIGTERM, None)
    callback._request(signal.SIGTERM, None)  # the launcher's copy
    callback._request(signal.SIGINT, None)
    assert callback.signum == signal.SIGTERM
    with pytest.raises(KeyboardInterrupt):
        callback._request(signal.SIGINT, None)


def test_demo_stopped_by_ctrl_c_exits_130_and_continues_on_the_next_run(tmp_path):
    """`training/demo.py` after a Ctrl-C: a clear line and status 130, no traceback; the next run resumes."""
    command = [sys.executable, "-m", "encoder_zoo.training.demo", "--output_dir", "runs/demo", "--max_steps", "60",
               "--model_size", "tiny"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                               env={**pretrain_env(), "MAKELEVEL": "1"}, start_new_session=True)  # as `make demo`
    read_until_training(process)
    os.killpg(process.pid, signal.SIGINT)
    assert process.wait(timeout=120) == 128 + signal.SIGINT
    stderr = process.stderr.read()
    assert "Traceback" not in stderr and "stopped by SIGINT" in stderr and "runs/demo" in stderr
    # the command that resumes it: make demo (its own STEPS), not pretrain.py's flag, which the demo does not take
    assert "Run `make demo STEPS=60` again to continue" in stderr and "--resume_from_checkpoint" not in stderr
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=pretrain_env(), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Resuming from" in result.stderr and "==== SpanBERT demo summary ====" in result.stdout


# ---------------------------------------------------------------------------------------------- in-process Trainer
def tiny_trainer(tmp_path, model_name, workers=0, **training):
    """PretrainingTrainer on 24 real 64-token blocks with the recipe's collator and tiny config; batches in dataset
    order, 3 steps per epoch."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer, TrainingArguments

    from encoder_zoo import models
    from encoder_zoo.training.data.blocks import add_example_index, pack_blocks
    from encoder_zoo.training.data.corpus import load_corpus
    from encoder_zoo.training.data.resources import minilm_path
    from encoder_zoo.training.recipes import get_recipe
    from encoder_zoo.training.run.trainer import PretrainingTrainer

    recipe = get_recipe(model_name)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    blocks = add_example_index(pack_blocks(load_corpus(max_documents=40), tokenizer,
                                           max_seq_length=64).select(range(24)))
    options = SimpleNamespace(masking_scheme=recipe.default_masking_scheme, mlm_probability=0.15,
                              random_token_distribution="uniform", masking_seed=3)
    config_class = models.get_class(recipe.family, "AutoConfig")
    ids = {"pad_token_id": tokenizer.pad_token_id, "mask_token_id": tokenizer.mask_token_id}
    config = config_class(**recipe.sizes["tiny"], **recipe.config_overrides, vocab_size=len(tokenizer),
                          **{k: v for k, v in ids.items() if k in config_class.__dataclass_fields__})
    torch.manual_seed(0)
    model = models.get_class(recipe.family, "AutoModelForPreTraining")(config)
    arguments = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8,
                                  per_device_eval_batch_size=8, dataloader_num_workers=workers,
                                  train_sampling_strategy="sequential", report_to="none", use_cpu=True,
                                  remove_unused_columns=False, prediction_loss_only=True, save_strategy="no",
                                  logging_steps=1, **training)
    return PretrainingTrainer(model=model, args=arguments, train_dataset=blocks, eval_dataset=blocks.select(range(16)),
                              data_collator=recipe.build_collator(tokenizer, options), processing_class=tokenizer,
                              logged_outputs=recipe.logged_outputs, perplexity_of=recipe.perplexity_of)


@pytest.mark.parametrize("workers", [0, 2])
def test_trainer_hands_each_epoch_to_the_collator(tmp_path, workers):
    """Epoch 2 redraws every mask (dynamic masking), with or without DataLoader workers, and the draws do not
    depend on the workers."""
    masks = {}
    for count in {0, workers}:
        trainer = tiny_trainer(tmp_path / str(count), "spanbert", workers=count, num_train_epochs=2, learning_rate=0.0)
        seen = []
        original = trainer.compute_loss

        def recording(model, inputs, *args, **kwargs):
            if model.training:
                seen.append(inputs["labels"].clone())
            return original(model, inputs, *args, **kwargs)

        trainer.compute_loss = recording
        trainer.train()
        masks[count] = seen
    assert len(masks[workers]) == 6  # 2 epochs x 3 batches, in dataset order
    for first, second in zip(masks[workers][:3], masks[workers][3:]):
        assert not torch.equal(first, second)
        assert ((first != -100) != (second != -100)).float().mean() > 0.05
    assert all(torch.equal(a, b) for a, b in zip(masks[0], masks[workers]))


@pytest.mark.parametrize("model_name", ["spanbert", "teams"])
def test_held_out_losses_are_deterministic_per_objective_and_leave_the_training_rng_alone(tmp_path, model_name):
    trainer = tiny_trainer(tmp_path, model_name, max_steps=2)
    first = trainer.evaluate()
    torch.manual_seed(1234)  # another global RNG state: TEAMS's generator samples with it
    trainer.data_collator.set_epoch(7)  # and another training epoch
    state = torch.get_rng_state()
    second = trainer.evaluate()
    assert torch.equal(state, torch.get_rng_state())  # evaluation did not advance training's random stream
    losses = {k: v for k, v in first.items() if not k.endswith(("runtime", "per_second")) and k != "epoch"}
    assert losses == {k: second[k] for k in losses}
    objectives = {"spanbert": ("mlm", "sbo"), "teams": ("mlm", "rtd", "mws")}[model_name]
    for objective in objectives:
        assert f"eval_{objective}_loss" in losses
    assert losses["eval_mlm_ppl"] == pytest.approx(math.exp(losses["eval_mlm_loss"]), rel=1e-3)


def test_tokenizer_training_is_deterministic_across_processes(tmp_path):
    """Two identical commands give the same vocabulary (tokenizers' own trainer numbers pieces in hash order)."""
    code = ("import sys; from encoder_zoo.training.data.corpus import load_corpus; "
            "from encoder_zoo.training.data.tokenizer import train_wordpiece_tokenizer; "
            "train_wordpiece_tokenizer(load_corpus(max_documents=300)['text'], vocab_size=2000)"
            ".save_pretrained(sys.argv[1])")
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-c", code, str(tmp_path / name)], check=True, env=pretrain_env(),
                       capture_output=True)
    a, b = (json.loads((tmp_path / name / "tokenizer.json").read_text()) for name in ("a", "b"))
    assert a["model"]["vocab"] == b["model"]["vocab"] and len(a["model"]["vocab"]) == 2000
    assert [t["content"] for t in a["added_tokens"]] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert "##e" in a["model"]["vocab"]  # continuation pieces stay ordinary vocabulary


# ---------------------------------------------------------------------------------------------- never damage, never mix
def test_overwrite_output_dir_moves_the_old_run_aside_and_mixes_nothing(tmp_path):
    """--overwrite_output_dir starts afresh: the old run's checkpoints, tokenizer and (external) export are moved
    aside untouched, and the new run's folders hold only its own files."""
    out, export = tmp_path / "run", tmp_path / "published"
    common = ["--model", "bert", "--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "60",
              "--validation_documents", "0", "--per_device_train_batch_size", "8", "--output_dir", str(out),
              "--export_dir", str(export)]
    pretrain(*common, "--tokenizer_vocab_size", "500", "--max_steps", "3", "--save_steps", "1",
             "--save_total_limit", "5")
    old = {path.relative_to(tmp_path): path.read_bytes() for path in tmp_path.rglob("*")
           if path.is_file() and not path.name.startswith(".encoder-zoo.lock")}  # the folder's lock stays with it
    pretrain(*common, "--tokenizer_vocab_size", "600", "--max_steps", "2", "--save_steps", "2",
             "--overwrite_output_dir")

    [replaced] = out.glob("replaced-*")
    [old_export] = tmp_path.glob("published.replaced-*")
    for name, data in old.items():  # every file of the first run, byte for byte, under its new place
        parts = name.parts
        moved = (replaced / Path(*parts[1:])) if parts[0] == "run" else (old_export / Path(*parts[1:]))
        assert moved.read_bytes() == data, name
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "global_batch.json",
                                                     "replaced-" + replaced.name[9:], "run_inputs.json", "tokenizer",
                                                     "trainer_state.json"]  # no lock left behind
    assert json.loads((out / "tokenizer" / "training_inputs.json").read_text())["vocab_size"] == 600
    log = json.loads((export / "training_log.json").read_text())
    assert max(entry["step"] for entry in log) == 2  # the new export's log, curve and card are the new run's
    assert "| steps | 2 |" in (export / "README.md").read_text()
    resumed = pretrain(*common, "--tokenizer_vocab_size", "600", "--max_steps", "2", "--resume_from_checkpoint", "true")
    # A finished run with its export has nothing to do: no re-export, nothing set aside.
    assert resumed.returncode == 0 and "Nothing to do" in resumed.stderr
    assert len(list(tmp_path.glob("published.replaced-*"))) == 1
