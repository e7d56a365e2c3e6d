"""The divergence guard covers every recipe and names the likely cause (a GAN that collapses to exactly 0 stops as a
NaN run does; weights that were bad before training are blamed, not the learning rate; a suggested rate is at least
10x lower and never above the recipe's default), and the training-side inputs that used to pass silently or
unclearly: word vectors (coverage, damaged caches and files, NaN or huge values), held-out and document counts, text
columns that hold no text.

Runs call the entry points' `cli()` in this process (as tests/test_failures.py does), to pay the imports once."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import shutil
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import save_tiny_spanbert
from test_failures import run, stop_signals_restored  # noqa: F401 (an autouse fixture: in-process runs' signals)

from encoder_zoo.training.run import DivergenceGuard, TrainingDiverged
from encoder_zoo.training.run.trainer import GanTrainer, starting_weights_problem, suggested_learning_rate

# The tiny CNN on 6 real articles (~700 pairs), 16 pairs a step.
BERTAC = ["--model", "bertac_cnn", "--model_size", "tiny", "--max_documents", "6", "--per_device_train_batch_size",
          "16", "--dataloader_num_workers", "0", "--validation_documents", "0", "--logging_steps", "1",
          "--disable_tqdm", "true"]
SPANBERT = ["--model", "spanbert", "--model_size", "tiny", "--max_seq_length", "64", "--tokenizer_vocab_size", "500",
            "--max_steps", "1", "--dataloader_num_workers", "0", "--disable_tqdm", "true"]


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


# ---------------------------------------------------------------------------------------------- learning rates
def test_a_suggested_learning_rate_is_ten_times_lower_and_never_above_the_default():
    assert suggested_learning_rate(1e30, 2e-4) == "0.0002"  # not 1e+29
    assert suggested_learning_rate(2e-4, 2e-4) == "2e-05"
    assert suggested_learning_rate(1e-3) == "0.0001"
    for rate in (1.55e-4, 3.3e-3, 7.77e-5, 1e30):
        assert float(suggested_learning_rate(rate)) <= rate / 10


# --------------------------------------------------------------------------------------------- a collapsing GAN
@pytest.fixture(scope="module")
def collapsed_run(tmp_path_factory):
    """bertac_cnn at --learning_rate 1e30: D saturates at once, and every loss and gradient becomes exactly 0 (the
    run used to export that). Its fastText vectors stay in its folder for the tests below."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    out = tmp_path_factory.mktemp("collapsed") / "run"
    monkeypatch = pytest.MonkeyPatch()
    from encoder_zoo.training.pretrain import cli

    monkeypatch.setattr(sys, "argv", ["pretrain.py", *BERTAC, "--max_steps", "6", "--save_steps", "1",
                                      "--learning_rate", "1e30", "--output_dir", str(out)])
    handler = logging.Handler()
    records: list[str] = []
    handler.emit = lambda record: records.append(record.getMessage())
    pretrain_logger = logging.getLogger("pretrain")
    level = pretrain_logger.level
    pretrain_logger.addHandler(handler)
    pretrain_logger.setLevel(logging.INFO)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            cli()
        code = 0
    except SystemExit as stop:
        code = stop.code
    finally:
        pretrain_logger.removeHandler(handler)
        pretrain_logger.setLevel(level)
        monkeypatch.undo()
        for sig, handler_ in saved.items():
            signal.signal(sig, handler_)
    return SimpleNamespace(code=code, stderr=stderr.getvalue(), log="\n".join(records), out=out,
                           vectors=next((out / "word_vectors").glob("fasttext-32d-*.vec")))


def test_a_collapsing_gan_stops_with_status_3_and_exports_nothing(collapsed_run):
    message = last_line(collapsed_run.stderr)
    assert collapsed_run.code == 3, collapsed_run.stderr[-3000:]
    found = re.search(r"training diverged at step (\d+): the GAN collapsed: the losses and gradient norms all became "
                      r"exactly 0 \(of D and R and of F\)", message)
    assert found, message
    step = int(found.group(1))
    assert "Likely cause: the learning rate (1e+30, 5e+33 times the recipe's default 0.0002)" in message
    assert ("Rerun with a lower --learning_rate (e.g. 0.0002), or try --config_overrides generator_loss=non_saturating"
            in message)
    assert "1e+29" not in message
    # Checkpoints of the steps before the collapse only; the one whose weights collapsed is named, nothing exported.
    out = collapsed_run.out
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{s}" for s in range(1, step)]
    assert f"{out / f'checkpoint-{step - 1}'} holds the weights that gave the first collapsed step" in message
    assert not (out / "export").exists() and not list(out.glob(".export*"))
    # The parameter count says how many, not "0.0M".
    assert re.search(r"bertac_cnn tiny: [\d.]+K parameters", collapsed_run.log), collapsed_run.log


