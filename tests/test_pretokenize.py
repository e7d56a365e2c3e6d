"""`training/pretokenize.py`: a corpus tokenized and packed once, in shards, reused by runs on any number of
processes, which train exactly as a run that tokenizes the corpus itself; mismatches are refused."""

import json
import subprocess
import sys

import pytest
from helpers import REPO, pretrain, pretrain_env, two_process_launcher

PRETOKENIZE = [sys.executable, f"{REPO}/training/pretokenize.py"]
RUN = ["--model_size", "tiny", "--max_seq_length", "64", "--per_device_train_batch_size", "8",
       "--validation_documents", "20", "--max_steps", "5", "--save_steps", "5", "--logging_steps", "1",
       "--dataloader_num_workers", "0"]


def pretokenize(*args, check=True):
    result = subprocess.run([*PRETOKENIZE, *args], capture_output=True, text=True, env=pretrain_env(), timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(f"pretokenize failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    """300 documents as 64-token blocks, tokenized by 2 processes into 3 shards, with a trained 1,000-piece
    vocabulary."""
    out = tmp_path_factory.mktemp("pretokenized") / "blocks"
    pretokenize("--model", "spanbert", "--max_documents", "300", "--tokenizer_vocab_size", "1000", "--max_seq_length",
                "64", "--validation_documents", "20", "--num_proc", "2", "--num_shards", "3", "--output_dir", str(out))
    return out


def losses(out, step=5):
    history = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["log_history"]
    return [e["loss"] for e in history if "loss" in e], [e["eval_loss"] for e in history if "eval_loss" in e]


def test_pretokenized_shards_record_and_counts(blocks):
    record = json.loads((blocks / "pretokenized.json").read_text())
    assert record["examples_format"] == "encoder_zoo.training.data.blocks.pack_blocks"
    assert record["recipes"] == ["bert", "electra", "spanbert", "teams"] and record["max_seq_length"] == 64
    assert record["documents"] == {"train": 280, "validation": 20}
    assert sorted(p.name for p in (blocks / "data" / "train").glob("*.arrow")) == [f"data-0000{i}-of-00003.arrow"
                                                                                   for i in range(3)]
    import datasets
    import numpy as np

    train = datasets.load_from_disk(str(blocks / "data"))["train"]
    assert train["example_index"] == list(range(len(train))) and len(train) == record["examples"]["train"]
    counts = np.load(blocks / "unigram_counts.npy")
    assert counts.sum() == record["tokens"] == sum(len(ids) for ids in train["input_ids"])
    assert not list(blocks.parent.glob(".*incomplete"))


@pytest.mark.slow
def test_a_run_on_pretokenized_data_trains_as_a_run_that_tokenizes_itself(blocks, tmp_path):
    """Same held-out documents, vocabulary, blocks, masks: every step's loss and the held-out loss are equal."""
    pretrain("--model", "spanbert", *RUN, "--pretokenized", str(blocks), "--output_dir", str(tmp_path / "pre"))
    pretrain("--model", "spanbert", *RUN, "--max_documents", "300", "--tokenizer_vocab_size", "1000",
             "--output_dir", str(tmp_path / "own"))
    assert losses(tmp_path / "pre") == losses(tmp_path / "own")
    card = (tmp_path / "pre" / "export" / "README.md").read_text()
    assert "pre-tokenized: 1156 examples" in card or "pre-tokenized:" in card


@pytest.mark.multiprocess
def test_two_processes_share_one_pretokenized_folder(blocks, tmp_path):
    out = tmp_path / "run"
    pretrain("--model", "teams", *RUN, "--pretokenized", str(blocks), "--output_dir", str(out),
             launcher=two_process_launcher())
    assert "| batch (sequences per update) | 16 |" in (out / "export" / "README.md").read_text()
    assert json.loads((out / "checkpoint-5" / "trainer_state.json").read_text())["global_step"] == 5


def refused(script_module, argv, monkeypatch, capsys) -> str:
    """Run a script's cli() in this process (as `python script.py` would); return its one error line."""
    import importlib

    monkeypatch.setattr(sys, "argv", ["script.py", *argv])
    monkeypatch.delenv("PRETRAIN_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exit:
        importlib.import_module(script_module).cli()
    stderr = capsys.readouterr().err
    assert exit.value.code == 2 and "Traceback" not in stderr, stderr[-2000:]
    return stderr.strip().splitlines()[-1]


def test_mismatches_are_refused_with_the_fix(blocks, tmp_path, monkeypatch, capsys):
    from encoder_zoo.training.data.resources import minilm_path

    def pretrain_refuses(*args):
        return refused("encoder_zoo.training.pretrain", [*RUN, "--output_dir", str(tmp_path / "x"), *args], monkeypatch,
                       capsys)

    assert "pass --max_seq_length 64" in pretrain_refuses("--model", "spanbert", "--pretokenized", str(blocks),
                                                          "--max_seq_length", "128")
    assert "--model cloze trains on" in pretrain_refuses("--model", "cloze", "--pretokenized", str(blocks))
    assert "is not the tokenizer" in pretrain_refuses("--model", "bert", "--pretokenized", str(blocks),
                                                      "--tokenizer_name", str(minilm_path()))
    assert "drop --dataset" in pretrain_refuses("--model", "bert", "--pretokenized", str(blocks),
                                                "--dataset", str(blocks))
    assert "spaCy named_entity spans" in pretrain_refuses("--model", "spanbert", "--pretokenized", str(blocks),
                                                          "--masking_scheme", "named_entity")
    assert "does not exist" in pretrain_refuses("--model", "bert", "--pretokenized", str(tmp_path / "nowhere"))
    assert not list(tmp_path.rglob("checkpoint-*"))

    before = sorted(p.name for p in blocks.rglob("*"))
    assert "not an empty folder" in refused("encoder_zoo.training.pretokenize",
                                            ["--model", "spanbert", "--output_dir", str(blocks)],
                                            monkeypatch, capsys)
    assert sorted(p.name for p in blocks.rglob("*")) == before  # never written over
    assert "reads its own corpus" in refused("encoder_zoo.training.pretokenize",
                                             ["--model", "bertac_cnn", "--output_dir", str(tmp_path / "b")],
                                             monkeypatch, capsys)


@pytest.mark.slow
def test_cloze_paragraphs_pretokenize_and_train(tmp_path):
    from encoder_zoo.training.data.resources import minilm_path

    out = tmp_path / "paragraphs"
    pretokenize("--model", "cloze", "--max_documents", "100", "--tokenizer_name", str(minilm_path()),
                "--max_seq_length", "64", "--validation_documents", "10", "--output_dir", str(out))
    record = json.loads((out / "pretokenized.json").read_text())
    assert record["recipes"] == ["cloze"] and record["tokenizer"] == str(minilm_path())
    pretrain("--model", "cloze", *RUN, "--max_steps", "2", "--save_steps", "2", "--pretokenized", str(out),
             "--tokenizer_name", str(minilm_path()), "--output_dir", str(tmp_path / "run"))
    assert (tmp_path / "run" / "export" / "model.safetensors").exists()
