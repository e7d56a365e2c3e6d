"""`repro/`: the statistics on synthetic results with known answers, and every experiment's `smoke` budget end to end
through the real entry points (report structure, verdict logic, cache reuse, resume after a killed sweep)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from encoder_zoo.repro.experiments import EXPERIMENTS, METRICS
from encoder_zoo.repro.stats import (
    NO_SIGNAL, NO_VERDICT, NOT_REPRODUCED, OPPOSITE, REPRODUCED, above_chance, median_ci, paired_difference_ci, verdict,
)

REPO = Path(__file__).resolve().parent.parent
VERDICTS = {REPRODUCED, NOT_REPRODUCED, OPPOSITE, NO_VERDICT, NO_SIGNAL}


def env():
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def paired(values):
    return {f"seed-{i}": float(v) for i, v in enumerate(values)}


# ---------------------------------------------------------------------------------------------------- statistics
def test_median_ci_is_seeded_and_brackets_the_median():
    values = [0.61, 0.64, 0.58, 0.66, 0.63]
    median, low, high = median_ci(values, seed=3)
    assert median == pytest.approx(0.63)
    assert low <= median <= high and min(values) <= low and high <= max(values)
    assert median_ci(values, seed=3) == (median, low, high)
    assert median_ci([0.5] * 4) == (0.5, 0.5, 0.5)


@pytest.mark.parametrize("shift, expected", [(0.05, REPRODUCED), (0.0, NOT_REPRODUCED), (-0.05, OPPOSITE)])
def test_verdict_on_a_clear_win_a_tie_and_a_loss(shift, expected):
    rng = np.random.default_rng(0)
    baseline = 0.70 + rng.normal(0, 0.01, 5)
    arm = baseline + shift + rng.normal(0, 0.005, 5)  # paired by seed: shared seed noise cancels
    difference = paired_difference_ci(paired(arm), paired(baseline), seed=0)
    assert difference["pairs"] == 5 and difference["low"] <= difference["mean"] <= difference["high"]
    assert verdict(difference, "better") == expected
    # a loss (lower is better): the same numbers read the other way round
    assert verdict(difference, "better", higher_is_better=False) == {
        REPRODUCED: OPPOSITE, OPPOSITE: REPRODUCED, NOT_REPRODUCED: NOT_REPRODUCED}[expected]
    # "no better than the baseline" holds unless the arm is shown better
    assert verdict(difference, "not_better") == (OPPOSITE if expected == REPRODUCED else REPRODUCED)


def test_pairing_is_by_key_and_needs_two_pairs():
    arm, baseline = {"a": 1.0, "b": 2.0, "c": 9.0}, {"a": 0.5, "b": 1.5, "z": 0.0}
    difference = paired_difference_ci(arm, baseline)
    assert difference["pairs"] == 2 and difference["mean"] == pytest.approx(0.5)
    assert verdict(paired_difference_ci({"a": 1.0}, {"a": 0.0}), "better") == NO_VERDICT
    with pytest.raises(ValueError, match="direction"):
        verdict(difference, "worse")


def test_two_arms_at_chance_get_no_verdict_however_they_differ():
    """The teams cpu report's case: both classifiers at the majority-class accuracy, or Pearsons around 0. A
    steady gap between two models that learned nothing is not the paper's effect."""
    rng = np.random.default_rng(1)
    noise = rng.normal(0, 0.01, 5)
    baseline, arm = -0.06 + noise, -0.015 + noise  # Pearsons: the arm is "better" on every seed
    difference = paired_difference_ci(paired(arm), paired(baseline))
    assert verdict(difference, "better") == REPRODUCED
    learned = [above_chance(*median_ci(values)[1:], chance=0.0) for values in (arm, baseline)]
    assert learned == [False, False]
    assert verdict(difference, "better", learned=any(learned)) == NO_SIGNAL
    # One arm above chance is a real comparison again; below chance is better for a loss.
    assert above_chance(0.60, 0.64, chance=0.572) and not above_chance(0.55, 0.60, chance=0.572)
    assert above_chance(2.0, 2.5, chance=3.0, higher_is_better=False) and above_chance(0.1, 0.2, chance=None) is None
    assert verdict(difference, "better", learned=True) == REPRODUCED
    assert verdict(paired_difference_ci({"a": 1.0}, {"a": 0.0}), "better", learned=False) == NO_VERDICT


def test_chance_is_one_constant_answer_on_the_scored_rows():
    from encoder_zoo.glue.tasks import first_samples, load_task, majority_class_accuracy
    from encoder_zoo.repro.budgets import BUDGETS
    from encoder_zoo.repro.run import chance_level

    assert majority_class_accuracy([1, 0, 0, 0]) == 0.75 and majority_class_accuracy([2, 1]) == 0.5
    budget = BUDGETS["cpu"]
    spec, raw = load_task("rotten_tomatoes")
    scored = first_samples(raw, spec, budget.max_train_samples, budget.max_eval_samples)["validation"]["label"]
    chance = chance_level("rotten_tomatoes", budget)
    assert chance == max(np.mean(scored), 1 - np.mean(scored)) and len(scored) == budget.max_eval_samples
    assert chance_level("movie_sentiment_regression", budget) == 0.0 and chance_level("wiki_cloze", budget) is None


