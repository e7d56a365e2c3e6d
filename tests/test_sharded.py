"""Sharded runs on 2 CPU processes: the shipped accelerate configs, FSDP2 (the zoo's plan) against DDP, a resumed
FSDP run, TEAMS's shared layers under FSDP, and the export gathered from the full weights.

accelerate 1.15 enables FSDP on accelerators only; `tests/fsdp_on_cpu.py` lets its FSDP code path run on CPU
processes (gloo), which torch's FSDP2 supports (see that file)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import ACCELERATE_LAUNCH, REPO, free_port, pretrain, pretrain_env, run_isolated
from safetensors.torch import load_file

pytestmark = pytest.mark.multiprocess

CONFIGS = os.path.join(REPO, "training", "accelerate_configs")
FSDP_ON_CPU = os.path.join(REPO, "tests", "fsdp_on_cpu.py")
TEAMS = ["--model", "teams", "--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "100",
         "--tokenizer_vocab_size", "1000", "--per_device_train_batch_size", "4", "--validation_documents", "4",
         "--max_steps", "4", "--save_steps", "2", "--logging_steps", "1", "--dataloader_num_workers", "0",
         # Without dropout: an FSDP unit runs its whole layer where DDP runs the last read layer's feed-forward at the
         # read positions only, so the two draw different dropout masks (same distribution, another stream).
         "--config_overrides", "hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0"]


def launch(config: str, *script, processes: int = 2):
    return (*ACCELERATE_LAUNCH, "--config_file", os.path.join(CONFIGS, config), "--num_processes", str(processes),
            "--main_process_port", str(free_port()), *script)


def step_losses(out, step=4):
    history = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """TEAMS tiny, 4 steps on 2 processes: under FSDP2 (sharded checkpoints at steps 2 and 4) and under DDP."""
    root = tmp_path_factory.mktemp("sharded")
    pretrain(*TEAMS, "--output_dir", str(root / "fsdp"), launcher=launch("fsdp_teams.yaml", FSDP_ON_CPU))
    pretrain(*TEAMS, "--output_dir", str(root / "ddp"), launcher=launch("ddp.yaml"))
    return root


def test_fsdp_trains_as_ddp_does_and_checkpoints_shards(runs):
    fsdp, ddp = runs / "fsdp", runs / "ddp"
    assert {p.name for p in (fsdp / "checkpoint-4").iterdir()} >= {"pytorch_model_fsdp_0", "optimizer_0",
                                                                   "rng_state_1.pth"}
    assert not (fsdp / "checkpoint-4" / "model.safetensors").exists()  # sharded, not gathered, at every save
    expected, actual = step_losses(ddp), step_losses(fsdp)
    assert sorted(actual) == [1, 2, 3, 4]
    for step in expected:  # reduce-scatter instead of all-reduce: the same sums in another order
        assert actual[step] == pytest.approx(expected[step], rel=1e-6)
    sharded, replicated = (load_file(fsdp / "export" / "model.safetensors"),
                           load_file(ddp / "export" / "model.safetensors"))
    assert sharded.keys() == replicated.keys()
    for name in sharded:
        torch.testing.assert_close(sharded[name], replicated[name], rtol=0, atol=1e-6)


def test_fsdp_run_resumes_bitwise_from_its_sharded_checkpoint(runs, tmp_path):
    resumed = tmp_path / "fsdp"
    shutil.copytree(runs / "fsdp", resumed, ignore=shutil.ignore_patterns("checkpoint-4", "export"))
    pretrain(*TEAMS, "--output_dir", str(resumed), "--resume_from_checkpoint", "true",
             launcher=launch("fsdp_teams.yaml", FSDP_ON_CPU))
    assert step_losses(resumed) == step_losses(runs / "fsdp")
    reference, actual = (load_file(runs / "fsdp" / "export" / "model.safetensors"),
                         load_file(resumed / "export" / "model.safetensors"))
    assert all(torch.equal(reference[name], actual[name]) for name in reference)


def test_fsdp_export_holds_the_full_model_and_loads_in_a_fresh_process(runs):
    """Written once by the main process from the gathered weights: every parameter at full size, TEAMS's shared
    layers once (the generator borrows the discriminator's bottom layers: no generator copy of them)."""
    from transformers import AutoConfig, AutoModelForPreTraining

    from encoder_zoo import models

    export = runs / "fsdp" / "export"
    config = AutoConfig.from_pretrained(export)
    weights = load_file(export / "model.safetensors")
    own = {key.split(".")[2] for key in weights if key.startswith("generator.layer.")}
    assert config.num_shared_generator_layers > 0
    assert len(own) == config.generator_num_hidden_layers - config.num_shared_generator_layers
    unsharded = AutoModelForPreTraining.from_config(config)
    expected = sum(p.numel() for p in unsharded.parameters())
    result = json.loads(run_isolated(f"""
        import json
        from transformers import AutoModelForPreTraining
        model = AutoModelForPreTraining.from_pretrained({str(export)!r}, trust_remote_code=True)
        shared = all(a is b for a, b in zip(model.generator_layers(),
                                            model.teams.layer[: model.config.num_shared_generator_layers]))
        print(json.dumps({{"parameters": sum(p.numel() for p in model.parameters()), "shared": shared}}))
    """).strip().splitlines()[-1])
    assert result == {"parameters": expected, "shared": True}
    assert models  # the repository's classes registered the Auto mapping used above


SHARED_LAYERS_UNDER_FSDP = """
import json, sys, torch, torch.distributed as dist
from types import SimpleNamespace
from accelerate.utils import FullyShardedDataParallelPlugin
from torch.distributed.tensor import DTensor
from encoder_zoo import models
from encoder_zoo.training.recipes import get_recipe
from encoder_zoo.training.run.sharding import shard_model

dist.init_process_group("gloo")
rank = dist.get_rank()
recipe = get_recipe("teams")
config = models.get_class("teams", "AutoConfig")(**recipe.sizes["tiny"], **recipe.config_overrides, vocab_size=500,
                                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
def build():
    torch.manual_seed(0)
    return models.get_class("teams", "AutoModelForPreTraining")(config)
reference, model = build(), build()
plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                        transformer_cls_names_to_wrap=["ElectraLayer"], reshard_after_forward=True)
shard_model(model, SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)))
k = config.num_shared_generator_layers
layers = model.teams.layer[:k]
report = {
    "units": sum(type(m).__name__ == "FSDPElectraLayer" for m in model.modules()),
    "layers": sum(type(m).__name__ == "ElectraLayer" for m in reference.modules()),  # modules() lists a shared one once
    "same_modules": all(a is b for a, b in zip(model.generator_layers()[:k], layers)),
    "same_parameters": all(p is q for a, b in zip(model.generator_layers()[:k], layers)
                           for p, q in zip(a.parameters(), b.parameters())),
    "sharded": all(isinstance(p, DTensor) for p in model.parameters()),
    "parameters": [sum(p.numel() for p in model.parameters()), sum(p.numel() for p in reference.parameters())],
}
optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, reference)]
generator = torch.Generator().manual_seed(1)
for step in range(3):
    ids = torch.randint(5, 500, (4, 16), generator=generator)
    labels = torch.full_like(ids, -100)
    labels[:, 2:6] = ids[:, 2:6]
    torch.manual_seed(step)
    model(input_ids=ids[2 * rank : 2 * rank + 2], labels=labels[2 * rank : 2 * rank + 2]).loss.backward()
    halves = []
    for half in (0, 1):  # the unsharded model on both halves: the mean of the two losses, as FSDP averages
        torch.manual_seed(step)
        halves.append(reference(input_ids=ids[2 * half : 2 * half + 2], labels=labels[2 * half : 2 * half + 2]).loss)
    (sum(halves) / 2).backward()
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad()
full = {name: p.full_tensor() for name, p in model.named_parameters()}
report["max_difference"] = max((full[name] - p).abs().max().item() for name, p in reference.named_parameters())
report["shared_moved"] = not torch.equal(full["teams.layer.0.output.dense.weight"],
                                         build().teams.layer[0].output.dense.weight)
if rank == 0:
    print(json.dumps(report))
dist.destroy_process_group()
"""


def test_teams_shared_layers_stay_one_parameter_under_fsdp(tmp_path):
    """Under the zoo's FSDP2 plan each shared layer is one FSDP unit that both the generator and the discriminator
    call: the same module and parameter objects, the unsharded parameter count, and the weights of 3 steps equal to
    those of the unsharded model trained on the same batches."""
    script = tmp_path / "shared.py"
    script.write_text(textwrap.dedent(SHARED_LAYERS_UNDER_FSDP))
    # torch's launcher through this interpreter: a torch installed without its console scripts has no `torchrun`.
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), str(script)]
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**pretrain_env(), "PYTHONPATH": REPO}, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["units"] == report["layers"]  # every ElectraLayer is a unit, each shared one once
    assert report["same_modules"] and report["same_parameters"] and report["sharded"]
    assert report["parameters"][0] == report["parameters"][1]
    assert report["max_difference"] < 1e-6 and report["shared_moved"]


