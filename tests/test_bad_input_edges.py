"""The catalogue of bad inputs to the cluster features, one validation per kind of input: sharded (DCP)
checkpoints, a checkpoint of the other engine, `to_transformers.py`'s export, the SpanBERT authors' `model.pt`, a
tokenizer folder, a JSON record, a `tune.py --grid` entry. Each gets exit status 2, one line on stderr that starts
with the script's name and names the file or flag and the fix, no traceback, every file the user had kept byte for
byte and no output folder created.

The cheap cases call each script's `cli()` in this process (`helpers.call_cli`); the cases under `accelerate launch`
(an FSDP run that falls back from a damaged checkpoint, a checkpoint of the other engine refused by every process)
are in the multiprocess tier."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from helpers import call_cli, pretrain, save_tiny_spanbert
from test_bad_input import TINY, Case
from test_sharded import FSDP_ON_CPU, TEAMS, launch

MODULES = {"pretrain.py": "encoder_zoo.training.pretrain", "to_transformers.py": "encoder_zoo.training.to_transformers",
           "tune.py": "encoder_zoo.repro.tune", "run_glue.py": "encoder_zoo.glue.run_glue"}


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


# --- sharded (DCP) checkpoints, written by torch.distributed.checkpoint as FSDP2's SHARDED_STATE_DICT saves are


def dcp_checkpoint(folder: Path, step: int = 2) -> Path:
    """checkpoint-`step` as an FSDP2 run saves it: trainer_state.json, the model and optimizer as DCP folders (one
    process's save, torch.distributed.checkpoint's own files), the rank's RNG state."""
    import torch.distributed.checkpoint as dcp

    checkpoint = folder / f"checkpoint-{step}"
    torch.manual_seed(step)
    model = torch.nn.Linear(8, 4)
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(checkpoint / "pytorch_model_fsdp_0"), no_dist=True)
    dcp.save({"optimizer": {"exp_avg": torch.randn(4, 8)}}, checkpoint_id=str(checkpoint / "optimizer_0"),
             no_dist=True)
    write(checkpoint / "trainer_state.json", json.dumps({"global_step": step, "log_history": []}))
    write(checkpoint / "rng_state_0.pth", b"rng")
    return checkpoint


def damage(how: str) -> Callable[[Path], None]:
    def setup(workspace: Path) -> None:
        shard = dcp_checkpoint(workspace / "run") / "pytorch_model_fsdp_0"
        data = shard / "__0_0.distcp"
        if how == "truncated":
            data.write_bytes(data.read_bytes()[:100])
        elif how == "missing":
            data.unlink()
        elif how == "no-metadata":
            (shard / ".metadata").unlink()
        elif how == "damaged-metadata":
            (shard / ".metadata").write_bytes(b"\x80\x04 not a pickle")
    return setup


def ddp_checkpoint(workspace: Path) -> None:
    from safetensors.torch import save_file

    write(workspace / "run" / "checkpoint-2" / "trainer_state.json", json.dumps({"global_step": 2}))
    save_file({"weight": torch.ones(4, 8)}, workspace / "run" / "checkpoint-2" / "model.safetensors")


def truncated_ddp_checkpoint(workspace: Path) -> None:
    ddp_checkpoint(workspace)
    weights = workspace / "run" / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-20])


def resume(workspace: Path) -> list[str]:
    return [*TINY, "--output_dir", str(workspace / "run"), "--resume_from_checkpoint",
            str(workspace / "run" / "checkpoint-2")]


# --- to_transformers.py's export


def teams_export(workspace: Path) -> Path:
    from transformers import AutoTokenizer

    from encoder_zoo.training.data.resources import minilm_path
    from encoder_zoo.training.recipes import pretraining_export

    torch.manual_seed(0)
    return pretraining_export("teams", embedding_size=16)(workspace / "export",
                                                         AutoTokenizer.from_pretrained(minilm_path())).folder


