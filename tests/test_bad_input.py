"""The catalogue of bad inputs across pretrain.py, run_glue.py, run_qa.py and init_hire.py: each gets one clear line
(what is wrong, what to do), status 2, no traceback, and leaves every file the user already had untouched.

The cases call each script's command-line entry point (`cli()`, what `python script.py` runs) in this process, with
its arguments in sys.argv: the same code path as a subprocess, without paying the imports 21 times."""

import importlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from helpers import save_tiny_spanbert

ENTRY_POINTS = {"pretrain.py": "encoder_zoo.training.pretrain", "run_glue.py": "encoder_zoo.glue.run_glue",
                "run_qa.py": "encoder_zoo.qa.run_qa", "init_hire.py": "encoder_zoo.glue.init_hire",
                "init_bertac.py": "encoder_zoo.glue.init_bertac", "run_open_qa.py": "encoder_zoo.qa.run_open_qa"}
TINY = ["--model", "spanbert", "--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "60",
        "--tokenizer_vocab_size", "500", "--validation_documents", "0", "--max_steps", "2"]


@dataclass
class Case:
    name: str
    script: str
    args: Callable[[Path], list[str]]  # workspace -> command-line arguments
    message: str
    setup: Callable[[Path], None] = field(default=lambda workspace: None)
    env: dict = field(default_factory=dict)  # test_bad_input_edges's cases: extra environment of the command
    created: str = "out"  # ... and what the refused command must not create (relative to the workspace)


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def previous_run(workspace: Path) -> None:
    """A complete earlier checkpoint and export in run/: what the user already has."""
    write(workspace / "run" / "checkpoint-2" / "trainer_state.json", json.dumps({"global_step": 2}))
    write(workspace / "run" / "checkpoint-2" / "model.safetensors", b"weights of step 2")
    write(workspace / "run" / "export" / "training_log.json", "[]")
    write(workspace / "run" / "export" / "README.md", "# the card of the first run")


def user_folder(workspace: Path) -> None:
    write(workspace / "mine" / "README.md", "# my notes")
    write(workspace / "mine" / "config.json", '{"mine": true}')


def foreign_tokenizer(workspace: Path) -> None:
    from encoder_zoo.training.data.resources import minilm_path

    tokenizer = workspace / "run" / "tokenizer"
    for file in Path(minilm_path()).glob("*"):
        if file.name.startswith(("tokenizer", "vocab", "special")):
            write(tokenizer / file.name, file.read_bytes())
    write(tokenizer / "training_inputs.json", json.dumps({"dataset": None, "vocab_size": 30522}))


def damaged_model(workspace: Path, cut: int | None = 100) -> None:
    folder = workspace / "model"
    save_tiny_spanbert(folder, "SpanBertForSequenceClassification")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:cut] if cut else b"")


def damaged_config(workspace: Path, folder: str = "model") -> None:
    save_tiny_spanbert(workspace / folder, "SpanBertForSequenceClassification")
    (workspace / folder / "model.safetensors").write_bytes(b"")  # damaged too: the config must be named first
    config = workspace / folder / "config.json"
    config.write_text(config.read_text()[:60])


def missing_code(workspace: Path) -> None:
    """A remote-code checkpoint without its modeling file. Its model type is one this process has no classes for, as
    in a fresh `python qa/run_qa.py` (here the SpanBERT classes are registered, and transformers would use them)."""
    save_tiny_spanbert(workspace / "model", "SpanBertForQuestionAnswering")
    (workspace / "model" / "modeling_spanbert.py").unlink()
    config = json.loads((workspace / "model" / "config.json").read_text())
    write(workspace / "model" / "config.json", json.dumps({**config, "model_type": "spanbert_elsewhere"}))
    write(workspace / "dev.json", '{"data": []}')


def foreign_code(workspace: Path) -> None:
    """A remote-code checkpoint of a model type this process has no classes for (see `missing_code`)."""
    save_tiny_spanbert(workspace / "model", "SpanBertForSequenceClassification")
    config = json.loads((workspace / "model" / "config.json").read_text())
    write(workspace / "model" / "config.json", json.dumps({**config, "model_type": "spanbert_elsewhere"}))