def test_a_gan_with_non_saturating_loss_is_not_told_to_set_it(collapsed_run, tmp_path, monkeypatch, capsys):
    code, stderr = run("pretrain.py", [*BERTAC, "--max_steps", "4", "--save_steps", "100", "--learning_rate", "1e30",
                                       "--word_vectors", collapsed_run.vectors, "--output_dir", tmp_path / "run",
                                       "--config_overrides", "generator_loss=non_saturating"], monkeypatch, capsys)
    message = last_line(stderr)
    assert code == 3, stderr[-3000:]
    assert "generator_loss=non_saturating" not in message
    assert "No checkpoint was saved yet. Likely cause: the learning rate" in message
    assert "Resume from it" not in message
    assert "Start the run again with a lower --learning_rate (e.g. 0.0002)" in message


def gan_step_checker(tmp_path, limit: int) -> GanTrainer:
    """A GanTrainer with just what its collapse check reads (no model, no data)."""
    trainer = GanTrainer.__new__(GanTrainer)
    trainer.args = SimpleNamespace(output_dir=str(tmp_path), learning_rate=1e-3, fp16=False)
    trainer.state = SimpleNamespace(global_step=4)
    guard = DivergenceGuard(limit, resumable=True, default_learning_rate=2e-4)
    trainer.callback_handler = SimpleNamespace(callbacks=[guard])
    trainer._previous_values, trainer._collapsed_steps = None, 0
    trainer.non_saturating, trainer.alternating = False, True
    return trainer


def test_a_gan_whose_gradients_vanish_and_losses_stop_changing_counts_as_collapsed(tmp_path):
    """Zero gradients with losses that repeat the step before: nothing learns. Non-zero gradients never count, and a
    streak shorter than --max_nonfinite_steps is allowed."""
    trainer = gan_step_checker(tmp_path, limit=2)
    stuck = torch.tensor([1.386, 0.0, 0.693, 0.0])
    trainer._stop_if_collapsed(stuck, ("D and R", "F"))  # nothing to compare with yet
    for _ in range(3):
        trainer._stop_if_collapsed(torch.tensor([1.386, 0.1, 0.693, 0.2]), ("D and R", "F"))  # learning
    trainer._stop_if_collapsed(stuck, ("D and R", "F"))
    trainer._stop_if_collapsed(stuck, ("D and R", "F"))  # 1 repeated step of 2 allowed
    with pytest.raises(TrainingDiverged, match=r"gradient norms became exactly 0 and its losses stopped changing .*"
                                               r"for 2 steps in a row \(--max_nonfinite_steps 2\)"):
        trainer._stop_if_collapsed(stuck, ("D and R", "F"))


# ------------------------------------------------------------------------------------------- the likely cause
def test_fine_tuning_an_input_model_with_nan_weights_blames_the_weights(tmp_path, monkeypatch, capsys):
    """run_glue.py on a model whose weights are all NaN: the guard stops it (status 3) naming the weights, and does
    not send the user after the learning rate."""
    from safetensors.torch import load_file, save_file

    model = Path(save_tiny_spanbert(tmp_path / "model", "SpanBertForSequenceClassification"))
    weights = load_file(model / "model.safetensors")
    save_file({name: torch.full_like(t, float("nan")) if t.is_floating_point() else t for name, t in weights.items()},
              model / "model.safetensors", metadata={"format": "pt"})
    code, stderr = run("run_glue.py", ["--model_name_or_path", model, "--trust_remote_code", "--output_dir",
                                       tmp_path / "out", "--max_train_samples", "16", "--max_eval_samples", "8",
                                       "--max_steps", "2", "--per_device_train_batch_size", "4", "--disable_tqdm",
                                       "true"], monkeypatch, capsys)
    message = last_line(stderr)
    assert code == 3, stderr[-3000:]
    assert "Likely cause: the weights training began from were already non-finite" in message
    assert "tensors hold NaN/inf (" in message and "a lower learning rate will not help" in message
    assert "Rerun with a lower --learning_rate" not in message
    assert not list((tmp_path / "out").rglob("model.safetensors"))


