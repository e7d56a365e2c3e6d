"""`training/pretrain.py` end to end: export + reload, resume after interruption, 2 processes, bad input, and a
loss that really goes down on real text."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import PRETRAIN, call_cli, local_paths_in, pretrain, run_isolated, two_process_launcher
from helpers import pretrain_env as env

from encoder_zoo.training.recipes import get_recipe

TINY = ["--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "300", "--tokenizer_vocab_size", "2000",
        "--per_device_train_batch_size", "8", "--validation_documents", "20", "--dataloader_num_workers", "0"]


def real_text_run(model, out, steps, logging_steps, learning_rate="1e-3", model_size="tiny"):
    """A `tiny` pretraining run on 3,000 real Wikipedia documents (4,000-piece vocabulary, 16 x 128 tokens, 30 warmup
    steps, the recipe's optimiser at `learning_rate`, None: the paper's); returns the trainer_state.json of its final
    checkpoint."""
    pretrain("--model", model, "--model_size", model_size, "--max_seq_length", "128", "--max_documents", "3000",
             "--tokenizer_vocab_size", "4000", "--per_device_train_batch_size", "16",
             *(["--learning_rate", learning_rate] if learning_rate else []),
             "--warmup_steps", "30", "--max_steps", str(steps), "--logging_steps", str(logging_steps),
             "--save_steps", str(steps), "--validation_documents", "50", "--output_dir", str(out))
    return out / f"checkpoint-{steps}" / "trainer_state.json"


def train_logs(path):
    return [entry for entry in json.loads(Path(path).read_text())["log_history"] if "loss" in entry]


def test_pretrain_exports_a_hub_ready_folder_that_reloads_without_this_repository(tmp_path):
    out = tmp_path / "run"
    result = pretrain("--model", "spanbert", *TINY, "--output_dir", str(out), "--max_steps", "12", "--logging_steps",
                      "4", "--save_steps", "12")
    export = out / "export"
    # It ends as `make demo` does: what it trained, where the export is, and the next command to run.
    finished, exported, after = result.stdout.strip().splitlines()[-3:]
    assert finished.startswith("Finished: 12 steps; held-out MLM loss at [MASK] targets only (the headline) ")
    assert "; its unigram floor (token frequencies alone) " in finished  # the score's baseline, next to it
    assert "; training loss, mean over every step of the run " in finished and f"Exported to {export} " in exported
    assert after.startswith(f"Next, fine-tune it (seconds): python glue/run_glue.py --model_name_or_path {export} ")
    files = {p.name for p in export.iterdir()}
    assert {"config.json", "model.safetensors", "modeling_spanbert.py", "configuration_spanbert.py", "tokenizer.json",
            "tokenizer_config.json", "README.md", "loss_curve.png"} <= files
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in files)
    config = json.loads((export / "config.json").read_text())
    assert {"AutoModel", "AutoModelForPreTraining", "AutoModelForSequenceClassification",
            "AutoModelForQuestionAnswering"} <= set(config["auto_map"])

    card = (export / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    assert front["library_name"] == "transformers" and front["license"] == "apache-2.0"
    assert "spanbert" in front["tags"] and front["pipeline_tag"] == "feature-extraction"
    assert ("trust_remote_code=True" in card and "@article{joshi2020spanbert" in card
            and "![Training and validation loss](loss_curve.png)" in card)
    assert "LoraConfig(target_modules=['query', 'value']" in card  # PEFT has no default for custom model types
    # Nothing local goes to the Hub: the snippet loads a placeholder id (no --hub_model_id), no file names this machine.
    assert 'AutoModel.from_pretrained("<your-username>/spanbert-' in card and local_paths_in(export, tmp_path) == []
    assert "| training loss, mean over the run |" in card and "| training loss, last logged (step 12) |" in card
    # Where the time went: per logging interval in the log, and the run's totals in the card.
    assert len(re.findall(r"Step (4|8|12), time since the last log: waiting for data \d+%, forward and backward "
                          r"\d+%, optimizer step \d+%, saving checkpoints \d+%, other \d+% of [\d.]+ s\.",
                          result.stderr)) == 3
    assert re.search(r"\| time \| waiting for data \d+%, .* of [\d.]+ s, on process 0 \|", card)
    # The run's optimisation, read from its trainer, next to its recipe's for the size (tiny: SpanBERT's optimiser at
    # the tiny size's own rate and warmup, 200 of 4,000 updates of 128 tokens).
    for row in ("| optimizer | AdamW (betas 0.9, 0.999; eps 1e-08) | AdamW (betas 0.9, 0.999; eps 1e-08) |",
                "| weight decay | 0.01, every parameter | 0.01, every parameter |",
                "| warmup | 1 of 12 updates (8.33%) | 200 of 4000 updates (5.00%) |",
                "| peak learning rate | 0.001 | 0.001 |", "| sequence length | 64 | 128 |"):
        assert row in card, row
    assert "ours for the tiny size (no paper trains one)" in card

    # Reference outputs from the repository's own classes, then the same from a process that cannot import it.
    from transformers import AutoModel, AutoTokenizer

    from encoder_zoo import models  # noqa: F401

    tokenizer = AutoTokenizer.from_pretrained(export, trust_remote_code=True)
    batch = tokenizer(["Spans are masked.", "A second, longer sentence about Wikipedia."], padding=True,
                      return_tensors="pt")
    reference = AutoModel.from_pretrained(export).eval()(**batch).last_hidden_state
    torch.save(dict(batch), tmp_path / "batch.pt")
    result = json.loads(run_isolated(f"""
        import json, torch
        from transformers import (AutoModel, AutoModelForPreTraining, AutoModelForSequenceClassification,
                                  AutoModelForQuestionAnswering)
        path, batch = {str(export)!r}, torch.load({str(tmp_path / "batch.pt")!r})
        with torch.no_grad():
            hidden = AutoModel.from_pretrained(path, trust_remote_code=True).eval()(**batch).last_hidden_state
            names = {{}}
            for auto in (AutoModelForPreTraining, AutoModelForSequenceClassification, AutoModelForQuestionAnswering):
                names[auto.__name__] = type(auto.from_pretrained(path, trust_remote_code=True)).__name__
        print(json.dumps({{"hidden": hidden.tolist(), "names": names}}))
    """).strip().splitlines()[-1])
    torch.testing.assert_close(torch.tensor(result["hidden"]), reference, rtol=1e-5, atol=1e-5)
    assert result["names"] == {
        "AutoModelForPreTraining": "SpanBertForPreTraining",
        "AutoModelForSequenceClassification": "SpanBertForSequenceClassification",
        "AutoModelForQuestionAnswering": "SpanBertForQuestionAnswering",
    }


def test_interrupted_run_resumes_from_its_checkpoint_with_optimizer_and_scheduler_state(tmp_path):
    out = tmp_path / "run"
    args = ["--model", "spanbert", *TINY, "--output_dir", str(out), "--max_steps", "150", "--logging_steps", "5",
            "--save_steps", "10", "--save_total_limit", "10", "--eval_steps", "1000", "--warmup_steps", "20"]
    process = subprocess.Popen([sys.executable, PRETRAIN, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env=env())
    deadline = time.time() + 300
    while not (out / "checkpoint-10" / "trainer_state.json").exists():
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 128 + signal.SIGTERM  # saved, then a status a scheduler tells from success
    assert "stopped by SIGTERM" in process.stderr.read()
    checkpoints = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    interrupted_at = checkpoints[-1]
    assert 10 <= interrupted_at < 150, checkpoints  # saved where the signal stopped it, before the end
    assert not (out / "export").exists()

    resumed = pretrain(*args, "--resume_from_checkpoint", "true")
    final = out / "checkpoint-150"
    state = json.loads((final / "trainer_state.json").read_text())
    assert state["global_step"] == 150
    steps = [entry["step"] for entry in train_logs(final / "trainer_state.json")]
    assert steps == sorted(set(steps)) and steps[-1] == 150  # no step trained twice, none skipped in the log
    assert min(s for s in steps if s > interrupted_at) <= interrupted_at + 5  # picked up right where it stopped
    optimizer = torch.load(final / "optimizer.pt", weights_only=False)
    assert {int(v["step"]) for v in optimizer["state"].values()} == {150}  # Adam moments carried over
    scheduler = torch.load(final / "scheduler.pt", weights_only=False)
    assert scheduler["last_epoch"] == 150  # schedule continued, not restarted
    # Learning rates logged after the resume follow the same linear schedule (the tiny size's peak, 20 warmup, 150
    # steps); the rate logged at step s is the one step s used, i.e. the schedule at s - 1.
    peak = get_recipe("spanbert").training_defaults["tiny"].learning_rate
    for entry in train_logs(final / "trainer_state.json"):
        taken = entry["step"] - 1
        expected = peak * (taken / 20 if taken < 20 else (150 - taken) / 130)
        assert entry["learning_rate"] == pytest.approx(expected, rel=0.05, abs=1e-7)
    assert (out / "export" / "model.safetensors").exists()
    assert ("Resuming" in resumed.stderr or "Continuing training from checkpoint" in resumed.stderr
            or resumed.returncode == 0)


@pytest.mark.multiprocess
def test_two_process_cpu_run(tmp_path):
    # On a CPU-only machine `accelerate launch --cpu` starts ONE process; --multi_gpu starts two that Trainer runs
    # as CPU DDP over gloo (see README).
    out = tmp_path / "run"
    pretrain("--model", "spanbert", *TINY, "--output_dir", str(out), "--max_steps", "6", "--logging_steps", "3",
             "--save_steps", "6", launcher=two_process_launcher())
    card = (out / "export" / "README.md").read_text()
    assert "| batch (sequences per update) | 16 | not stated |" in card  # 8 per process x 2; tiny has no paper
    state = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6 and state["train_batch_size"] == 8


def pretrain_cli(*args):
    """pretrain.py's command line in this process (its refusals come before any training)."""
    return call_cli("encoder_zoo.training.pretrain", *args)