def squad_with_repeated_id(workspace: Path) -> None:
    data = {"data": [{"title": "t", "paragraphs": [{"context": "Rome is old. Paris is new.", "qas": [
        {"id": "q-1", "question": "What is old?", "answers": [{"text": "Rome", "answer_start": 0}]},
        {"id": "q-1", "question": "What is new?", "answers": [{"text": "Paris", "answer_start": 13}]}]}]}]}
    write(workspace / "dev.json", json.dumps(data))


OPEN_QA_REPEATED_ID = ('{"id": "q-1", "question": "Who came?", "answers": ["Ann"], "passages": ["Ann came."]}\n'
                       '{"id": "q-1", "question": "Who left?", "answers": ["Bob"], "passages": ["Bob left."]}\n')
# A dump whose second page is cut off mid-tag: well-formed up to there, as a download that broke off.
BROKEN_DUMP = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">\n<page><title>Rome</title><ns>0</ns>'
               '<revision><text>[[Rome]] is the capital of [[Italy]].</text></revision></page>\n'
               '<page><title>Paris</tit')
BERTAC_CNN = ["--model", "bertac_cnn", "--model_size", "tiny", "--max_steps", "2", "--max_documents", "12"]


def squad_with_string_offset(workspace: Path) -> None:
    data = {"data": [{"title": "t", "paragraphs": [{"context": "Rome is old.", "qas": [
        {"id": "q-7", "question": "What is old?", "answers": [{"text": "Rome", "answer_start": "0"}]}]}]}]}
    write(workspace / "dev.json", json.dumps(data))


def minilm(_):
    from encoder_zoo.training.data.resources import minilm_path

    return minilm_path()