def test_huge_frozen_word_vectors_are_named_as_the_cause():
    from encoder_zoo.models.bertac.configuration_bertac import BertacCnnConfig
    from encoder_zoo.models.bertac.modeling_bertac import BertacCnnForPreTraining

    model = BertacCnnForPreTraining(BertacCnnConfig(vocab_size=30, word_embedding_dim=8, filter_windows=[1],
                                                    num_filters=4, mask_token_id=2))
    assert starting_weights_problem(model) is None
    with torch.no_grad():
        model.get_input_embeddings().weight[5] = 1e30
    problem = starting_weights_problem(model)
    assert "values up to 1e+30" in problem and "frozen word vectors: bertac_cnn's --word_vectors" in problem
    guard = DivergenceGuard(default_learning_rate=2e-4)
    guard.input_problem = problem
    assert "learning rate" not in guard.cause(SimpleNamespace(learning_rate=2e-4)).split(";")[0]


# ------------------------------------------------------------------------------------------------ word vectors
def vec_lines(vectors: Path) -> list[str]:
    return vectors.read_text(encoding="utf-8").splitlines(keepends=True)


@pytest.mark.parametrize("value, problem", [("nan", "holds NaN/inf"), ("1e30", "holds values up to 1e+30")])
def test_nan_or_huge_word_vectors_are_refused_before_training(collapsed_run, tmp_path, monkeypatch, capsys, value,
                                                               problem):
    lines = vec_lines(collapsed_run.vectors)
    word, values = lines[2].split(" ", 1)
    lines[2] = word + " " + " ".join([value] * len(values.split())) + "\n"  # a frequent word
    damaged = tmp_path / "vectors.vec"
    damaged.write_text("".join(lines), encoding="utf-8")
    code, stderr = run("pretrain.py", [*BERTAC, "--max_steps", "2", "--word_vectors", damaged, "--output_dir",
                                       tmp_path / "run"], monkeypatch, capsys)
    assert code == 2 and f"--word_vectors {damaged}: line 3 ({word!r}) {problem}" in last_line(stderr), stderr[-3000:]
    assert not list((tmp_path / "run").glob("checkpoint-*"))


def test_word_vectors_that_miss_the_frequent_words_are_refused_unless_accepted(collapsed_run, tmp_path, monkeypatch,
                                                                                 capsys):
    """Vectors of other words (here: every word misspelt) cover 0 of the CNN's frequent words: refused, naming the
    flag to accept them; accepted with --min_word_vector_coverage 0."""
    lines = vec_lines(collapsed_run.vectors)
    foreign = tmp_path / "foreign.vec"
    foreign.write_text(lines[0] + "".join("zz" + line for line in lines[1:]), encoding="utf-8")
    args = [*BERTAC, "--max_steps", "1", "--word_vectors", foreign, "--output_dir", tmp_path / "run"]
    code, stderr = run("pretrain.py", args, monkeypatch, capsys)
    message = last_line(stderr)
    assert code == 2 and re.search(rf"--word_vectors {re.escape(str(foreign))} covers 0 of the \d+ most frequent CNN "
                                   r"words \(0%", message), stderr[-3000:]
    assert "--min_word_vector_coverage 0" in message
    code, stderr = run("pretrain.py", [*args, "--min_word_vector_coverage", "0"], monkeypatch, capsys)
    assert code == 0, stderr[-3000:]


