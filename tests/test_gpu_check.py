"""bench/gpu_check.py (`make gpu-check`): its CPU smoke mode runs every check of the GPU run at tiny sizes and they
pass (the GPU-only ones recorded as skipped with a reason); its comparisons catch what they are meant to catch; on a
CUDA machine, the real check passes within its 9 minutes."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, pretrain_env, session_dir

sys.path.insert(0, str(Path(REPO) / "bench"))
import gpu_check  # noqa: E402

SCRIPT = str(Path(REPO) / "bench" / "gpu_check.py")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One `--smoke` run (a couple of minutes on 2 cores) per session, whichever pytest-xdist worker asks first (the
    other waits and reads it): its exit status, output and JSON record."""
    from filelock import FileLock

    root = session_dir(tmp_path_factory) / "gpu_check_smoke"
    with FileLock(f"{root}.lock"):
        if not (root / "result.json").exists():
            root.mkdir(parents=True, exist_ok=True)
            result = subprocess.run([sys.executable, SCRIPT, "--smoke", "--work_dir", str(root / "work"),
                                     "--results_dir", str(root / "results")], capture_output=True, text=True,
                                    env=pretrain_env(), timeout=900, cwd=REPO)
            (root / "result.json").write_text(json.dumps([result.args, result.returncode, result.stdout,
                                                          result.stderr]))
    result = subprocess.CompletedProcess(*json.loads((root / "result.json").read_text()))
    files = list((root / "results").glob("gpu_check_*.json"))
    assert files, f"no record written ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    record = json.loads(files[0].read_text())
    return result, record, {check["name"]: check for check in record["checks"]}, root


def failures(checks, names):
    return {name: checks[name]["reason"][-1500:] for name in names if checks[name]["status"] != "pass"}


@pytest.mark.slow
def test_smoke_records_every_check_with_its_numbers_and_tolerance(smoke):
    result, record, checks, root = smoke
    expected = {*(f"train:{m}" for m in gpu_check.MODELS), *(f"attention:{m}" for m in gpu_check.MODELS),
                *(f"packing:{m}" for m in gpu_check.PACKABLE), "packing:pretrain", "compile:pretrain", "determinism",
                *(f"levers:{m}" for m in gpu_check.PACKABLE), "levers:pretrain", "levers:compile",
                "resume", "glue", "qa", "fsdp:1"}
    assert set(checks) == expected  # no budget check off a GPU
    assert record["gpu"] == "cpu-smoke" and record["mode"].startswith("smoke") and record["machine"]["cpu"]
    assert record["counts"]["pass"] + record["counts"]["fail"] + record["counts"]["skip"] == len(expected)
    assert result.returncode == (1 if record["counts"]["fail"] else 0)
    for check in record["checks"]:
        assert check["status"] in ("pass", "fail", "skip")
        if check["status"] == "pass":
            assert check["tolerance"] and check["measured"] and check["summary"], check
        else:
            assert check["reason"], check  # a skip says why, a failure what went wrong
    skipped = {name: check["reason"] for name, check in checks.items() if check["status"] == "skip"}
    assert list(skipped) == ["attention:bertac_cnn"] and "no attention" in skipped["attention:bertac_cnn"]
    # Flash/flex are not compared on CPU, and the record says why.
    assert "no GPU" in checks["attention:spanbert"]["measured"]["note"]
    assert "eager and SDPA only" in checks["attention:cloze"]["measured"]["note"]
    summary = (root / "results" / "gpu_check_cpu-smoke.md").read_text()
    assert summary.startswith("# GPU check: cpu-smoke") and "| train:spanbert | pass |" in summary
    assert "Tolerances (bf16 autocast)" in summary


@pytest.mark.slow
def test_every_model_trains_with_finite_falling_losses(smoke):
    _, _, checks, _ = smoke
    names = [f"train:{m}" for m in gpu_check.MODELS]
    assert not failures(checks, names)
    for name in names:
        measured = checks[name]["measured"]
        assert measured["logged"] == 20 and measured["finite"] and measured["export"]
        assert measured["last_5_mean"] < measured["first_5_mean"]
    assert checks["train:bertac_cnn"]["summary"].startswith("20 steps at w123-f100, loss ")