def test_bad_input_gets_clear_errors_and_keeps_what_is_saved(tmp_path):
    unknown = pretrain_cli("--model", "gpt5", "--output_dir", str(tmp_path / "x"))
    assert (unknown.returncode == 2 and "Unknown --model 'gpt5'. Available: " in unknown.stderr
            and "spanbert" in unknown.stderr)
    assert "Traceback" not in unknown.stderr

    missing = pretrain_cli("--model", "spanbert", *TINY, "--dataset", str(tmp_path / "nowhere.jsonl"), "--output_dir",
                           str(tmp_path / "y"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n".join(json.dumps({"text": t}) for t in ["", "   ", ""]) + "\n")
    result = pretrain_cli("--model", "spanbert", *TINY, "--dataset", str(empty), "--output_dir", str(tmp_path / "z"))
    assert result.returncode == 2 and "no non-empty document" in result.stderr

    wrong_column = tmp_path / "body.jsonl"
    wrong_column.write_text(json.dumps({"body": "Some text."}) + "\n")
    result = pretrain_cli("--model", "spanbert", *TINY, "--dataset", str(wrong_column), "--output_dir",
                          str(tmp_path / "w"))
    assert result.returncode == 2 and "Column 'text' not found" in result.stderr and "['body']" in result.stderr

    override = pretrain_cli("--model", "spanbert", *TINY, "--config_overrides", "not_a_field=3", "--output_dir",
                            str(tmp_path / "v"), "--max_steps", "1")
    assert override.returncode == 2 and "not_a_field" in override.stderr

    # An existing run is never trained over silently; its checkpoint survives.
    out = tmp_path / "run"
    pretrain("--model", "bert", *TINY, "--output_dir", str(out), "--max_steps", "2", "--save_steps", "2")
    before = (out / "checkpoint-2" / "model.safetensors").read_bytes()
    again = pretrain("--model", "bert", *TINY, "--output_dir", str(out), "--max_steps", "2", check=False)
    assert again.returncode == 2 and "--resume_from_checkpoint" in again.stderr
    assert (out / "checkpoint-2" / "model.safetensors").read_bytes() == before


def test_documents_longer_than_the_position_limit_are_split_into_blocks(tmp_path):
    from transformers import AutoTokenizer

    from encoder_zoo.training.data.blocks import pack_blocks
    from encoder_zoo.training.data.corpus import load_corpus
    from encoder_zoo.training.data.resources import minilm_path

    long_text = " ".join(load_corpus(max_documents=60)["text"])  # one document of ~5k words, one giant "sentence" too
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"text": long_text}) + "\n" + json.dumps({"text": "word " * 3000}) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    blocks = pack_blocks(load_corpus(str(data)), tokenizer, max_seq_length=128)
    lengths = [len(ids) for ids in blocks["input_ids"]]
    assert max(lengths) <= 128 and len(blocks) > 40
    assert all(ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id for ids in blocks["input_ids"])
    # The whole text survives packing: every word piece lands in some block.
    pieces = len(tokenizer(long_text, add_special_tokens=False)["input_ids"]) + 3000
    assert sum(lengths) - 2 * len(blocks) == pytest.approx(pieces, rel=0.01)
    pretrain("--model", "spanbert", "--model_size", "tiny", "--dataset", str(data), "--max_seq_length", "128",
             "--tokenizer_vocab_size", "1000", "--validation_documents", "0", "--per_device_train_batch_size", "4",
             "--output_dir", str(tmp_path / "run"), "--max_steps", "3", "--save_steps", "3")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["spanbert", "bert"])