def damaged_export(how: str) -> Callable[[Path], None]:
    def setup(workspace: Path) -> None:
        export = teams_export(workspace)
        weights, config = export / "model.safetensors", export / "config.json"
        if how == "truncated":
            weights.write_bytes(weights.read_bytes()[:100])
        elif how == "empty":
            weights.write_bytes(b"")
        elif how == "config":
            config.write_text(config.read_text()[:60])
        elif how == "no-tokenizer":
            for file in export.glob("tokenizer*"):
                file.unlink()
        elif how == "no-generator":
            from safetensors.torch import load_file, save_file

            save_file({k: v for k, v in load_file(weights).items() if not k.startswith("generator.")}, weights,
                      metadata={"format": "pt"})
    return setup


def to_transformers(workspace: Path) -> list[str]:
    return [str(workspace / "export"), str(workspace / "out")]


# --- tokenizers and records


def special_only_tokenizer(workspace: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    backend = Tokenizer(models.WordLevel({token: i for i, token in enumerate(special)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]").save_pretrained(workspace / "tok")


def damaged_tokenizer_record(workspace: Path) -> None:
    """A run folder holding only its tokenizer, whose record of its inputs was cut off."""
    special_only_tokenizer(workspace)
    shutil.copytree(workspace / "tok", workspace / "run" / "tokenizer")
    write(workspace / "run" / "tokenizer" / "training_inputs.json", '{"vocab_size": 5')


CATALOGUE = [
    # DCP checkpoints: checked whole before a resume, on every process alike
    Case("dcp-truncated-distcp", "pretrain.py", resume,
         "cannot be resumed (its sharded pytorch_model_fsdp_0/ has __0_0.distcp truncated (100 of",
         damage("truncated"), created="run/checkpoint-3"),
    Case("dcp-missing-distcp", "pretrain.py", resume,
         "cannot be resumed (its sharded pytorch_model_fsdp_0/ lacks __0_0.distcp, which its .metadata lists)",
         damage("missing"), created="run/checkpoint-3"),
    Case("dcp-without-metadata", "pretrain.py", resume,
         "cannot be resumed (its sharded pytorch_model_fsdp_0/ has no .metadata", damage("no-metadata"),
         created="run/checkpoint-3"),
    Case("dcp-damaged-metadata", "pretrain.py", resume,
         "cannot be resumed (its sharded pytorch_model_fsdp_0/ has a damaged .metadata", damage("damaged-metadata"),
         created="run/checkpoint-3"),
    # a checkpoint of the other engine
    Case("ddp-checkpoint-under-fsdp", "pretrain.py", resume,
         "holds a DDP (unsharded) checkpoint, which an FSDP run cannot load; resume it with the engine that saved it",
         ddp_checkpoint, env={"ACCELERATE_USE_FSDP": "true"}, created="run/checkpoint-3"),
    Case("fsdp-checkpoint-under-ddp", "pretrain.py", resume,
         "holds an FSDP checkpoint, which only an FSDP run can load", lambda w: dcp_checkpoint(w / "run"),
         created="run/checkpoint-3"),
    # a plain checkpoint whose config.json or weights were damaged since (Trainer would read them on resuming)
    Case("checkpoint-config-not-json", "pretrain.py", resume,
         "cannot be resumed (its config.json is damaged (Expecting", lambda w: (
             ddp_checkpoint(w), write(w / "run" / "checkpoint-2" / "config.json", '{"model_type": ')),
         created="run/checkpoint-3"),
    Case("checkpoint-truncated-weights", "pretrain.py", resume,
         "cannot be resumed (its model.safetensors is truncated or not a safetensors file", truncated_ddp_checkpoint,
         created="run/checkpoint-3"),
    # to_transformers.py
    Case("export-truncated-weights", "to_transformers.py", to_transformers,
         "model.safetensors is truncated or not a safetensors file", damaged_export("truncated")),
    Case("export-empty-weights", "to_transformers.py", to_transformers, "model.safetensors is empty",
         damaged_export("empty")),
    Case("export-config-not-json", "to_transformers.py", to_transformers,
         "export/config.json is not valid JSON (Unterminated string", damaged_export("config")),
    Case("export-without-tokenizer", "to_transformers.py", to_transformers,
         "export holds no tokenizer files (tokenizer.json, tokenizer_config.json, ...); copy the export again",
         damaged_export("no-tokenizer")),
    Case("teams-export-without-generator", "to_transformers.py", to_transformers,
         "it holds no generator (no generator.* tensors beside the discriminator's), which every TEAMS/ELECTRA "
         "pretraining export has; convert the complete export, or pass --without_generator", damaged_export(
             "no-generator")),
    # the SpanBERT authors' model.pt
    Case("fairseq-empty-model-pt", "pretrain.py",
         lambda w: [*TINY, "--init_from", str(w / "model.pt"), "--output_dir", str(w / "out")],
         "model.pt is empty (0 bytes): a copy or download that did not finish", lambda w: write(w / "model.pt", b"")),
    Case("fairseq-junk-model-pt", "pretrain.py",
         lambda w: [*TINY, "--init_from", str(w / "model.pt"), "--output_dir", str(w / "out")],
         "model.pt is truncated or not a PyTorch file (", lambda w: write(w / "model.pt", bytes(range(7, 67)))),
    # tokenizers
    Case("tokenizer-folder-without-files", "pretrain.py",
         lambda w: [*TINY, "--tokenizer_name", str(w / "tok"), "--output_dir", str(w / "out")],
         "tok holds no tokenizer files (tokenizer.json, tokenizer_config.json, vocab.txt, ...); pass the folder",
         lambda w: write(w / "tok" / "config.json", "{}")),
    Case("tokenizer-of-special-tokens-only", "pretrain.py",
         lambda w: [*TINY, "--tokenizer_name", str(w / "tok"), "--output_dir", str(w / "out")],
         "its 5 tokens are all special ([UNK], [SEP], [PAD], [CLS], [MASK]), so it reads any text as the unknown "
         "token; pass a tokenizer trained on text", special_only_tokenizer),
    Case("model-folder-without-tokenizer-files", "run_glue.py",
         lambda w: ["--model_name_or_path", str(w / "model"), "--trust_remote_code", "--output_dir",
                    str(w / "out" / "glue"), "--max_train_samples", "8"],
         "model holds no tokenizer files (tokenizer.json, tokenizer_config.json, vocab.txt, ...); save the model's "
         "tokenizer into it", lambda w: (save_tiny_spanbert(w / "model", "SpanBertForSequenceClassification"),
                                         [f.unlink() for f in (w / "model").iterdir()
                                          if f.name.startswith(("tokenizer", "vocab", "special"))]),
         created="out/glue/glue_results.json"),
    # JSON records
    Case("init-from-config-not-json", "pretrain.py",
         lambda w: [*TINY, "--init_from", str(w / "model"), "--output_dir", str(w / "out")],
         "model/config.json is not valid JSON (Unterminated string",
         lambda w: (save_tiny_spanbert(w / "model", "SpanBertForPreTraining"),
                    write(w / "model" / "config.json", (w / "model" / "config.json").read_text()[:60]))),
    Case("tokenizer-record-not-json", "pretrain.py", lambda w: [*TINY, "--output_dir", str(w / "run")],
         "run/tokenizer/training_inputs.json is not valid JSON (Expecting", damaged_tokenizer_record,
         created="run/checkpoint-2"),
    # tune.py
    Case("tune-grid-entry-with-a-minus", "tune.py",
         lambda w: ["adapt", "--grid", "140:1e-4", "-5:1e-4", "--output", str(w / "out" / "t.json")],
         "--grid entry '-5:1e-4': expected STEPS:LEARNING_RATE[:TEXT]"),
]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root`, but for a folder lock that this process would remove at its end (a fine-tuning script
    holds its --output_dir's lock until then; a real `python run_glue.py` leaves none)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(".encoder-zoo.lock")}


@pytest.mark.parametrize("case", CATALOGUE, ids=lambda case: case.name)
def test_each_kind_of_bad_input_gets_one_line_and_touches_nothing(tmp_path, monkeypatch, case):
    case.setup(tmp_path)
    before = snapshot(tmp_path)
    monkeypatch.delenv("PRETRAIN_TRACEBACK", raising=False)
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    result = call_cli(MODULES[case.script], *case.args(tmp_path))
    ours = [line for line in result.stderr.splitlines() if line.startswith(f"{case.script}")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert len(ours) == 1 and ours[0] == result.stderr.strip().splitlines()[-1], result.stderr[-3000:]
    assert ours[0].startswith(f"{case.script}") and case.message in ours[0], ours[0]
    assert snapshot(tmp_path) == before  # nothing written, moved or damaged
    assert not (tmp_path / case.created).exists()


def test_the_dcp_check_passes_a_whole_save_and_names_what_a_damaged_one_lacks(tmp_path):
    from encoder_zoo.training.run.trainer import checkpoint_problem, dcp_problem

    checkpoint = dcp_checkpoint(tmp_path)
    assert checkpoint_problem(checkpoint) is None
    assert dcp_problem(checkpoint / "optimizer_0") is None
    data = checkpoint / "optimizer_0" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:-1])  # one byte short
    size = data.stat().st_size
    assert checkpoint_problem(checkpoint) == (f"its sharded optimizer_0/ has __0_0.distcp truncated ({size} of "
                                              f"{size + 1} bytes)")


def test_a_damaged_newest_sharded_checkpoint_is_set_aside_and_the_run_falls_back(tmp_path, caplog, monkeypatch):
    """`--resume_from_checkpoint true` with the newest checkpoint's shard cut short: one warning names it and why, it
    is renamed incomplete-checkpoint-4 (nothing deleted), and the run resumes from checkpoint-2."""
    from encoder_zoo.training.run.folders import prepare_output_dir

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what an FSDP accelerate config sets
    run = tmp_path / "run"
    dcp_checkpoint(run, 2)
    shard = dcp_checkpoint(run, 4) / "pytorch_model_fsdp_0" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:50])
    with caplog.at_level(logging.WARNING, logger="pretrain"):
        checkpoint = prepare_output_dir(run, run / "export", "true", False, {})
    assert checkpoint == str(run / "checkpoint-2")
    assert (run / "incomplete-checkpoint-4" / "pytorch_model_fsdp_0" / "__0_0.distcp").is_file()
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "checkpoint-4 (its sharded pytorch_model_fsdp_0/ has __0_0.distcp truncated (50 " in (
        warnings[0]) and "resuming from an earlier complete checkpoint" in warnings[0]


def test_a_teams_export_without_its_generator_converts_with_the_flag_and_the_card_says_so(tmp_path):
    damaged_export("no-generator")(tmp_path)
    result = call_cli(MODULES["to_transformers.py"], *to_transformers(tmp_path), "--without_generator")
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (tmp_path / "out" / "generator").exists()
    assert "missing from the export itself (converted with --without_generator)" in (
        tmp_path / "out" / "README.md").read_text()


def test_overwrite_keeps_the_old_copy_whole_until_the_new_one_is_in_place(tmp_path, monkeypatch):
    """`--overwrite` renames the old copy aside, renames the new one in, then deletes the old: killed between the two
    renames, the old copy is whole (at OUTPUT.replaced-<time>); not killed, only the new copy is left."""
    from encoder_zoo.training.run import standard_copy

    teams_export(tmp_path)
    assert call_cli(MODULES["to_transformers.py"], *to_transformers(tmp_path)).returncode == 0
    old = snapshot(tmp_path / "out")
    rename = Path.rename

    def killed_after_moving_aside(self, target):
        moved = rename(self, target)
        if ".replaced-" in str(target):
            raise KeyboardInterrupt
        return moved

    monkeypatch.setattr(Path, "rename", killed_after_moving_aside)
    with pytest.raises(KeyboardInterrupt):
        standard_copy.convert(tmp_path / "export", tmp_path / "out", overwrite=True)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("out.replaced-")]
    assert len(aside) == 1 and snapshot(aside[0]) == old
    monkeypatch.setattr(Path, "rename", rename)
    shutil.rmtree(aside[0])
    assert call_cli(MODULES["to_transformers.py"], *to_transformers(tmp_path)).returncode == 0  # OUTPUT was free
    assert call_cli(MODULES["to_transformers.py"], *to_transformers(tmp_path), "--overwrite").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "out"]


def test_under_torchrun_the_refusal_is_the_failure_summarys_traceback(tmp_path, monkeypatch):
    """A process torchrun started (`accelerate launch`) leaves its one line in its TORCHELASTIC_ERROR_FILE: torchrun's
    own summary (read here with torch's reader) then shows it for that process instead of "To enable traceback"."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    write(tmp_path / "model.pt", b"")
    result = call_cli(MODULES["pretrain.py"], *TINY, "--init_from", str(tmp_path / "model.pt"), "--output_dir",
                      str(tmp_path / "out"))
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and line.startswith("pretrain.py: error: --init_from")
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file=str(error_file))
    summary = ChildFailedError("training/pretrain.py", {0: failure}).format_msg()
    assert f"traceback : {line}" in summary and "To enable traceback" not in summary


# --- under accelerate launch (multiprocess tier)

def fsdp_launch(processes: int = 2):
    return launch("fsdp_teams.yaml", FSDP_ON_CPU, processes=processes)


@pytest.mark.multiprocess
def test_fsdp_resume_falls_back_from_a_damaged_checkpoint_and_refuses_one_named(tmp_path):
    """A 2-process FSDP2 run's checkpoint-4 with one rank's shard cut short: `--resume_from_checkpoint true` names it
    in one warning, resumes from checkpoint-2 and ends with the uninterrupted run's export, bitwise; the damaged
    checkpoint named explicitly, and a DDP checkpoint under FSDP, are refused by both processes in the same one line
    before any process loads anything (accelerate's launcher then exits 1, see docs/reliability.md)."""
    from safetensors.torch import load_file

    reference = tmp_path / "reference"
    pretrain(*TEAMS, "--output_dir", str(reference), launcher=fsdp_launch())
    damaged = tmp_path / "damaged"
    shutil.copytree(reference, damaged, ignore=shutil.ignore_patterns("export"))
    shard = damaged / "checkpoint-4" / "pytorch_model_fsdp_0" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])

    named = pretrain(*TEAMS, "--output_dir", str(damaged), "--resume_from_checkpoint", str(damaged / "checkpoint-4"),
                     launcher=fsdp_launch(), check=False)
    ours = [line for line in named.stderr.splitlines() if line.startswith("pretrain.py: error:")]
    assert named.returncode != 0 and len(ours) == 2 and ours[0] == ours[1], named.stderr[-3000:]
    assert "its sharded pytorch_model_fsdp_0/ has __1_0.distcp truncated" in ours[0]
    assert f"traceback : {ours[0]}" in named.stderr  # torchrun's summary names it (its root cause), exit status 1
    assert "Traceback" not in "\n".join(line for line in named.stderr.splitlines() if "encoder_zoo" in line)
    assert (damaged / "checkpoint-4").is_dir()  # refused: left where it was

    result = pretrain(*TEAMS, "--output_dir", str(damaged), "--resume_from_checkpoint", "true",
                      launcher=fsdp_launch())
    assert "(its sharded pytorch_model_fsdp_0/ has __1_0.distcp truncated" in result.stderr
    assert (damaged / "incomplete-checkpoint-4").is_dir()
    expected, actual = (load_file(reference / "export" / "model.safetensors"),
                        load_file(damaged / "export" / "model.safetensors"))
    assert all(torch.equal(expected[name], actual[name]) for name in expected)

    ddp_checkpoint(tmp_path)  # tmp_path/run/checkpoint-2: model.safetensors
    refused = pretrain(*TEAMS, "--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", "true",
                       launcher=fsdp_launch(), check=False)
    ours = [line for line in refused.stderr.splitlines() if line.startswith("pretrain.py: error:")]
    assert refused.returncode != 0 and len(ours) == 2 and ours[0] == ours[1], refused.stderr[-3000:]
    assert "holds a DDP (unsharded) checkpoint, which an FSDP run cannot load" in ours[0]