def test_sharding_refuses_what_it_cannot_shard():
    from types import SimpleNamespace

    from accelerate.utils import FullyShardedDataParallelPlugin

    from encoder_zoo import models
    from encoder_zoo.training.recipes import get_recipe
    from encoder_zoo.training.run.sharding import shard_model

    recipe = get_recipe("teams")
    model = models.get_class("teams", "AutoModelForPreTraining")(
        models.get_class("teams", "AutoConfig")(**recipe.sizes["tiny"], vocab_size=100))

    def refusal(**plugin_args):
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True, **plugin_args)
        with pytest.raises(ValueError) as error:
            shard_model(model, SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)))
        return str(error.value)

    message = refusal(auto_wrap_policy="TRANSFORMER_BASED_WRAP", transformer_cls_names_to_wrap=["BertLayer"])
    assert "names BertLayer" in message and "its layer class is ElectraLayer" in message
    assert "TRANSFORMER_BASED_WRAP" in refusal(auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=1000)
    assert "false" in refusal(auto_wrap_policy="TRANSFORMER_BASED_WRAP", activation_checkpointing=True)


def test_an_fsdp_launch_never_falls_back_to_ddp_silently(tmp_path):
    """Without an accelerator, accelerate would run an FSDP config as plain DDP: the run stops and says so."""
    result = pretrain(*TEAMS, "--max_documents", "40", "--output_dir", str(tmp_path / "run"), check=False,
                      launcher=launch("fsdp_teams.yaml"))
    assert result.returncode != 0 and "asks for FSDP, which accelerate runs on GPUs only" in result.stderr
    assert not list((tmp_path / "run").glob("checkpoint-*"))