CATALOGUE = [
    # pretrain.py: data
    Case("pretrain-empty-file", "pretrain.py",
         lambda w: [*TINY, "--dataset", str(w / "empty.txt"), "--output_dir", str(w / "out")],
         "empty.txt is empty", lambda w: write(w / "empty.txt", b"")),
    Case("pretrain-non-utf8-file", "pretrain.py",
         lambda w: [*TINY, "--dataset", str(w / "latin1.txt"), "--output_dir", str(w / "out")],
         "latin1.txt is not UTF-8 text (byte 0xe9 at offset 3)",
         lambda w: write(w / "latin1.txt", b"caf\xe9 au lait\n\nmore\n")),
    # pretrain.py: parse-time checks
    Case("pretrain-override-type", "pretrain.py",
         lambda w: [*TINY, "--config_overrides", "hidden_size=abc", "--output_dir", str(w / "out")],
         "Bad --config_overrides for SpanBertConfig: TypeError: Field 'hidden_size' expected int, got str"),
    Case("pretrain-fewer-positions", "pretrain.py",
         lambda w: [*TINY, "--max_seq_length", "256", "--config_overrides", "max_position_embeddings=128",
                    "--output_dir", str(w / "out")],
         "--max_seq_length 256 is longer than the model's 128 positions (max_position_embeddings, from "
         "--config_overrides): pass --max_seq_length 128 or less, or --config_overrides max_position_embeddings=256."),
    Case("pretrain-missing-tokenizer", "pretrain.py",
         lambda w: [*TINY, "--tokenizer_name", str(w / "no" / "tok"), "--output_dir", str(w / "out")],
         "tok does not exist: pass an existing path"),
    Case("pretrain-max-seq-length-0", "pretrain.py",
         lambda w: [*TINY, "--max_seq_length", "0", "--output_dir", str(w / "out")],
         "--max_seq_length 0 is too short"),
    Case("pretrain-output-dir-is-a-file", "pretrain.py", lambda w: [*TINY, "--output_dir", str(w / "notes.txt")],
         "notes.txt is a file, not a folder", lambda w: write(w / "notes.txt", "my notes")),
    Case("pretrain-output-dir-unwritable", "pretrain.py",
         lambda w: [*TINY, "--output_dir", "/sys/encoder-zoo-test" if os.geteuid() == 0 else str(w / "locked" / "run")],
         "is not writable", lambda w: (w / "locked").mkdir(mode=0o500)),
    Case("pretrain-max-steps-0", "pretrain.py", lambda w: [*TINY, "--max_steps", "0", "--output_dir", str(w / "out")],
         "--max_steps 0 trains nothing"),
    Case("pretrain-zero-epochs", "pretrain.py",
         lambda w: [*TINY, "--max_steps", "-5", "--num_train_epochs", "0", "--output_dir", str(w / "out")],
         "--num_train_epochs 0 without a positive --max_steps trains nothing"),
    # pretrain.py: speed options
    Case("pretrain-packing-cloze", "pretrain.py",
         lambda w: [*TINY[2:], "--model", "cloze", "--packing", "--output_dir", str(w / "out")],
         "--packing: TwoTowerCloze cannot read packed sequences"),
    Case("pretrain-packing-nsp", "pretrain.py",
         lambda w: [*TINY, "--model", "bert_2seq_nsp", "--packing", "--output_dir", str(w / "out")],
         "--packing: next sentence prediction"),
    Case("pretrain-flash-attention-missing", "pretrain.py",
         lambda w: [*TINY, "--attn_implementation", "flash_attention_2", "--output_dir", str(w / "out")],
         "--attn_implementation flash_attention_2: "),
    # pretrain.py: BERTAC's CNN data
    Case("pretrain-damaged-xml-dump", "pretrain.py",
         lambda w: [*BERTAC_CNN, "--dataset", str(w / "dump.xml"), "--output_dir", str(w / "out")],
         "dump.xml is damaged after 1 article page, not well-formed MediaWiki XML (ParseError: unclosed token",
         lambda w: write(w / "dump.xml", BROKEN_DUMP)),
    Case("pretrain-word-vectors-text-is-not-vectors", "pretrain.py",
         lambda w: [*BERTAC_CNN, "--word_vectors", str(w / "words.vec"), "--output_dir", str(w / "out")],
         "words.vec is not a word-vector file: line 1 is not a word followed by numbers",
         lambda w: write(w / "words.vec", "Rome is the capital of Italy.\n")),
    Case("pretrain-word-vectors-bin-is-not-fasttext", "pretrain.py",
         lambda w: [*BERTAC_CNN, "--word_vectors", str(w / "wiki.bin"), "--output_dir", str(w / "out")],
         "wiki.bin is not a fastText .bin model (no fastText header); pass a fastText .bin model, or a .vec",
         lambda w: write(w / "wiki.bin", b"PK\x03\x04 a zip file")),
    # pretrain.py: what the user already has
    Case("pretrain-previous-run", "pretrain.py", lambda w: [*TINY, "--output_dir", str(w / "run")],
         "holds a previous run (checkpoint-2, export). Pass --resume_from_checkpoint true", previous_run),
    Case("pretrain-export-dir-is-a-user-folder", "pretrain.py",
         lambda w: [*TINY, "--output_dir", str(w / "out"), "--export_dir", str(w / "mine")],
         "holds files that are not an encoder-zoo export (README.md, config.json)", user_folder),
    Case("pretrain-tokenizer-from-other-inputs", "pretrain.py", lambda w: [*TINY, "--output_dir", str(w / "run")],
         "was made from other inputs (", foreign_tokenizer),
    # run_glue.py
    Case("glue-preset-without-value", "run_glue.py",
         lambda w: ["--model_name_or_path", minilm(w), "--output_dir", str(w / "o"), "--preset"],
         "--preset needs a value: one of bertac, cloze, hire, spanbert, teams_small, teams_base."),
    Case("glue-missing-model", "run_glue.py",
         lambda w: ["--model_name_or_path", str(w / "no" / "model"), "--output_dir", str(w / "o")],
         "model: no such folder"),
    Case("glue-nan-regression-label", "run_glue.py",
         lambda w: ["--model_name_or_path", minilm(w), "--train_file", str(w / "train.csv"),
                    "--validation_file", str(w / "train.csv"), "--text_columns", "text", "--output_dir", str(w / "o")],
         "Label missing (or NaN) at row 1 of the train file",
         lambda w: write(w / "train.csv", "text,label\ngood,1.5\nbad,nan\nok,2.5\n")),
    Case("glue-inf-regression-label", "run_glue.py",
         lambda w: ["--model_name_or_path", minilm(w), "--train_file", str(w / "t.jsonl"),
                    "--validation_file", str(w / "t.jsonl"), "--text_columns", "text", "--output_dir", str(w / "o")],
         "Label inf at row 1",
         lambda w: write(w / "t.jsonl", '{"text": "a", "label": 1.5}\n{"text": "b", "label": Infinity}\n')),
    Case("glue-truncated-weights", "run_glue.py",
         lambda w: ["--model_name_or_path", str(w / "model"), "--trust_remote_code", "--output_dir", str(w / "o"),
                    "--max_train_samples", "8"],
         "model.safetensors is truncated or not a safetensors file", damaged_model),
    Case("glue-config-not-json", "run_glue.py",
         lambda w: ["--model_name_or_path", str(w / "model"), "--trust_remote_code", "--output_dir", str(w / "o"),
                    "--max_train_samples", "8"],
         "config.json is not valid JSON (Unterminated string", damaged_config),
    Case("glue-model-code-without-trust", "run_glue.py",
         lambda w: ["--model_name_or_path", str(w / "model"), "--output_dir", str(w / "o"), "--max_train_samples", "8"],
         "model runs model code saved with it (its .py files): pass --trust_remote_code to allow that", foreign_code),
    # run_qa.py
    Case("qa-missing-code-file", "run_qa.py",
         lambda w: ["--model_name_or_path", str(w / "model"), "--trust_remote_code",
                    "--validation_file", str(w / "dev.json"), "--output_dir", str(w / "o")],
         "modeling_spanbert.py does not exist, but config.json's auto_map names it", missing_code),
    Case("qa-repeated-question-id", "run_qa.py",
         lambda w: ["--model_name_or_path", minilm(w), "--validation_file", str(w / "dev.json"),
                    "--output_dir", str(w / "o")],
         "dev.json: record 'q-1' (row 1): its id is already that of row 0 (question ids must be unique",
         squad_with_repeated_id),
    Case("qa-string-answer-start", "run_qa.py",
         lambda w: ["--model_name_or_path", minilm(w), "--validation_file", str(w / "dev.json"),
                    "--output_dir", str(w / "o")],
         "record 'q-7' has answer_start '0' (str); it must be an integer character offset", squad_with_string_offset),
    Case("qa-empty-weights", "run_qa.py",
         lambda w: ["--model_name_or_path", str(w / "model"), "--trust_remote_code",
                    "--validation_file", str(w / "dev.json"), "--output_dir", str(w / "o")],
         "model.safetensors is empty", lambda w: (damaged_model(w, cut=None), write(w / "dev.json", '{"data": []}'))),
    # init_hire.py
    Case("hire-missing-backbone", "init_hire.py",
         lambda w: ["--backbone", str(w / "no" / "backbone"), "--output_dir", str(w / "h")],
         "backbone: no such folder"),
    Case("hire-unknown-backbone", "init_hire.py",
         lambda w: ["--backbone", str(w / "odd"), "--output_dir", str(w / "h")],
         "cannot carry HIRE (The checkpoint you are trying to load has model type `odd`",
         lambda w: write(w / "odd" / "config.json", '{"model_type": "odd"}')),
    Case("hire-truncated-backbone", "init_hire.py",
         lambda w: ["--backbone", str(w / "model"), "--output_dir", str(w / "h")],
         "model.safetensors is truncated or not a safetensors file", damaged_model),
    Case("hire-fusion-layers-out-of-range", "init_hire.py",
         lambda w: ["--fusion_layers", "5", "--output_dir", str(w / "h")],
         "init_hire.py: error: --fusion_layers: fusion_layers must be 0 to 3 (the paper's Table 6), got 5."),
    Case("hire-output-holds-files", "init_hire.py", lambda w: ["--output_dir", str(w / "mine")],
         "already holds files (README.md, config.json); pass --overwrite_output_dir", user_folder),
    # init_bertac.py
    Case("bertac-without-cnn", "init_bertac.py", lambda w: ["--output_dir", str(w / "b")], "--cnn is required"),
    Case("bertac-missing-cnn", "init_bertac.py",
         lambda w: ["--cnn", str(w / "no" / "cnn"), "--output_dir", str(w / "b")],
         "cnn: no such folder"),
    Case("bertac-cnn-is-not-a-cnn", "init_bertac.py", lambda w: ["--cnn", str(w / "odd"), "--output_dir", str(w / "b")],
         "is a 'odd' checkpoint, not a bertac_cnn export",
         lambda w: write(w / "odd" / "config.json", '{"model_type": "odd"}')),
    Case("bertac-truncated-backbone", "init_bertac.py",
         lambda w: ["--backbone", str(w / "model"), "--without_cnn_and_tier", "--output_dir", str(w / "b")],
         "model.safetensors is truncated or not a safetensors file", damaged_model),
    Case("bertac-cnn-config-not-json", "init_bertac.py",
         lambda w: ["--cnn", str(w / "cnn"), "--output_dir", str(w / "b")],
         "cnn/config.json is not valid JSON (Unterminated string", lambda w: damaged_config(w, "cnn")),
    Case("bertac-hire-as-backbone", "init_bertac.py",
         lambda w: ["--backbone", str(w / "hire"), "--without_cnn_and_tier", "--output_dir", str(w / "b")],
         "is a 'hire' checkpoint, not an encoder",
         lambda w: write(w / "hire" / "config.json", '{"model_type": "hire"}')),
    Case("bertac-output-holds-a-model", "init_bertac.py",
         lambda w: ["--cnn", str(w / "odd"), "--output_dir", str(w / "mine")],
         "already holds files (README.md, config.json); pass --overwrite_output_dir", user_folder),
    # run_open_qa.py
    Case("open-qa-record-without-answers", "run_open_qa.py",
         lambda w: ["--model_name_or_path", minilm(w), "--train_file", str(w / "q.jsonl"),
                    "--output_dir", str(w / "o")],
         "missing ['answers']", lambda w: write(w / "q.jsonl", '{"question": "Who?", "passages": ["Ann came."]}\n')),
    Case("open-qa-repeated-question-id", "run_open_qa.py",
         lambda w: ["--model_name_or_path", minilm(w), "--train_file", str(w / "q.jsonl"),
                    "--output_dir", str(w / "o")],
         "q.jsonl: record 'q-1' (row 1): its id is already that of row 0 (question ids must be unique",
         lambda w: write(w / "q.jsonl", OPEN_QA_REPEATED_ID)),
    Case("open-qa-missing-reader", "run_open_qa.py",
         lambda w: ["--model_name_or_path", minilm(w), "--reader_model", str(w / "no" / "reader"), "--validation_file",
                    str(w / "q.jsonl"), "--output_dir", str(w / "o")],
         "reader: no such folder",
         lambda w: write(w / "q.jsonl", '{"question": "Who?", "answers": ["Ann"], "passages": ["Ann came."]}\n')),
]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def assert_refused(case: Case, module: str, workspace: Path, monkeypatch, capsys) -> tuple[dict, dict]:
    """Run `case` through `module`'s `cli()`: status 2, a last line `<script>: error: ...` holding the case's
    message, every file the user had kept byte for byte. Returns the workspace before and after."""
    case.setup(workspace)
    before = snapshot(workspace)
    entry_point = importlib.import_module(module).cli
    monkeypatch.setattr(sys, "argv", [case.script, *case.args(workspace)])
    monkeypatch.delenv("PRETRAIN_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exit:  # any other exception (a traceback for the user) fails the test
        entry_point()
    stderr = capsys.readouterr().err
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    assert exit.value.code == 2, stderr[-3000:]
    assert last.startswith(f"{case.script}: error: ") and case.message in last, last
    after = snapshot(workspace)
    assert {name: after.get(name) for name in before} == before  # every file the user had, byte for byte
    return before, after


@pytest.mark.parametrize("case", CATALOGUE, ids=lambda case: case.name)
def test_bad_input_gets_one_clear_line_and_touches_nothing(tmp_path, monkeypatch, capsys, case):
    before, after = assert_refused(case, ENTRY_POINTS[case.script], tmp_path, monkeypatch, capsys)
    assert not [name for name in after if "checkpoint-" in name and name not in before]
