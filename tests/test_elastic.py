"""Elastic runs: the global batch is a run's invariant (recorded at its start, kept by a resume on any number of
processes), each update trains the same examples however the global batch is split, and `--loss_normalization update`
makes every split give the same update (1 x 8, 1 x 4 x 2, 2 x 4 and 2 x 2 x 2 agree to 1e-5 for spanbert, teams, cloze
and bert_2seq_nsp, dropout off). Under the recipe's own weighting, splits that keep the per-device batch agree bitwise,
resumes on another number of processes included (every process on one thread, so that 1- and 2-process runs round
alike).

TEAMS samples for real: its generator draws each target's replacement and candidates from the collator's draws of
that example (`sampler_uniforms`), so only dropout is turned off."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import REPO, call_cli, pretrain, pretrain_env, two_process_launcher
from safetensors.torch import load_file

from encoder_zoo.training.run import elastic

NO_DROPOUT = {"spanbert": "hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0",
              "bert_2seq_nsp": "hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0",
              "teams": "hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0",
              "cloze": "hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0,activation_dropout=0.0"}
FAMILIES = list(NO_DROPOUT)


def flags(model: str, out: Path, micro: int, accumulation: int | None, *extra: str) -> list[str]:
    return ["--model", model, "--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "60",
            "--tokenizer_vocab_size", "1000", "--validation_documents", "0", "--max_steps", "4", "--logging_steps", "1",
            "--save_steps", "2", "--dataloader_num_workers", "0", "--disable_tqdm", "true",
            "--config_overrides", NO_DROPOUT[model], "--per_device_train_batch_size", str(micro),
            *(["--gradient_accumulation_steps", str(accumulation)] if accumulation else []),
            "--output_dir", str(out), *extra]


def train(model: str, out: Path, micro: int, accumulation: int | None, *extra: str, processes: int = 1):
    """One run (OMP_NUM_THREADS=1 in every process)."""
    launcher = two_process_launcher() if processes == 2 else (sys.executable,)
    return pretrain(*flags(model, out, micro, accumulation, *extra), launcher=launcher,
                    env=pretrain_env(OMP_NUM_THREADS="1"))


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "export" / "model.safetensors")


def largest_difference(a: Path, b: Path) -> float:
    first, second = weights(a), weights(b)
    assert first.keys() == second.keys()
    return max((first[name].float() - second[name].float()).abs().max().item() for name in first)


def bitwise_equal(a: Path, b: Path) -> bool:
    first, second = weights(a), weights(b)
    return first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)


def resume_copy(run: Path, into: Path, step: int = 2) -> Path:
    """`run` as it stood at checkpoint-`step`: later checkpoints, its export and final state left out."""
    shutil.copytree(run, into, ignore=shutil.ignore_patterns(*(f"checkpoint-{s}" for s in range(step + 1, 10)),
                                                             "export"))
    (into / "trainer_state.json").unlink()
    return into


# ------------------------------------------------------------------------------------------- the global batch
def arguments(micro: int, processes: int, accumulation: int = 1, rank: int = 0) -> SimpleNamespace:
    return SimpleNamespace(per_device_train_batch_size=micro, world_size=processes,
                           gradient_accumulation_steps=accumulation, process_index=rank)


def checkpoint(run: Path, processes: int) -> str:
    folder = run / "checkpoint-2"
    folder.mkdir(parents=True)
    for rank in range(processes):
        (folder / (f"rng_state_{rank}.pth" if processes > 1 else "rng_state.pth")).write_bytes(b"")
    return str(folder)


def keep(run: Path, saved: str | None, args, *given: str, accumulates: bool = True, normalization="recipe"):
    return elastic.keep_global_batch(run, saved, args, loss_normalization=normalization, accumulates=accumulates,
                                     set_by_user=lambda flag: flag in given)


def test_a_resume_keeps_the_recorded_global_batch_on_any_number_of_processes(tmp_path, caplog):
    run = tmp_path / "run"
    keep(run, None, arguments(4, 2))  # a new run records 2 x 4
    record = json.loads((run / elastic.GLOBAL_BATCH_RECORD).read_text())
    assert record["global_batch"] == 8 and record["processes"] == 2
    saved = checkpoint(run, 2)

    args = arguments(4, 1)  # the same flags on one process: the accumulation is derived
    with caplog.at_level(logging.INFO):
        keep(run, saved, args)
    assert args.gradient_accumulation_steps == 2
    line = next(r.getMessage() for r in caplog.records if "Global batch 8" in r.getMessage())
    assert "(2 processes x 4 per device x 1 accumulation step): resuming as 1 process x 4 per device x 2" in line

    args = arguments(2, 2, accumulation=1)  # an --gradient_accumulation_steps that would change it is replaced
    keep(run, saved, args, "--gradient_accumulation_steps")
    assert args.gradient_accumulation_steps == 2

    caplog.clear()
    with caplog.at_level(logging.INFO):  # a larger micro-batch under a per-micro-batch recipe: said in one line
        keep(run, saved, arguments(8, 1))
    assert any("equal in expectation, not bitwise" in r.getMessage() for r in caplog.records)
    caplog.clear()
    updated = tmp_path / "update"
    keep(updated, None, arguments(4, 2), normalization="update")
    with caplog.at_level(logging.INFO):
        keep(updated, checkpoint(updated, 2), arguments(8, 1), normalization="update")
    assert not any("equal in expectation" in r.getMessage() for r in caplog.records)

    with pytest.raises(ValueError) as refused:  # 8 is no multiple of 3 x 1 or of 1 x 3
        keep(run, saved, arguments(3, 1))
    message = str(refused.value)
    assert "\n" not in message and "global batch of 8" in message
    assert "1 process x --per_device_train_batch_size 3" in message
    assert "--per_device_train_batch_size 8 (--gradient_accumulation_steps 1)" in message
    with pytest.raises(ValueError, match="on a number of processes that divides 8 \\(1, 2, 4, 8\\)"):
        keep(run, saved, arguments(1, 3))
    # A trainer without accumulation (the GAN) splits the global batch over the processes.
    args = arguments(4, 4)
    keep(run, saved, args, accumulates=False)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (2, 1)
    with pytest.raises(ValueError, match="does not split over 3 processes without accumulation"):
        keep(run, saved, arguments(4, 3), accumulates=False)


@pytest.mark.parametrize("edit, field, problem", [
    ({"global_batch": 8.5}, "global_batch", "is 8.5, not a positive whole number"),
    ({"global_batch": -8}, "global_batch", "is -8, not a positive whole number"),
    ({"processes": 0}, "processes", "is 0, not a positive whole number"),
    ({"per_device_train_batch_size": True}, "per_device_train_batch_size", "is True, not a positive whole number"),
    ({"gradient_accumulation_steps": None}, "gradient_accumulation_steps", "is missing"),
    ({"global_batch": 16}, "global_batch", "is 16, but its split, 2 processes x 4 per device x 1 accumulation step, "
                                           "is 8"),
    ({"loss_normalization": "token"}, "loss_normalization", "is 'token', not one of recipe, update"),
    ({"resumed_as": {"global_batch": 4}}, "resumed_as.per_device_train_batch_size", "is missing"),
])
def test_a_damaged_record_is_refused_in_one_line_and_left_as_it_is(tmp_path, edit, field, problem):
    """Every count of global_batch.json is a positive whole number, the global batch is their product, the
    normalisation a known one: a record edited otherwise is refused before the resume changes anything."""
    run = tmp_path / "run"
    keep(run, None, arguments(4, 2))
    saved = checkpoint(run, 2)
    path = run / elastic.GLOBAL_BATCH_RECORD
    record = json.loads(path.read_text())
    for key, value in edit.items():
        if value is None:
            record.pop(key)
        else:
            record[key] = value
    path.write_text(json.dumps(record))
    before = path.read_bytes()
    with pytest.raises(ValueError) as refused:
        keep(run, saved, arguments(4, 1))
    message = str(refused.value)
    assert message.startswith(f"{path}: {field} {problem}; the file records the run's global batch.")
    assert "\n" not in message
    assert path.read_bytes() == before


def test_the_record_must_agree_with_the_checkpoint_and_its_loss_normalization(tmp_path):
    """A checkpoint carries its own copy of the record: a run record edited to another global batch (8 -> 16, still a
    consistent split) is refused, naming the copy to restore; so is a switch of --loss_normalization; a refused
    resume writes nothing, and an accepted one writes its split only once it trains (`ResumedSplit`)."""
    run = tmp_path / "run"
    record = keep(run, None, arguments(4, 2))
    saved = Path(checkpoint(run, 2))
    elastic.write_batch_record(saved, record)  # what PretrainingTrainer saves with each checkpoint
    path = run / elastic.GLOBAL_BATCH_RECORD
    path.write_text(json.dumps(elastic.batch_record(arguments(8, 2), "recipe")))
    with pytest.raises(ValueError, match=r"global_batch is 16, but checkpoint-2 was trained with 8 \(.*\)\. Restore "):
        keep(run, str(saved), arguments(4, 1))
    elastic.write_batch_record(run, record)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"^--loss_normalization update: the run was trained with "
                                         r"--loss_normalization recipe \(.*global_batch.json\), .* Resume with "
                                         r"--loss_normalization recipe, or start a new run\.$"):
        keep(run, str(saved), arguments(4, 1), normalization="update")
    resumed = keep(run, str(saved), arguments(4, 1))
    assert path.read_bytes() == before and resumed["resumed_as"]["gradient_accumulation_steps"] == 2
    callback = elastic.ResumedSplit(run, resumed)
    callback.on_step_end(None, SimpleNamespace(is_world_process_zero=True), None)
    assert json.loads(path.read_text())["resumed_as"]["processes"] == 1
    # An older checkpoint without the copy: its processes x per-device batch (trainer_state.json) must divide it.
    older = Path(checkpoint(tmp_path / "older", 2))
    (older / "trainer_state.json").write_text(json.dumps({"train_batch_size": 3}))
    elastic.write_batch_record(older.parent, record)
    with pytest.raises(ValueError, match=r"global_batch is 8, which checkpoint-2's 2 processes x 3 per device"):
        keep(older.parent, str(older), arguments(4, 1))


def test_the_requeue_check_refuses_what_is_not_a_count_or_a_run_folder(tmp_path, capsys):
    assert elastic.main([str(tmp_path / "missing"), "1", "8"]) == 2
    assert "is not a folder: pass the run's OUTPUT_DIR" in capsys.readouterr().err
    for nodes, per_node, named in (("-1", "8", "node count (SLURM_NNODES) is '-1'"), ("0", "8", "is '0'"),
                                   ("abc", "8", "is 'abc'"), ("2", "0", "processes per node (GPUS_PER_NODE) is '0'")):
        assert elastic.main([str(tmp_path), nodes, per_node]) == 2
        err = capsys.readouterr().err
        assert err.startswith("pretrain.sbatch: ") and named in err and err.count("\n") == 1
    assert elastic.main([str(tmp_path), "2", "8"]) == 0


def test_a_requeue_onto_nodes_that_cannot_split_the_global_batch_names_the_ones_that_can(tmp_path):
    """pretrain.sbatch's check before any node starts: the node counts that divide the recorded global batch, or,
    where no count of nodes of that size can, the per-node setting to change; nothing for a run without the record."""
    assert elastic.node_count_refusal(tmp_path, 3, 1) is None  # no record: pretrain.py decides
    elastic.write_batch_record(tmp_path, elastic.batch_record(arguments(4, 2, accumulation=3), "recipe"))
    assert elastic.node_count_refusal(tmp_path, 4, 2) is None and elastic.node_count_refusal(tmp_path, 1, 8) is None
    assert elastic.node_count_refusal(tmp_path, 5, 2).endswith(
        "global batch of 24 (2 processes x 4 per device x 3 accumulation steps), which 5 nodes x 2 processes = 10 "
        "cannot split: requeue it with --nodes 1, 2, 3, 4, 6, 12.")
    assert elastic.node_count_refusal(tmp_path, 1, 5).endswith(
        "which 1 node x 5 processes = 5 cannot split: no number of nodes of 5 processes can: set GPUS_PER_NODE to a "
        "divisor of 24.")


def test_a_run_without_the_record_resumes_only_on_its_own_number_of_processes(tmp_path):
    run = tmp_path / "older"
    saved = checkpoint(run, 2)
    args = arguments(4, 2, accumulation=3)
    assert keep(run, saved, args) is None and args.gradient_accumulation_steps == 3  # as before
    with pytest.raises(ValueError) as refused:
        keep(run, saved, arguments(4, 1))
    assert "\n" not in str(refused.value)
    assert "recorded no global batch" in str(refused.value) and "resume it on 2 processes" in str(refused.value)


def test_ddp_searches_for_unused_parameters_only_where_a_recipe_has_them(tmp_path):
    from encoder_zoo.training import pretrain as script
    from encoder_zoo.training.recipes import get_recipe

    found = {}
    for model, overrides in (("spanbert", {}), ("teams", {}), ("cloze", {}), ("cloze", {"loss_type": "bilm"}),
                             ("bertac_cnn", {})):
        args = SimpleNamespace(loss_normalization="recipe", flags_given=())
        training_args = SimpleNamespace(**vars(arguments(4, 1)), ddp_find_unused_parameters=None)
        script.keep_global_batch(get_recipe(model), args, training_args, overrides, tmp_path / model, None)
        found[(model, overrides.get("loss_type"))] = training_args.ddp_find_unused_parameters
    assert found == {("spanbert", None): False, ("teams", None): False, ("cloze", None): False,
                     ("cloze", "bilm"): True, ("bertac_cnn", None): True}


@pytest.mark.parametrize("model, extra", [("bertac_cnn", []), ("cloze", ["--config_overrides", "loss_type=bilm"])])
def test_update_normalization_is_refused_where_no_target_count_exists(tmp_path, model, extra):
    result = call_cli("encoder_zoo.training.pretrain", "--model", model, "--loss_normalization", "update",
                      "--output_dir", str(tmp_path / "run"), *extra)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "--loss_normalization update" in last and "--loss_normalization recipe" in last
    assert not (tmp_path / "run" / "checkpoint-1").exists()


# ------------------------------------------------------------------------------------------- one process
@pytest.mark.slow
@pytest.mark.parametrize("model", FAMILIES)
def test_update_normalization_gives_one_update_for_1x8_and_1x4x2(tmp_path, model):
    train(model, tmp_path / "1x8", 8, 1, "--loss_normalization", "update")
    train(model, tmp_path / "1x4x2", 4, 2, "--loss_normalization", "update")
    assert largest_difference(tmp_path / "1x8", tmp_path / "1x4x2") < 1e-5


# ------------------------------------------------------------------------------------------- two processes
@pytest.mark.multiprocess
@pytest.mark.parametrize("model", FAMILIES)
def test_update_normalization_gives_one_update_for_every_split(tmp_path, model):
    """1 x 8 against 2 x 4 and 2 x 2 x 2 (1 x 4 x 2: the single-process test above)."""
    train(model, tmp_path / "1x8", 8, 1, "--loss_normalization", "update")
    for name, micro, accumulation in (("2x4", 4, 1), ("2x2x2", 2, 2)):
        train(model, tmp_path / name, micro, accumulation, "--loss_normalization", "update", processes=2)
        assert largest_difference(tmp_path / "1x8", tmp_path / name) < 1e-5, name


@pytest.mark.multiprocess
def test_resumes_on_another_number_of_processes_continue_the_run(tmp_path):
    """Under SpanBERT's own weighting: 2 x 4 and 1 x 4 x 2 are bitwise equal, and so is a 2 -> 1 resume with the same
    flags (the accumulation derived), and a 1 -> 2 resume of the 1 x 4 x 2 run with its own flags (its
    --gradient_accumulation_steps 2 replaced by 1). Under `update`, a resume with the micro-batch doubled ends
    equal to 1e-5."""
    two, one = tmp_path / "2x4", tmp_path / "1x4x2"
    train("spanbert", two, 4, None, processes=2)
    train("spanbert", one, 4, 2)
    assert bitwise_equal(two, one)

    resumed = train("spanbert", resume_copy(two, tmp_path / "2to1"), 4, None, "--resume_from_checkpoint", "true")
    assert bitwise_equal(two, tmp_path / "2to1")
    assert "resuming as 1 process x 4 per device x 2 accumulation steps" in resumed.stderr
    assert "do not match the ones in the `trainer_state.json`" not in resumed.stderr

    resumed = train("spanbert", resume_copy(one, tmp_path / "1to2"), 4, 2, "--resume_from_checkpoint", "true",
                    processes=2)
    assert bitwise_equal(one, tmp_path / "1to2")
    assert "(--gradient_accumulation_steps 2 replaced)" in resumed.stderr

    update = tmp_path / "update-1x4x2"
    train("spanbert", update, 4, 2, "--loss_normalization", "update")
    resumed = train("spanbert", resume_copy(update, tmp_path / "doubled"), 8, None, "--loss_normalization", "update",
                    "--resume_from_checkpoint", "true")
    assert "resuming as 1 process x 8 per device x 1 accumulation step" in resumed.stderr
    assert largest_difference(update, tmp_path / "doubled") < 1e-5
    doubled = train("spanbert", resume_copy(one, tmp_path / "doubled-recipe"), 8, None, "--resume_from_checkpoint",
                    "true")
    assert "equal in expectation, not bitwise" in doubled.stderr


# ------------------------------------------------------------------------------------------- streaming
def test_the_stream_is_global_and_resumes_on_another_split(tmp_path):
    """Every process reads the one global stream and keeps its micro-batches of it ((index // m) mod P): the examples
    of update k are the same for 1 x 8, 2 x 4 and 2 x 2 x 2, and a position saved by 2 processes after 3 updates
    resumes on 1 process (or on 2 with another per-device batch) with the next global example."""
    import itertools

    from transformers import AutoTokenizer

    from encoder_zoo.training.data.blocks import block_packer
    from encoder_zoo.training.data.corpus import stream_corpus
    from encoder_zoo.training.data.resources import minilm_path
    from encoder_zoo.training.data.streaming import StreamedExamples, StreamSettings, load_position

    packer = block_packer(AutoTokenizer.from_pretrained(minilm_path()), 64)
    documents = stream_corpus(max_documents=40)

    def stream(processes: int, micro: int, rank: int = 0, start=None) -> StreamedExamples:
        settings = StreamSettings(seed=3, window_documents=7, world_size=processes, micro_batch=micro)
        return StreamedExamples(documents, packer, text_column="text", settings=settings, rank=rank, start=start)

    def updates(streams: list[StreamedExamples], micro: int, accumulation: int, count: int) -> list[list[int]]:
        """The example indices of `count` updates, as Trainer draws them: `accumulation` micro-batches per process."""
        iterators = [iter(s) for s in streams]
        steps = []
        for _ in range(count):
            step = []
            for _ in range(accumulation):
                for examples in iterators:
                    step += [example["example_index"] for example in itertools.islice(examples, micro)]
            steps.append(sorted(step))
        return steps

    one = updates([stream(1, 8)], 8, 1, 5)
    assert one == [list(range(8 * k, 8 * k + 8)) for k in range(5)]
    two = [stream(2, 4, rank) for rank in (0, 1)]
    assert updates(two, 4, 1, 3) == one[:3]
    assert updates([stream(2, 2, rank) for rank in (0, 1)], 2, 2, 5) == one

    for rank, process in enumerate(two):  # saved after 3 updates of 2 x 4
        folder = tmp_path / "checkpoint-3"
        folder.mkdir(exist_ok=True)
        process.save(folder, consumed=3 * 8)
    for processes, micro, accumulation in ((1, 8, 1), (1, 4, 2), (2, 2, 2)):
        settings = StreamSettings(seed=3, window_documents=7, world_size=processes, micro_batch=micro)
        resumed = [stream(processes, micro, rank, start=load_position(folder, rank, settings))
                   for rank in range(processes)]
        assert updates(resumed, micro, accumulation, 2) == one[3:5], (processes, micro)


@pytest.mark.multiprocess
def test_a_streaming_run_resumes_on_another_number_of_processes(tmp_path):
    """--streaming, SpanBERT's weighting, one thread per process: 2 x 4 resumed at step 2 on 1 process with the same
    flags, and 1 x 4 x 2 resumed on 2 processes, end bitwise equal to the uninterrupted runs, which are equal too."""
    stream = ["--streaming", "true", "--shuffle_window_documents", "10", "--streaming_sample_documents", "100"]
    two, one = tmp_path / "2x4", tmp_path / "1x4x2"
    train("spanbert", two, 4, None, *stream, processes=2)
    train("spanbert", one, 4, 2, *stream)
    assert bitwise_equal(two, one)
    train("spanbert", resume_copy(two, tmp_path / "2to1"), 4, None, *stream, "--resume_from_checkpoint", "true")
    assert bitwise_equal(two, tmp_path / "2to1")
    train("spanbert", resume_copy(one, tmp_path / "1to2"), 4, 2, *stream, "--resume_from_checkpoint", "true",
          processes=2)
    assert bitwise_equal(one, tmp_path / "1to2")


@pytest.mark.multiprocess
def test_two_machine_ranks_on_localhost_train_the_same_run(tmp_path):
    """Two `accelerate launch` calls, machine ranks 0 and 1 of one process each on 127.0.0.1 (what a 2-node job runs):
    they train and export the run that one node of 2 processes trains, bitwise (one thread per process)."""
    import subprocess

    from helpers import ACCELERATE_LAUNCH, PRETRAIN, free_port

    single, nodes = tmp_path / "one-node", tmp_path / "two-nodes"
    train("spanbert", single, 4, None, processes=2)
    port = free_port()
    launches = [subprocess.Popen([*ACCELERATE_LAUNCH, "--multi_gpu", "--num_machines", "2", "--machine_rank", str(rank),
                                  "--num_processes", "2", "--main_process_ip", "127.0.0.1", "--main_process_port",
                                  str(port), PRETRAIN, *flags("spanbert", nodes, 4, None)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 env=pretrain_env(OMP_NUM_THREADS="1")) for rank in (0, 1)]
    errors = [launch.communicate(timeout=600)[1] for launch in launches]
    assert [launch.returncode for launch in launches] == [0, 0], errors[0][-3000:] + errors[1][-3000:]
    assert bitwise_equal(single, nodes)


def _job_step_processes(output_dir: Path) -> list[int]:
    """The processes of the run in `output_dir` that Slurm's --signal reaches: each node's `accelerate launch` and the
    pretrain.py processes it started (not the batch script, not srun)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        text = b" ".join(command).decode(errors="ignore")
        is_srun = any(part.endswith(b"srun") for part in command[:2])  # the stand-in, not a process of a step
        if entry.name.isdigit() and str(output_dir) in text and "pretrain.py" in text and not is_srun \
                and not text.startswith("bash"):
            found.append(int(entry.name))
    return found


@pytest.mark.multiprocess
def test_the_slurm_script_is_preempted_requeued_on_fewer_nodes_and_resumes_exactly(tmp_path):
    """training/slurm/pretrain.sbatch under a stand-in for srun/scontrol that runs each node on this machine: a
    2-node job (1 process each) gets SIGTERM after its first checkpoint in every process of its job steps, launchers
    and training processes alike, as Slurm's --signal sends it; each training process gets it twice (the launcher
    passes it on), finishes its step, saves and stops. Requeued on 1 node the run resumes (the accumulation derived
    from the recorded global batch) and ends bitwise equal to an uninterrupted run on 2 processes. A requeue onto 0
    nodes, or onto 3 (which cannot split a global batch of 8), is refused in one line before any node starts."""
    import signal
    import subprocess
    import time

    from helpers import free_port

    standin = os.path.join(REPO, "tests", "slurm_standin")
    script = os.path.join(REPO, "training", "slurm", "pretrain.sbatch")
    reference, out = tmp_path / "reference", tmp_path / "run"
    steps = ["--max_steps", "12"]
    train("spanbert", reference, 4, None, *steps, processes=2)

    def job(nodes: int) -> dict:
        path = os.pathsep.join([standin, os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        return {**pretrain_env(OMP_NUM_THREADS="1"), "PATH": path, "SRUN": os.path.join(standin, "srun"),
                "SLURM_NNODES": str(nodes), "SLURM_JOB_NODELIST": "node[1-2]", "GPUS_PER_NODE": "1",
                "CONFIG": os.path.join(REPO, "training", "accelerate_configs", "ddp.yaml"), "OUTPUT_DIR": str(out),
                "MODEL": "spanbert", "MODEL_SIZE": "tiny", "PORT": str(free_port())}

    args = [*flags("spanbert", out, 4, None), *steps]
    first = subprocess.Popen(["bash", script, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=job(2), cwd=REPO, start_new_session=True)
    deadline = time.time() + 600
    while not (out / "checkpoint-2" / "trainer_state.json").exists():
        assert first.poll() is None, first.stderr.read()[-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    step = _job_step_processes(out)
    assert len(step) == 4  # two launchers, two training processes
    for pid in step:  # Slurm's --signal=TERM reaches every process of the job's steps
        os.kill(pid, signal.SIGTERM)
    stderr = first.communicate(timeout=600)[1]
    assert first.returncode != 0
    saved = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert 2 < saved[-1] < 12 and not (out / "export").exists()
    # every process stops at that step; the main one says so, once
    assert stderr.count(f"stopped by SIGTERM at step {saved[-1]} after saving") == 1, stderr[-3000:]

    for nodes, reason in ((0, "no node to run on"), (3, "requeue it with --nodes 1, 2, 4, 8")):
        refused = subprocess.run(["bash", script, *args], capture_output=True, text=True, env=job(nodes), cwd=REPO)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert reason in refused.stderr

    requeued = subprocess.run(["bash", script, *args], capture_output=True, text=True, env=job(1), cwd=REPO,
                              timeout=600)
    assert requeued.returncode == 0, requeued.stderr[-4000:]
    assert "resuming as 1 process x 4 per device x 2 accumulation steps" in requeued.stderr
    assert bitwise_equal(reference, out)


def partitioned(processes: int, rank: int = 0, *, partitions: int = 8, total: int = 8, packers: int = 0,
                starts=None, documents=None, packer=None):
    from encoder_zoo.training.data.streaming import PARTITIONED, PartitionedExamples, StreamSettings

    settings = StreamSettings(seed=3, window_documents=7, world_size=processes, layout=PARTITIONED,
                              partitions=partitions, global_batch=total)
    return PartitionedExamples(documents or _documents(), packer or _packer(), text_column="text", settings=settings,
                               rank=rank, packers=packers, starts=starts)


def _documents():
    from encoder_zoo.training.data.corpus import stream_corpus

    return stream_corpus(max_documents=40)


def _packer():
    from transformers import AutoTokenizer

    from encoder_zoo.training.data.blocks import block_packer
    from encoder_zoo.training.data.resources import minilm_path

    return block_packer(AutoTokenizer.from_pretrained(minilm_path()), 64)


def drawn(streams, micro: int, accumulation: int, count: int) -> list[list[tuple]]:
    """`count` updates as Trainer draws them (each process `accumulation` micro-batches of `micro`): per update, the
    sorted (example index, tokens) pairs."""
    import itertools

    iterators = [iter(s) for s in streams]
    steps = []
    for _ in range(count):
        step = []
        for examples in iterators:
            step += [(e["example_index"], tuple(e["input_ids"].tolist()))
                     for e in itertools.islice(examples, micro * accumulation)]
        steps.append(sorted(step))
    return steps


def test_partitioned_stream_trains_the_same_updates_on_every_split_and_resumes_on_any(tmp_path):
    """8 partitions, global batch 8, 40 documents (12 updates cross the partitions' epochs): update k holds global
    examples [8k, 8k + 8) with the same tokens on 1 x 8, 2 x 4, 2 x 2 x 2 and 4 x 2, with 0, 1 or 2 packer processes;
    positions saved by 2 processes after 5 updates resume on 1 and on 4 processes with the next examples."""
    from encoder_zoo.training.data.streaming import (
        PARTITIONED,
        StreamSettings,
        load_partition_positions,
    )

    packer, documents = _packer(), _documents()

    def streams(processes, **kwargs):
        return [partitioned(processes, rank, documents=documents, packer=packer, **kwargs)
                for rank in range(processes)]

    one = drawn(streams(1), 8, 1, 12)
    assert [index for step in one for index, _ in step] == list(range(96))
    assert drawn(streams(2), 4, 1, 12) == one
    assert drawn(streams(2), 2, 2, 12) == one
    assert drawn(streams(4), 2, 1, 12) == one
    assert drawn(streams(1, packers=1), 8, 1, 12) == one
    assert drawn(streams(2, packers=2), 4, 1, 12) == one

    saving = streams(2)
    drawn(saving, 4, 1, 5)
    for stream in saving:
        stream.save(tmp_path, consumed=5 * 8)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"stream_state-partition{j}.json" for j in range(8)]
    for processes, micro, accumulation in ((1, 8, 1), (1, 4, 2), (4, 2, 1)):
        settings = StreamSettings(seed=3, window_documents=7, world_size=processes, layout=PARTITIONED, partitions=8,
                                  global_batch=8)
        resumed = [partitioned(processes, rank, documents=documents, packer=packer,
                               starts=load_partition_positions(tmp_path, list(range(rank * 8 // processes,
                                                                                    (rank + 1) * 8 // processes)),
                                                               settings))
                   for rank in range(processes)]
        assert drawn(resumed, micro, accumulation, 7) == one[5:], (processes, micro)


def test_each_of_two_processes_tokenizes_about_half_of_the_documents():
    """The counted target: for the same 12 updates, a process of 2 packs at most 0.55 of the documents that a single
    process packs (every document it reads it packs: no other process's documents pass through it)."""
    import itertools

    documents, packer = _documents(), _packer()
    packed = {}
    for processes in (1, 2):
        counted = []

        def counting(batch):
            counted.extend(batch["text"])
            return packer(batch)

        stream = partitioned(processes, 0, documents=documents, packer=counting, total=16)
        list(itertools.islice(iter(stream), 16 * 30 // processes))
        packed[processes] = len(counted)
    assert packed[2] <= 0.55 * packed[1], packed


def test_a_partition_count_the_run_cannot_use_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"cannot share: each process reads whole partitions. Run on 1, 2, 4, 8 "):
        partitioned(3, 0, partitions=8, total=24)
    with pytest.raises(ValueError, match=r"must divide the global batch of 8; pass one of 1, 2, 4, 8\."):
        partitioned(1, 0, partitions=3)


def test_default_partitions_follow_the_shards_and_the_global_batch():
    from encoder_zoo.training.data.streaming import default_partitions

    assert default_partitions(8, 16) == 8  # two whole shards per partition
    assert default_partitions(256, 16) == 16
    assert default_partitions(256, 1024) == 64
    assert default_partitions(256, 41) == 8  # 41 files: every 8th document of all shards
    assert default_partitions(6, 41) == 6
    assert default_partitions(1, 3) == 1


def test_a_partitioned_resume_on_a_changed_corpus_is_refused_in_one_line(tmp_path):
    """The position saves a digest of its window's documents: a resume that reads other documents there (the corpus
    was edited) stops before handing out an example, naming the partition and the way out."""
    import datasets

    from encoder_zoo.training.data.corpus import load_corpus
    from encoder_zoo.training.data.streaming import PARTITIONED, StreamSettings, load_partition_positions

    texts = load_corpus(max_documents=40)["text"]

    def corpus(edit: str = ""):
        return datasets.Dataset.from_dict({"text": [edit + text for text in texts]}).to_iterable_dataset(num_shards=8)

    packer = _packer()
    saving = partitioned(1, documents=corpus(), packer=packer)
    drawn([saving], 8, 1, 5)
    saving.save(tmp_path, consumed=40)
    settings = StreamSettings(seed=3, window_documents=7, world_size=1, layout=PARTITIONED, partitions=8,
                              global_batch=8)
    starts = load_partition_positions(tmp_path, list(range(8)), settings)
    assert all(position.window_digest for position in starts.values())
    same = partitioned(1, documents=corpus(), packer=packer, starts=starts)
    assert len(drawn([same], 8, 1, 1)[0]) == 8
    edited = partitioned(1, documents=corpus("Edited. "), packer=packer, starts=starts)
    with pytest.raises(ValueError, match=r"^Partition 0 of the stream reads other documents at its saved position "
                                         r"\(epoch \d+, window \d+\) than the run trained on: the corpus changed"):
        drawn([edited], 8, 1, 1)


def test_the_slurm_script_checks_its_settings_and_reads_the_output_dir_from_its_arguments(tmp_path):
    """Each bad setting is one line and exit 2 before anything starts; a requeue looks for checkpoints in the
    --output_dir of its command line (no OUTPUT_DIR in the environment): onto 3 nodes it is refused by the global
    batch check, which only runs where checkpoints were found."""
    import subprocess

    script = os.path.join(REPO, "training", "slurm", "pretrain.sbatch")
    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    elastic.write_batch_record(run, elastic.batch_record(arguments(4, 2), "recipe"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OUTPUT_DIR", "GPUS_PER_NODE"))}

    def sbatch(env: dict, *args: str, cwd: str = REPO):
        return subprocess.run(["bash", script, *args], capture_output=True, text=True, env={**base, **env}, cwd=cwd,
                              timeout=120)

    for env, cwd, named in (({"CONFIG": "nope.yaml"}, REPO, "CONFIG=nope.yaml does not exist"),
                            ({"GPUS_PER_NODE": "-2"}, REPO, "GPUS_PER_NODE=-2: pass the number of GPUs"),
                            ({"SLURM_NNODES": "abc"}, REPO, "SLURM_NNODES=abc: the job has no node to run on"),
                            ({}, str(tmp_path), "submit it from the repository root")):
        refused = sbatch(env, "--output_dir", str(run), cwd=cwd)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stderr.startswith("pretrain.sbatch: ") and named in refused.stderr
    requeued = sbatch({"SLURM_NNODES": "3", "GPUS_PER_NODE": "1", "SRUN": "false"}, "--output_dir", str(run))
    assert requeued.returncode == 2 and "requeue it with --nodes 1, 2, 4, 8" in requeued.stderr, requeued.stderr


@pytest.mark.slow
def test_the_slurm_script_runs_without_slurm_as_one_node(tmp_path):
    """SRUN= (the header's no-Slurm mode): one node of GPUS_PER_NODE processes on this machine, no SLURM_* set."""
    import subprocess

    env = {k: v for k, v in pretrain_env(OMP_NUM_THREADS="1").items() if not k.startswith("SLURM_")}
    env.update(SRUN="", GPUS_PER_NODE="1", PATH=os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]]))
    out = tmp_path / "run"
    result = subprocess.run(["bash", os.path.join(REPO, "training", "slurm", "pretrain.sbatch"),
                             *flags("spanbert", out, 4, None)], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "export" / "model.safetensors").is_file() and "Finished: 4 steps" in result.stdout


@pytest.mark.multiprocess
def test_the_held_out_evaluation_reads_the_same_on_any_number_of_processes(tmp_path):
    """2 x 4 and 1 x 4 x 2 with 20 held-out documents: every process evaluates every held-out block in one process's
    batches (accelerate's split padded its last batches with repeated blocks, counted twice: 743 masked targets on 2
    processes, 460 on 1), so the held-out figures are equal (Trainer's eval_loss to 1e-5)."""
    held_out = ["--validation_documents", "20", "--max_documents", "200"]
    train("spanbert", tmp_path / "2x4", 4, None, *held_out, processes=2)
    train("spanbert", tmp_path / "1x4x2", 4, 2, *held_out)
    assert bitwise_equal(tmp_path / "2x4", tmp_path / "1x4x2")

    def held_out_figures(out: Path) -> dict:
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        return next({k: v for k, v in entry.items() if k.startswith("eval_") and not k.endswith(
            ("runtime", "per_second"))} for entry in history if "eval_loss" in entry)

    two, one = held_out_figures(tmp_path / "2x4"), held_out_figures(tmp_path / "1x4x2")
    assert abs(two.pop("eval_loss") - one.pop("eval_loss")) < 1e-5
    assert two == one and one["eval_mlm_masked_targets"] > 100


@pytest.mark.multiprocess
def test_dropout_is_keyed_so_splits_end_bitwise_equal_with_dropout_on(tmp_path):
    """Dropout draws from a seed of (seed, update, the micro-batch's place in the global batch): 2 x 4 and 1 x 4 x 2
    with the models' own dropout end bitwise equal, in memory and with --streaming (it was 1.2e-3 apart after 3
    steps). The streaming 2-process run overwrites the in-memory one's folder: one process moves it aside."""
    dropout = ["--config_overrides", "hidden_dropout_prob=0.1,attention_probs_dropout_prob=0.1"]
    stream = ["--streaming", "true", "--shuffle_window_documents", "10", "--streaming_sample_documents", "100"]
    for name, extra in (("memory", []), ("stream", stream)):
        two, one = tmp_path / "2x4", tmp_path / f"1x4x2-{name}"
        overwrite = ["--overwrite_output_dir", "true"] if two.exists() else []
        train("spanbert", two, 4, None, *dropout, *extra, *overwrite, processes=2)
        train("spanbert", one, 4, 2, *dropout, *extra)
        assert bitwise_equal(two, one), name
    assert len(list(tmp_path.glob("2x4/replaced-*"))) == 1


def test_under_several_processes_only_the_main_one_logs_but_errors_and_lines_about_one_rank():
    """`training.run.entry.configure_logging`: rank 0 writes every line; another rank only errors and lines logged
    with `extra=EVERY_RANK`; a new run logs its global batch and split once, as a resumed one does."""
    from encoder_zoo.training.run.entry import EVERY_RANK, MainProcessOnly

    def written(rank: int) -> list[str]:
        filtered = MainProcessOnly(rank)
        lines = []
        for level, extra in ((logging.INFO, {}), (logging.WARNING, {}), (logging.ERROR, {}),
                             (logging.INFO, EVERY_RANK)):
            record = logging.LogRecord("pretrain", level, __file__, 1, f"{logging.getLevelName(level)} {extra}", None,
                                       None)
            record.__dict__.update(extra)
            if filtered.filter(record):
                lines.append(record.getMessage())
        return lines

    assert len(written(0)) == 4
    assert written(1) == ["ERROR {}", "INFO {'every_rank': True}"]


def test_a_new_run_logs_its_global_batch_and_split(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        keep(tmp_path / "run", None, arguments(4, 2, accumulation=3))
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("Global batch")] == [
        f"Global batch 24 (2 processes x 4 per device x 3 accumulation steps), recorded in "
        f"{elastic.GLOBAL_BATCH_RECORD}: a resume on any number of processes keeps it."]


@pytest.mark.multiprocess
def test_a_two_process_run_and_its_resume_log_each_line_once(tmp_path):
    """Under DDP the main process writes the log: a new run and its resume each name their global batch once, and
    the run's own lines (its size, its export) appear once, not once per process."""
    run = tmp_path / "2x4"
    new = train("spanbert", run, 4, None, processes=2)
    resumed = train("spanbert", resume_copy(run, tmp_path / "resumed"), 4, None, "--resume_from_checkpoint", "true",
                    processes=2)
    for result in (new, resumed):
        assert result.stderr.count("Global batch 8") == 1, result.stderr[-3000:]
        assert result.stderr.count("pretrain: spanbert tiny: ") == 1 and result.stderr.count("Exported to ") == 1
