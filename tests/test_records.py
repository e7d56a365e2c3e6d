"""What a run leaves as its record and says of it: a resumed pretraining run's card and training_log.json are the
uninterrupted run's (loss rows, run mean, `train_loss`), but for the wall-clock fields named here; a resume names
each changed setting as what it is (data, or starting weights), and only the ones the run depends on; a fine-tuning
run's saved arguments name no path of the machine that trained it."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from helpers import card_without_time, pretrain
from test_failures import run
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

    card = card_without_time(resumed / "export")  # but for the wall-clock row
    assert card == card_without_time(reference / "export")
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


def tiny_bert(folder: Path, seed: int) -> Path:
    """A tiny `BertForPreTraining` with the offline MiniLM tokenizer: an --init_from checkpoint."""
    import torch
    import transformers

    from encoder_zoo.training.data.resources import minilm_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(seed)
    transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=128)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_resumed_init_from_run_is_refused_for_other_weights_not_for_an_unused_vocabulary_size(tmp_path, monkeypatch,
                                                                                               capsys):
    """An --init_from run trains no tokenizer: a resume with another --tokenizer_vocab_size goes ahead (here: nothing
    left to do). A resume from another checkpoint is refused in one line that calls it other starting weights, not a
    data setting, and lists no --tokenizer_vocab_size; with a data setting changed too, each is named as what it is."""
    first = tiny_bert(tmp_path / "bert", seed=0)
    args = ["--model", "spanbert", "--max_seq_length", "64", "--max_documents", "40", "--per_device_train_batch_size",
            "8", "--validation_documents", "0", "--max_steps", "2", "--save_steps", "2", "--warmup_steps", "1",
            "--dataloader_num_workers", "0", "--output_dir", tmp_path / "run"]
    code, stderr = run("pretrain.py", [*args, "--init_from", first], monkeypatch, capsys)
    assert code == 0, stderr[-3000:]
    assert "--tokenizer_vocab_size" not in json.loads((tmp_path / "run" / "run_inputs.json").read_text())

    resume = [*args, "--resume_from_checkpoint", "true"]
    code, stderr = run("pretrain.py", [*resume, "--init_from", first, "--tokenizer_vocab_size", "500"], monkeypatch,
                       capsys)
    assert code == 0, stderr[-3000:]
    assert sorted(path.name for path in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-2"]

    other = tiny_bert(tmp_path / "other", seed=1)
    code, stderr = run("pretrain.py", [*resume, "--init_from", other, "--tokenizer_vocab_size", "500"], monkeypatch,
                       capsys)
    last = stderr.strip().splitlines()[-1]
    assert code == 2 and f"the run started from other weights (--init_from '{first}' then, '{other}' now)" in last
    assert "data setting" not in last and "--tokenizer_vocab_size" not in last, last
    code, stderr = run("pretrain.py", [*resume, "--init_from", other, "--max_seq_length", "32"], monkeypatch, capsys)
    last = stderr.strip().splitlines()[-1]
    assert code == 2 and ("trained with other data settings (--max_seq_length 64 then, 32 now) and started from "
                          "other weights (--init_from") in last, last
    assert last.endswith("must continue on the examples its checkpoints were trained on and from the weights, "
                         "architecture and tokenizer it started from."), last


def test_an_unpad_runs_card_names_its_levers_and_what_config_unpad_does(tmp_path, monkeypatch, capsys):
    """`--unpad --target_buffer`: the card's settings table has a `speed levers` row naming both, and says that the
    exported config keeps `unpad: true` and how to load the model padded; a run without levers has no such row."""
    args = ["--model", "spanbert", "--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "40",
            "--tokenizer_vocab_size", "1000", "--per_device_train_batch_size", "8", "--validation_documents", "0",
            "--max_steps", "1", "--save_steps", "1", "--dataloader_num_workers", "0"]
    code, stderr = run("pretrain.py", [*args, "--unpad", "--target_buffer", "--output_dir", tmp_path / "run"],
                       monkeypatch, capsys)
    assert code == 0, stderr[-3000:]
    export = tmp_path / "run" / "export"
    assert json.loads((export / "config.json").read_text())["unpad"] is True
    row = next(line for line in (export / "README.md").read_text().splitlines() if line.startswith("| speed levers"))
    assert "`--unpad`" in row and "`--target_buffer`" in row and "`unpad=False`" in row, row
    assert "`--packing`" not in row

    from types import SimpleNamespace

    from encoder_zoo.training.run.export import lever_rows

    plain = SimpleNamespace(packing=False, unpad=False, target_buffer=False, attn_implementation=None)
    assert lever_rows(plain, SimpleNamespace(torch_compile=False)) == {}


def test_refusals_of_a_start_read_as_sentences_and_name_hf_download(tmp_path, monkeypatch):
    """--init_generator_from with a family that has no generator says so (not "only never"); a Hub id offline names
    `hf download`, the command huggingface_hub ships (it no longer ships `huggingface-cli`)."""
    from helpers import call_cli

    def refusal(*flags) -> str:
        result = call_cli("encoder_zoo.training.pretrain", *flags, "--output_dir", str(tmp_path / "run"))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        return result.stderr.strip().splitlines()[-1]

    bert = tiny_bert(tmp_path / "bert", seed=0)
    message = refusal("--model", "spanbert", "--init_from", str(bert), "--init_generator_from", str(bert))
    assert "--init_generator_from does not apply to --model spanbert: it has no separate generator; drop it." in message
    assert "never" not in message
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    message = refusal("--model", "bert", "--init_from", "no-such-org/no-such-model")
    assert "`hf download no-such-org/no-such-model --local-dir DIR`" in message and "huggingface-cli" not in message


def test_a_fine_tuned_folder_names_no_path_of_the_machine_that_trained_it(tmp_path):
    """run_glue's seed folder and its checkpoint: training_args.json holds `output_dir` relative to itself ("." and
    ".."), and no file there names the test's folder; a path outside the run keeps only its last component."""
    from helpers import local_paths_in, save_tiny_spanbert

    from encoder_zoo.glue.run_glue import main
    from encoder_zoo.training.run.trainer import portable_paths

    model = save_tiny_spanbert(tmp_path / "model", "SpanBertForSequenceClassification")
    main(["--model_name_or_path", model, "--trust_remote_code", "--task_name", "rotten_tomatoes", "--output_dir",
          str(tmp_path / "out"), "--max_train_samples", "16", "--max_eval_samples", "8", "--num_train_epochs", "1",
          "--per_device_train_batch_size", "8", "--seeds", "1", "--save_strategy", "steps", "--save_steps", "1"])
    seed = tmp_path / "out" / "rotten_tomatoes" / "seed-1"
    saved = json.loads((seed / "training_args.json").read_text())
    assert saved["output_dir"] == "." and saved["seed"] == 1
    assert json.loads((seed / "checkpoint-2" / "training_args.json").read_text())["output_dir"] == ".."
    assert local_paths_in(seed, tmp_path) == []

    root = tmp_path / "run"
    assert portable_paths({"deepspeed": "/etc/ds.json", "resume_from_checkpoint": "true", "run_name": "x",
                           "output_dir": str(root), "logging_dir": str(root / "logs")}, root / "checkpoint-4", root) \
        == {"deepspeed": "ds.json", "resume_from_checkpoint": "true", "run_name": "x", "output_dir": "..",
            "logging_dir": "../logs"}