@pytest.mark.slow
def test_attention_implementations_agree_on_logits_and_loss(smoke):
    _, _, checks, _ = smoke
    names = [f"attention:{m}" for m in gpu_check.ATTENTION_MODELS]
    assert not failures(checks, names)
    for name in names:
        sdpa = checks[name]["measured"]["sdpa"]
        assert "loss" in sdpa and any(key.endswith("logits") for key in sdpa)
        assert all(entry["worst_ratio"] <= 1 for entry in sdpa.values() if isinstance(entry, dict))


@pytest.mark.slow
def test_packed_batches_and_runs_give_the_padded_loss(smoke):
    _, _, checks, _ = smoke
    assert not failures(checks, [f"packing:{m}" for m in gpu_check.PACKABLE] + ["packing:pretrain"])
    assert checks["packing:spanbert"]["measured"]["padding_fraction"] > 0
    assert checks["packing:pretrain"]["measured"]["steps"] == 6


@pytest.mark.slow
def test_compiled_run_gives_the_eager_losses(smoke):
    _, _, checks, _ = smoke
    assert not failures(checks, ["compile:pretrain"])
    assert checks["compile:pretrain"]["measured"]["worst_rel_diff"] <= gpu_check.BF16_RUN_LOSS.rtol


@pytest.mark.slow
def test_deterministic_runs_and_a_killed_and_resumed_run_are_bitwise_equal(smoke):
    _, _, checks, _ = smoke
    assert not failures(checks, ["determinism", "resume"])
    resume = checks["resume"]["measured"]
    assert resume["killed_status"] != 0 and resume["newest_checkpoint_when_killed"] < resume["steps"]
    assert resume["weights_equal"] and resume["steps_differing"] == []


@pytest.mark.slow
def test_fine_tuning_and_fsdp_run_on_the_export(smoke):
    _, _, checks, _ = smoke
    assert not failures(checks, ["glue", "qa", "fsdp:1"])
    assert checks["glue"]["measured"]["train_steps"] > 0 and checks["qa"]["measured"]["train_steps"] > 0
    reload = checks["fsdp:1"]["measured"]["reload"]
    assert checks["fsdp:1"]["measured"]["sharded_checkpoint"] and reload["all_equal"] and reload["missing"] == []


def test_comparisons_fail_beyond_their_tolerance():
    """A loss one tolerance-width off, or a NaN logit, is caught; sampled outputs are compared only when both sides
    sampled the same tokens."""
    reference = {"loss": torch.tensor(2.0), "mlm_logits": torch.zeros(4, 3), "corrupted_input_ids": torch.arange(6),
                 "rtd_logits": torch.zeros(6)}
    same = gpu_check.GpuCheck.compare(reference, {k: v.clone() for k, v in reference.items()})
    assert gpu_check.GpuCheck.within(same) and same["loss"]["worst_ratio"] == 0
    tolerance = gpu_check.BF16_LOSS
    off = dict(reference, loss=torch.tensor(2.0 + 1.5 * (tolerance.atol + tolerance.rtol * 2.0)))
    assert not gpu_check.GpuCheck.within(gpu_check.GpuCheck.compare(reference, off))
    nan = dict(reference, mlm_logits=torch.full((4, 3), math.nan))
    assert not gpu_check.GpuCheck.within(gpu_check.GpuCheck.compare(reference, nan))
    flipped = dict(reference, corrupted_input_ids=torch.tensor([0, 1, 2, 3, 4, 9]), rtd_logits=torch.ones(6) * 5)
    compared = gpu_check.GpuCheck.compare(reference, flipped)
    assert ("rtd_logits" not in compared and compared["sampled_tokens_differ"] == 1
            and gpu_check.GpuCheck.within(compared))
    assert gpu_check.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_without_a_gpu_the_full_check_refuses_and_points_to_smoke():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, env=pretrain_env(), timeout=120)
    assert result.returncode == 2 and "--smoke" in result.stderr


@pytest.mark.gpu
def test_gpu_check_passes_on_this_gpu_within_nine_minutes(tmp_path):
    result = subprocess.run([sys.executable, SCRIPT, "--results_dir", str(tmp_path)], capture_output=True, text=True,
                            env=pretrain_env(), timeout=900, cwd=REPO)
    record = json.loads(next(tmp_path.glob("gpu_check_*.json")).read_text())
    failed = {c["name"]: c["reason"][-800:] for c in record["checks"] if c["status"] == "fail"}
    assert result.returncode == 0 and not failed, failed
    assert record["wall_s"] <= gpu_check.BUDGET_S and torch.cuda.get_device_name() == record["gpu"]