def test_cpu_budget_fine_tunes_pretrained_arms_for_the_papers_epochs(tmp_path):
    """The sweep's own tiny pretrained models fine-tune for their preset's epochs (TEAMS Table 6: 5; at 2 the tiny
    TEAMS model stayed at the label prior); arms over the offline MiniLM for the budget's 2."""
    from encoder_zoo.glue.run_glue import parse_args
    from encoder_zoo.repro.budgets import BUDGETS
    from encoder_zoo.repro.run import Sweep

    def glue_epochs(experiment, arm):
        job = next(j for j in Sweep(EXPERIMENTS[experiment], BUDGETS["cpu"], tmp_path, None).jobs
                   if j.kind == "finetune" and j.arm == arm and "run_glue.py" in j.command[1])
        return parse_args(job.command[2:])[1].num_train_epochs

    assert glue_epochs("teams", "electra") == glue_epochs("teams", "teams") == 5
    assert glue_epochs("spanbert", "bert") == 10
    assert glue_epochs("hire", "hire") == glue_epochs("hire", "backbone") == glue_epochs("bertac", "gan_cnn") == 2


def test_a_fixed_backbone_pairs_by_finetuning_seed():
    from encoder_zoo.repro.run import aligned

    arm = {"pretrain-1/finetune-1": 0.8, "pretrain-1/finetune-2": 0.7, "pretrain-2/finetune-1": 0.9}
    backbone = {"pretrain-None/finetune-1": 0.5, "pretrain-None/finetune-2": 0.6}
    a, b = aligned(arm, backbone)
    assert b == {"pretrain-1/finetune-1": 0.5, "pretrain-1/finetune-2": 0.6, "pretrain-2/finetune-1": 0.5}
    assert paired_difference_ci(a, b)["pairs"] == 3 and aligned(backbone, backbone) == (backbone, backbone)


def test_unpaired_seed_noise_blurs_a_small_win():
    """Paired differences see a win that the per-arm spread hides: the reason runs are paired by seed."""
    seeds = np.array([0.0, 0.03, -0.02, 0.05, -0.04])
    difference = paired_difference_ci(paired(0.7 + seeds + 0.01), paired(0.7 + seeds))
    assert verdict(difference, "better") == REPRODUCED
    _, arm_low, _ = median_ci(0.7 + seeds + 0.01)
    _, _, base_high = median_ci(0.7 + seeds)
    assert arm_low < base_high  # the arms' own intervals overlap


# ------------------------------------------------------------------------------------------------ end to end
def sweep(experiment, out, *extra, check=True):
    result = subprocess.run([sys.executable, "repro/run.py", experiment, "--budget", "smoke", "--output_dir", str(out),
                             *extra], cwd=REPO, env=env(), capture_output=True, text=True, timeout=1800)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def run_log(out):
    path = Path(out) / "cache" / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def check_report(out, name):
    from encoder_zoo.repro.budgets import BUDGETS

    experiment, budget = EXPERIMENTS[name], BUDGETS["smoke"]
    folder = Path(out) / name / "smoke"
    results = json.loads((folder / "results.json").read_text())
    report = (folder / "report.md").read_text()
    assert (folder / "plot.png").read_bytes()[:4] == b"\x89PNG"
    for heading in ("## The paper's numbers", "## Ours", "## Verdicts", "## How this was run", "Commit:", "Machine:"):
        assert heading in report
    assert experiment.paper_table.splitlines()[0] in report
    assert "| chance (a model that learned nothing) |" in report
    tasks = [t for t in experiment.tasks if t in budget.tasks]
    assert set(results["arms"]) == {arm.name for arm in experiment.arms}
    for arm in experiment.arms:
        entry = results["arms"][arm.name]
        assert entry["failed"] == [], entry["failed"]
        for task in tasks:
            if task == "heldout_mlm" and not arm.pretrain:
                continue
            r = entry["tasks"][task]
            expected_runs = len(budget.pretrain_seeds) * (1 if task == "heldout_mlm" else len(budget.finetune_seeds))
            assert r["n"] == expected_runs and r["low"] <= r["median"] <= r["high"]
            assert all(np.isfinite(list(r["runs"].values())))
    claims = results["claims"]
    assert {(c["arm"], c["baseline"]) for c in claims} == {(c.arm, c.baseline) for c in experiment.claims}
    for claim in claims:  # the verdict follows from the interval, as stats.verdict says
        assert claim["verdict"] in VERDICTS - {NO_VERDICT}
        assert claim["difference"]["pairs"] == len(budget.pretrain_seeds) * len(budget.finetune_seeds)
        arm, baseline = (results["arms"][claim[side]]["tasks"][claim["task"]] for side in ("arm", "baseline"))
        assert claim["learned"] == (results["chance"][claim["task"]] is None or arm["above_chance"] or baseline["above_chance"])
        assert claim["verdict"] == verdict(claim["difference"], claim["direction"],
                                           METRICS[claim["task"]].higher_is_better, claim["learned"])
        assert f"**{claim['verdict']}**" in report
    scripts = {Path(shlex.split(c["command"])[1]).name for c in results["commands"]}
    assert scripts <= {"pretrain.py", "run_glue.py", "run_qa.py", "init_hire.py", "init_bertac.py"}
    assert all(c["status"] in ("done", "cached") for c in results["commands"])
    return results