def test_slurm_script_launches_one_node_of_two_processes(tmp_path):
    """training/slurm/pretrain.sbatch without Slurm (SRUN empty, one node): its accelerate line trains and exports;
    rerun, it resumes instead of refusing the existing run."""
    out = tmp_path / "run"
    # the script calls `accelerate` from PATH, as on a cluster: this interpreter's bin/ first (a venv not activated)
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = {**pretrain_env(), "PATH": path, "SRUN": "", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
           "SLURM_JOB_NODELIST": "localhost", "GPUS_PER_NODE": "2", "CONFIG": os.path.join(CONFIGS, "ddp.yaml"),
           "OUTPUT_DIR": str(out), "MODEL": "bert", "MODEL_SIZE": "tiny"}
    args = ["--max_seq_length", "64", "--max_documents", "60", "--tokenizer_vocab_size", "500",
            "--validation_documents", "0", "--per_device_train_batch_size", "4", "--save_steps", "2",
            "--dataloader_num_workers", "0"]
    script = os.path.join(REPO, "training", "slurm", "pretrain.sbatch")
    for steps in ("2", "4"):
        result = subprocess.run(["bash", script, *args, "--max_steps", steps], capture_output=True, text=True, env=env,
                                cwd=REPO, timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
    assert "Resuming from" in result.stderr
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and (out / "export" / "model.safetensors").exists()


def resumed_copy(out, into):
    """A 4-step run as it stood at checkpoint-2: its last checkpoint, export and final state left out."""
    shutil.copytree(out, into, ignore=shutil.ignore_patterns("checkpoint-4", "export"))
    (into / "trainer_state.json").unlink()
    return into


def largest_difference(a, b) -> float:
    first, second = load_file(a / "export" / "model.safetensors"), load_file(b / "export" / "model.safetensors")
    return max((first[name] - second[name]).abs().max().item() for name in first)


def test_fsdp_checkpoints_reshard_onto_another_number_of_processes(tmp_path):
    """FSDP2's sharded checkpoints are torch.distributed.checkpoint folders (one .distcp file per saving process),
    which load onto any number of processes: a 2-process FSDP run resumed at step 2 on 1 process, and a 1-process run
    (accumulation 2) resumed on 2, end within 1e-5 of the uninterrupted runs (TEAMS, its samples keyed by example,
    dropout off; the global batch kept by deriving the accumulation)."""

    def run(out, processes, *extra):
        pretrain(*TEAMS, "--output_dir", str(out), *extra,
                 launcher=launch("fsdp_teams.yaml", FSDP_ON_CPU, processes=processes))

    two, one = tmp_path / "2x4", tmp_path / "1x4x2"
    run(two, 2)
    assert sorted(p.name for p in (two / "checkpoint-2" / "pytorch_model_fsdp_0").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]
    run(resumed_copy(two, tmp_path / "2to1"), 1, "--resume_from_checkpoint", "true")
    assert largest_difference(two, tmp_path / "2to1") < 1e-5
    run(one, 1, "--gradient_accumulation_steps", "2")
    run(resumed_copy(one, tmp_path / "1to2"), 2, "--resume_from_checkpoint", "true")
    assert largest_difference(one, tmp_path / "1to2") < 1e-5


def test_an_fsdp_streaming_run_resumes_on_another_number_of_processes(tmp_path):
    """FSDP2 with --streaming: a 2-process run's sharded checkpoint and global stream position resume on 1 process
    (accumulation 2 derived) and end within 1e-5 of the uninterrupted run (TEAMS, dropout off)."""
    stream = ["--streaming", "true", "--shuffle_window_documents", "10", "--streaming_sample_documents", "100"]
    two = tmp_path / "2x4"
    pretrain(*TEAMS, *stream, "--output_dir", str(two), launcher=launch("fsdp_teams.yaml", FSDP_ON_CPU, processes=2))
    resumed = resumed_copy(two, tmp_path / "2to1")
    result = pretrain(*TEAMS, *stream, "--output_dir", str(resumed), "--resume_from_checkpoint", "true",
                      launcher=launch("fsdp_teams.yaml", FSDP_ON_CPU, processes=1))
    assert "resuming as 1 process x 4 per device x 2 accumulation steps" in result.stderr
    assert largest_difference(two, resumed) < 1e-5