def test_loss_goes_down_on_real_text(tmp_path, model):
    state = real_text_run(model, tmp_path / "run", steps=300, logging_steps=20)
    logs = train_logs(state)
    keys = ("mlm_loss", "sbo_loss") if model == "spanbert" else ("mlm_loss",)
    for key in keys:
        first, last = logs[0][key], sum(entry[key] for entry in logs[-3:]) / 3
        # From ~ln(4000) = 8.3 nats: a drop of over 1 nat (perplexity down >60%) on real text, not noise.
        assert last < first - 1.0, (key, first, last)
    assert all(entry["tokens_per_second"] > 0 for entry in logs)
    eval_loss = [e["eval_loss"] for e in json.loads(state.read_text())["log_history"] if "eval_loss" in e]
    assert eval_loss and eval_loss[-1] < 2 * 8.3 - 2


def test_demo_runs_end_to_end_with_a_relative_output_dir(tmp_path):
    """The main job (`make demo`), shortened: pretrain, export, reload in a fresh process, summary."""
    result = subprocess.run([sys.executable, "-m", "encoder_zoo.training.demo", "--output_dir", "runs/demo",
                             "--max_steps", "4", "--model_size", "tiny"], capture_output=True, text=True, env=env(),
                            cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "==== SpanBERT demo summary ====" in result.stdout
    assert "transformers_modules" in result.stdout and "fresh process, trust_remote_code=True" in result.stdout
    assert (tmp_path / "runs" / "demo" / "export" / "model.safetensors").exists()
    assert "4 steps" in result.stdout  # the run's steps, not its last logged step
    # each number named: the headline beside its unigram floor, the others after it, the two training means apart
    assert "nats, MLM at [MASK]ed targets only (the headline), against its unigram floor " in result.stdout
    assert "also: MLM over all 80/10/10 targets " in result.stdout
    assert "over every step of the run (its logged intervals; the card's);\n" in result.stdout
    assert "Trainer's printed train_loss averages this session's steps only" in result.stdout


@pytest.mark.slow
def test_a_demo_rerun_reuses_its_export_and_keeps_one_earlier_copy(tmp_path):
    """Rerun with the same options: nothing is trained and the export is byte for byte the same. Other options: a new
    run, the previous one moved to replaced-<time>/, and only the newest earlier copy kept."""
    def demo(steps):
        result = subprocess.run([sys.executable, "-m", "encoder_zoo.training.demo", "--output_dir", "demo",
                                 "--max_steps", str(steps), "--model_size", "tiny"], capture_output=True, text=True,
                                env=env(), cwd=tmp_path, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    weights = tmp_path / "demo" / "export" / "model.safetensors"
    demo(3)
    first = (weights.read_bytes(), weights.stat().st_mtime_ns)
    again = demo(3)
    assert "reusing the finished demo" in again.stdout and "Nothing to do" in again.stderr
    assert (weights.read_bytes(), weights.stat().st_mtime_ns) == first
    assert not list((tmp_path / "demo").glob("replaced-*"))
    demo(2)
    time.sleep(1.1)  # replaced-<time> names have a one-second resolution
    last = demo(3)
    earlier = list((tmp_path / "demo").glob("replaced-*"))
    assert len(earlier) == 1 and "removed the older demo run" in last.stdout
    assert "3 steps" in last.stdout