@pytest.mark.slow
@pytest.mark.parametrize("name", ["spanbert", "cloze", "hire", "bertac"])
def test_smoke_budget_end_to_end(name, tmp_path):
    sweep(name, tmp_path)
    check_report(tmp_path, name)
    assert all(entry["status"] == "done" for entry in run_log(tmp_path))


@pytest.mark.slow
def test_a_killed_sweep_resumes_and_a_rerun_trains_nothing(tmp_path):
    """teams at smoke: SIGKILL the sweep once the first arm is finished, rerun (only the second arm trains), then
    rerun again (nothing trains, same numbers)."""
    process = subprocess.Popen([sys.executable, "repro/run.py", "teams", "--budget", "smoke", "--output_dir",
                                str(tmp_path)], cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 900
    while not any(e["arm"] == "teams" and e["kind"] == "finetune" for e in run_log(tmp_path)):
        assert process.poll() is None and time.time() < deadline, "the sweep ended before its first arm finished"
        time.sleep(1)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    first = run_log(tmp_path)
    assert {e["arm"] for e in first} == {"teams"}
    sweep("teams", tmp_path)
    second = run_log(tmp_path)[len(first):]
    assert second and all(e["arm"] == "electra" and e["status"] == "done" for e in second)  # teams reused
    results = check_report(tmp_path, "teams")
    sweep("teams", tmp_path)
    assert len(run_log(tmp_path)) == len(first) + len(second)  # nothing trained the third time
    assert json.loads((tmp_path / "teams" / "smoke" / "results.json").read_text())["arms"] == results["arms"]


def test_a_failed_arm_is_reported_with_its_log(tmp_path):
    """A pretraining that fails (a missing corpus) marks its arm failed, its fine-tuning skipped, and the report names
    the log; the sweep still exits 0 and writes its report."""
    result = sweep("teams", tmp_path, "--dataset", str(tmp_path / "missing.txt"), "--tasks", "rotten_tomatoes")
    results = json.loads((tmp_path / "teams" / "smoke" / "results.json").read_text())
    for arm in ("teams", "electra"):
        failed = results["arms"][arm]["failed"]
        assert failed[0]["status"] == "failed" and Path(failed[0]["log"]).is_file()
        assert failed[1]["status"].startswith("skipped")
    assert "## Failed runs" in (tmp_path / "teams" / "smoke" / "report.md").read_text()
    assert "unavailable" in result.stdout


def test_a_corrupted_cache_entry_is_named_moved_aside_and_recomputed(tmp_path, monkeypatch, capsys):
    """A result JSON that does not parse (a sweep killed while writing it) is not taken for a result: it is named,
    moved aside (the seed file; for an init, its model folder), never deleted, and its job runs again; a job with
    valid results stays cached."""
    from encoder_zoo.repro.budgets import BUDGETS
    from encoder_zoo.repro.run import Sweep

    sweep = Sweep(EXPERIMENTS["hire"], BUDGETS["smoke"], tmp_path, None, ["rotten_tomatoes"])
    backbone = next(j for j in sweep.jobs if j.kind == "finetune" and j.arm == "backbone")
    init = next(j for j in sweep.jobs if j.kind == "init" and j.arm == "hire")
    for job in sweep.jobs:  # every result cached and valid...
        for output in job.outputs:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps({"accuracy": 0.5}))
    broken_seed = backbone.outputs[1]
    broken_seed.write_text('{"accuracy": 0.5')  # ...but two of them cut short
    init.outputs[0].write_text('{"model_type": "hi')
    (init.folder / "model" / "model.safetensors").write_bytes(b"weights")
    executed = []

    def execute(job):
        executed.append(job)
        for output in job.outputs:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps({"accuracy": 0.75}))
        return "done"

    monkeypatch.setattr(sweep, "execute", execute)
    sweep.run(tmp_path / "runs.jsonl")
    assert executed == [init, backbone]  # the init (seeded: its fine-tuning results stand) and the broken job
    err = capsys.readouterr().err
    assert f"{broken_seed} is not valid JSON" in err and f"{init.outputs[0]} is not valid JSON" in err
    [aside] = broken_seed.parent.glob(f"{broken_seed.name}.corrupt-*")
    assert aside.read_text() == '{"accuracy": 0.5'
    [model_aside] = init.folder.glob("model.corrupt-*")
    assert (model_aside / "model.safetensors").read_bytes() == b"weights"
    assert all(json.loads(p.read_text()) == {"accuracy": 0.75} for p in (broken_seed, init.outputs[0]))
    assert json.loads(backbone.outputs[0].read_text()) == {"accuracy": 0.75}  # the whole job ran again