@pytest.mark.parametrize("damage", ["ragged", "cut_mid_line", "cut_at_a_line"])
def test_a_damaged_word_vector_file_is_refused_naming_its_lines(collapsed_run, tmp_path, damage):
    from encoder_zoo.training.data.bertac_pairs import DamagedWordVectors, read_word_vectors

    lines = vec_lines(collapsed_run.vectors)
    count, dim = map(int, lines[0].split())
    if damage == "ragged":  # one value short on lines 5 and 8
        for index in (4, 7):
            lines[index] = lines[index].rsplit(" ", 1)[0] + "\n"
        expected = (f"2 vector lines of another length than the header's {dim} values (line 5 has {dim - 1}, line 8 "
                    f"has {dim - 1})")
    elif damage == "cut_mid_line":  # a download cut at 2%
        text = "".join(lines)
        cut = len(text) // 50 + (5 if text[len(text) // 50 - 1] == "\n" else 0)  # inside a line
        lines = [text[:cut]]
        expected = f"of another length than the header's {dim} values (line {lines[0].count(chr(10)) + 1} has"
    else:
        lines = lines[:300]
        expected = f"it holds 299 vectors but its header line says {count:,}: the file was cut short"
    damaged = tmp_path / "damaged.vec"
    damaged.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(DamagedWordVectors) as raised:
        read_word_vectors(damaged, {"the", "of"})
    assert str(raised.value).startswith(f"--word_vectors {damaged}: ") and expected in str(raised.value)
    assert "word_embedding_dim" not in str(raised.value)  # the file is damaged: no other dimension to advise


def test_a_damaged_fasttext_cache_is_trained_again_naming_it(collapsed_run, tmp_path, monkeypatch, capsys, caplog):
    """A reused cache cut at a line boundary (its header still counting every word) is checked against its header,
    named, and trained again: the run then has the vectors a fresh run has."""
    out = tmp_path / "run"
    shutil.copytree(collapsed_run.out / "word_vectors", out / "word_vectors")
    cache = out / "word_vectors" / collapsed_run.vectors.name
    lines = vec_lines(cache)
    cache.write_text("".join(lines[:300]), encoding="utf-8")
    with caplog.at_level(logging.INFO):
        code, stderr = run("pretrain.py", [*BERTAC, "--max_steps", "1", "--output_dir", out], monkeypatch, capsys)
    assert code == 0, stderr[-3000:]
    assert f"The cached fastText vectors {cache} are damaged (it holds 299 vectors but its header line" in caplog.text
    assert cache.read_text(encoding="utf-8") == collapsed_run.vectors.read_text(encoding="utf-8")  # trained again


# ------------------------------------------------------------------------------------------- documents, columns
def texts_file(path: Path, values) -> Path:
    path.write_text("".join(json.dumps({"text": v, "title": "t"}) + "\n" for v in values), encoding="utf-8")
    return path


@pytest.mark.parametrize("case", ["max_documents_0", "held_out_all", "held_out_all_of_the_file", "int_text",
                                  "list_text", "unknown_column"])
def test_bad_document_counts_and_text_columns_are_refused_naming_the_flag(tmp_path, monkeypatch, capsys, case):
    data = texts_file(tmp_path / "docs.jsonl", [f"Document {i} is here. It has two sentences." for i in range(12)])
    args, expected = {
        "max_documents_0": (["--max_documents", "0"], "--max_documents 0 reads no document: pass a positive number"),
        "held_out_all": (["--max_documents", "200", "--validation_documents", "300"],
                         "--validation_documents 300 holds out at least all of the --max_documents 200 documents"),
        "held_out_all_of_the_file": (["--dataset", data, "--validation_documents", "12"],
                                     "--validation_documents 12 is not below the 12 documents there are"),
        "int_text": (["--dataset", texts_file(tmp_path / "ints.jsonl", ["A text.", 5, "B"])],
                     "Column 'text' of '" + str(tmp_path / "ints.jsonl") + "' holds int values, not text: row 2"),
        "list_text": (["--dataset", texts_file(tmp_path / "lists.jsonl", ["A text.", ["a", "b"]])],
                      "holds list values, not text: row 2 (counting from 1) is ['a', 'b']"),
        "unknown_column": (["--dataset", data, "--text_column", "body"], "Column 'body' not found in"),
    }[case]
    out = tmp_path / "run"
    code, stderr = run("pretrain.py", [*SPANBERT, *args, "--output_dir", out], monkeypatch, capsys)
    message = last_line(stderr)
    assert code == 2 and message.startswith("pretrain.py: error: ") and expected in message, stderr[-3000:]
    if case == "unknown_column":
        assert "its columns are ['text', 'title']" in message
    assert not list(out.glob("checkpoint-*"))
    assert not any(p.name.startswith(".encoder-zoo.lock") for p in out.glob(".*"))  # released and removed
