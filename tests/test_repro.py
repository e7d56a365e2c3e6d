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
from encoder_zoo.repro.budgets import BUDGETS
from encoder_zoo.repro.stats import (
    INSUFFICIENT, NO_SIGNAL, NOT_REPRODUCED, OPPOSITE, REPRODUCED, above_chance, decide_family, median_ci,
)

REPO = Path(__file__).resolve().parent.parent
VERDICTS = {REPRODUCED, NOT_REPRODUCED, OPPOSITE, INSUFFICIENT, NO_SIGNAL}


def env():
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


# ---------------------------------------------------------------------------------------------------- statistics
def test_median_ci_is_seeded_and_brackets_the_median():
    values = [0.61, 0.64, 0.58, 0.66, 0.63]
    median, low, high = median_ci(values, seed=3)
    assert median == pytest.approx(0.63)
    assert low <= median <= high and min(values) <= low and high <= max(values)
    assert median_ci(values, seed=3) == (median, low, high)
    assert median_ci([0.5] * 4) == (0.5, 0.5, 0.5)


def test_above_chance_reads_the_metrics_direction():
    assert above_chance(0.60, 0.64, chance=0.572) and not above_chance(0.55, 0.60, chance=0.572)
    assert above_chance(2.0, 2.5, chance=3.0, higher_is_better=False) and above_chance(0.1, 0.2, chance=None) is None


def test_chance_is_one_constant_answer_on_the_scored_rows():
    from encoder_zoo.glue.tasks import first_samples, load_task, majority_class_accuracy
    from encoder_zoo.repro.sweep import chance_level

    assert majority_class_accuracy([1, 0, 0, 0]) == 0.75 and majority_class_accuracy([2, 1]) == 0.5
    budget = BUDGETS["cpu"]
    spec, raw = load_task("rotten_tomatoes")
    scored = first_samples(raw, spec, budget.max_train_samples, budget.max_eval_samples)["validation"]["label"]
    chance = chance_level("rotten_tomatoes", budget)
    assert chance == max(np.mean(scored), 1 - np.mean(scored)) and len(scored) == budget.max_eval_samples
    assert chance_level("movie_sentiment_regression", budget) == 0.0 and chance_level("wiki_cloze", budget) is None


def test_cpu_budget_fine_tunes_pretrained_arms_for_the_papers_epochs(tmp_path):
    """The sweep's own tiny pretrained models fine-tune for their preset's epochs and learning rate (TEAMS Table 6: 5
    epochs at 1e-4; at 2 epochs the tiny TEAMS model stayed at the label prior); arms over the offline MiniLM for
    the budget's 2 epochs at its 1e-4, every arm alike (the papers' 1e-5 left them all at the majority class)."""
    from encoder_zoo.glue.run_glue import parse_args
    from encoder_zoo.repro.sweep import Sweep

    def glue_args(experiment, arm):
        job = next(j for j in Sweep(EXPERIMENTS[experiment], BUDGETS["cpu"], tmp_path, None).jobs
                   if j.kind == "finetune" and j.arm == arm and "run_glue.py" in j.command[1])
        return parse_args(job.command[2:])[1]

    assert glue_args("teams", "electra").num_train_epochs == glue_args("teams", "teams").num_train_epochs == 5
    minilm_arms = [glue_args("hire", "hire"), glue_args("hire", "backbone"), glue_args("bertac", "gan_cnn"),
                   glue_args("bertac", "backbone")]
    assert {(a.num_train_epochs, a.learning_rate) for a in minilm_arms} == {(2, BUDGETS["cpu"].minilm_learning_rate)}
    assert glue_args("teams", "teams").learning_rate == 1e-4 and glue_args("hire", "hire").adam_beta2 == 0.98
    smoke = next(j for j in Sweep(EXPERIMENTS["bertac"], BUDGETS["smoke"], tmp_path, None).jobs
                 if j.kind == "finetune" and j.arm == "gan_cnn")
    assert parse_args(smoke.command[2:])[1].learning_rate == 1e-5  # the preset's (the paper's) where the budget sets none


def sweep_jobs(experiment, budget="cpu", tmp_path=Path("/nonexistent")):
    from encoder_zoo.repro.sweep import Sweep

    return Sweep(EXPERIMENTS[experiment], BUDGETS[budget], tmp_path, None).jobs


def flag(command, name):
    return command[command.index(name) + 1] if name in command else None


@pytest.mark.parametrize("experiment", sorted(EXPERIMENTS))
def test_every_arm_trains_one_model_per_unit_seed_and_no_run_counts_in_two_arms(experiment, tmp_path):
    """Units are independently trained models: one pretraining (or init, or CNN pretraining) per arm and unit seed,
    with that seed; fine-tuning seeds differ across units (so a fixed backbone's units are different models) and are
    shared by the arms' units of one seed (so they pair); no pretraining, init or fine-tuning serves two arms."""
    budget = BUDGETS["cpu"]
    assert len(budget.unit_seeds) >= 3 and len(BUDGETS["gpu"].unit_seeds) >= 3
    jobs = sweep_jobs(experiment, tmp_path=tmp_path)
    assert {j.arm for j in jobs} == {a.name for a in EXPERIMENTS[experiment].arms_at("cpu")}
    for arm in EXPERIMENTS[experiment].arms_at("cpu"):
        mine = [j for j in jobs if j.arm == arm.name]
        for kind in ("pretrain", "init"):
            seeds = sorted({int(flag(j.command, "--seed")) for j in mine if j.kind == kind})
            assert seeds in ([], list(budget.unit_seeds)), (arm.name, kind, seeds)
        finetuned = sorted(s for j in mine if j.kind == "finetune" and "run_glue.py" in j.command[1] for s in j.seeds)
        tasks = [t for t in EXPERIMENTS[experiment].tasks_at("cpu") if t in budget.tasks and t in ("rotten_tomatoes",
                                                                                                    "movie_sentiment_regression")]
        assert finetuned == sorted(budget.finetune_seed(u, f) for u in budget.unit_seeds for f in budget.finetune_seeds
                                   for _ in tasks)
    folders = [j.folder for j in jobs if j.kind in ("init", "finetune")] + [
        j.folder for j in jobs if j.kind == "pretrain" and "--cnn" not in " ".join(j.command) and "bertac_cnn" not in j.command]
    assert len(folders) == len(set(folders))


def test_every_pretrained_arm_of_a_comparison_warms_up_for_the_same_steps(tmp_path):
    """Each recipe's own rule gives TEAMS 40 and ELECTRA 20 warmup steps at 2,000 steps: the sweep passes the
    schedule arm's to every arm, and every schedule shape of one experiment is the same."""
    from encoder_zoo.training.recipes import get_recipe

    for name, experiment in EXPERIMENTS.items():
        pretrain = [j for j in sweep_jobs(name, tmp_path=tmp_path) if j.kind == "pretrain" and "bertac_cnn" not in j.command]
        warmups = {flag(j.command, "--warmup_steps") for j in pretrain}
        assert len(warmups) <= 1, (name, warmups)
        shapes = {get_recipe(flag(j.command, "--model")).training_defaults["tiny"].lr_scheduler_type for j in pretrain}
        assert len(shapes) <= 1, (name, shapes)
    teams = [j for j in sweep_jobs("teams", tmp_path=tmp_path) if j.kind == "pretrain"]
    assert {flag(j.command, "--warmup_steps") for j in teams} == {"40"}


def test_a_budget_may_train_fewer_arms_and_the_report_lists_the_claims_left_untested(tmp_path, monkeypatch):
    """cloze at `cpu` trains cloze and bilm only (nine two-tower pretrainings exceed 2 hours): its one claim between
    them is decided, the claim on cloze + bilm is listed as untested, and no run of that arm is made."""
    import dataclasses

    from encoder_zoo.repro.run import analyse, write_report
    from encoder_zoo.repro.summary import table
    from encoder_zoo.repro.sweep import Sweep

    experiment = EXPERIMENTS["cloze"]
    assert [a.name for a in experiment.arms_at("smoke")] == [a.name for a in experiment.arms]
    sweep = Sweep(experiment, BUDGETS["cpu"], tmp_path, None)
    assert {j.arm for j in sweep.jobs} == {"cloze", "bilm"} and sweep.tasks == ["rotten_tomatoes",
                                                                                 "movie_sentiment_regression"]

    def execute(job):
        for output in job.outputs:
            output.parent.mkdir(parents=True, exist_ok=True)
            value = 0.6 + 0.01 * len(job.arm) + 0.001 * sum(job.seeds)
            output.write_text(json.dumps({"accuracy": value, "pearson": value}))
        return "done"

    monkeypatch.setattr(sweep, "execute", execute)
    sweep.run(tmp_path / "cache" / "runs.jsonl")
    results = analyse(sweep, 0)
    assert {(c["arm"], c["baseline"]) for c in results["claims"]} == {("cloze", "bilm")}
    assert all("decision" in c for c in results["claims"]) and set(results["arms"]) == {"cloze", "bilm"}
    untested = next(c for c in experiment.claims if c.arm == "cloze_bilm")
    assert results["untested_claims"] == [dataclasses.asdict(untested)]
    write_report(results, sweep, tmp_path / "report", ["cloze", "--budget", "cpu"])
    assert untested.source in (tmp_path / "report" / "report.md").read_text()
    (tmp_path / "reports" / "cloze" / "cpu").mkdir(parents=True)
    (tmp_path / "reports" / "cloze" / "cpu" / "results.json").write_text(json.dumps(results))
    rows = [r for r in table("cpu", tmp_path / "reports").splitlines() if "cloze" in r]
    assert len(rows) == 3 and "| cloze_bilm ≤ cloze | — |" in rows[-1] and "not tested at `cpu`" in rows[-1]


def test_spanbert_tests_table_6_and_7_in_the_papers_ablation_settings(tmp_path):
    experiment = EXPERIMENTS["spanbert"]
    claims = {(c.arm, c.baseline) for c in experiment.claims}
    assert {("spanbert", "bert"), ("span_2seq_nsp", "bert_2seq_nsp"), ("span_1seq", "span_2seq_nsp"),
            ("spanbert", "span_1seq")} == claims
    commands = {j.arm: j.command for j in sweep_jobs("spanbert", tmp_path=tmp_path) if j.kind == "pretrain"}
    assert flag(commands["span_2seq_nsp"], "--model") == "bert_2seq_nsp"  # two segments + NSP, no SBO...
    assert flag(commands["span_2seq_nsp"], "--masking_scheme") == "span"  # ...with geometric spans
    assert flag(commands["bert_2seq_nsp"], "--masking_scheme") is None  # the recipe's subword masking
    assert flag(commands["span_1seq"], "--config_overrides") == "use_span_boundary_objective=False"


def test_init_scripts_get_each_units_seed(tmp_path):
    for name in ("hire", "bertac"):
        inits = [j for j in sweep_jobs(name, tmp_path=tmp_path) if j.kind == "init"]
        assert inits and {flag(j.command, "--seed") for j in inits} == {str(u) for u in BUDGETS["cpu"].unit_seeds}


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
    experiment, budget = EXPERIMENTS[name], BUDGETS["smoke"]
    folder = Path(out) / name / "smoke"
    results = json.loads((folder / "results.json").read_text())
    report = (folder / "report.md").read_text()
    assert (folder / "plot.png").read_bytes()[:4] == b"\x89PNG"
    for heading in ("## The paper's numbers", "## Ours", "## Verdicts", "## How this was run", "Commit:", "Machine:",
                    "| claim | task | difference [90% CI] | units | p (Holm) | MDD | verdict |"):
        assert heading in report
    assert experiment.paper_table.splitlines()[0] in report
    assert "| chance (a model that learned nothing) |" in report
    assert str(out) not in report and str(REPO) not in report and sys.executable not in report  # no machine path
    assert all(c["command"].startswith("python ") and str(out) not in c["command"] for c in results["commands"])
    tasks = [t for t in experiment.tasks if t in budget.tasks]
    assert set(results["arms"]) == {arm.name for arm in experiment.arms}
    runs = {}
    for arm in experiment.arms:
        entry = results["arms"][arm.name]
        assert entry["failed"] == [], entry["failed"]
        for task in tasks:
            if task == "heldout_mlm" and not arm.pretrain:
                continue
            r = entry["tasks"][task]
            assert r["n_units"] == len(budget.unit_seeds) and r["low"] <= r["median"] <= r["high"]
            assert sorted(run["unit"] for run in r["runs"]) == sorted(
                u for u in budget.unit_seeds for _ in ([None] if task == "heldout_mlm" else budget.finetune_seeds))
            assert all(np.isfinite(run["value"]) for run in r["runs"])
            runs[(arm.name, task)] = {(run["unit"], run["finetune_seed"]): run["value"] for run in r["runs"]}
    claims = results["claims"]
    assert {(c["arm"], c["baseline"]) for c in claims} == {(c.arm, c.baseline) for c in experiment.claims}
    # the verdicts are decide_family's on the runs results.json keeps: one family per report
    again = decide_family([{"arm": runs[(c["arm"], c["task"])], "baseline": runs[(c["baseline"], c["task"])],
                            "direction": c["direction"], "margin": c["margin"], "learned": c["learned"],
                            "higher_is_better": METRICS[c["task"]].higher_is_better} for c in claims])
    for claim, decision in zip(claims, again):
        assert claim["verdict"] == decision["verdict"] in VERDICTS
        assert claim["decision"]["units"] == {"arm": len(budget.unit_seeds), "baseline": len(budget.unit_seeds)}
        assert claim["decision"]["p_value"] == decision["p_value"] and claim["decision"]["mdd"] == decision["mdd"]
        arm, baseline = (results["arms"][claim[side]]["tasks"][claim["task"]] for side in ("arm", "baseline"))
        assert claim["learned"] == (results["chance"][claim["task"]] is None or arm["above_chance"] or baseline["above_chance"])
        assert f"**{claim['verdict']}" in report
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
    """teams at smoke: SIGKILL the sweep once the first arm's units are finished, rerun (only the second arm trains), then
    rerun again (nothing trains, same numbers)."""
    process = subprocess.Popen([sys.executable, "repro/run.py", "teams", "--budget", "smoke", "--output_dir",
                                str(tmp_path)], cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 900
    last_unit = f"unit {BUDGETS['smoke'].unit_seeds[-1]} "
    while not any(e["arm"] == "teams" and e["kind"] == "finetune" and last_unit in e["job"] for e in run_log(tmp_path)):
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


@pytest.mark.slow
def test_jobs_2_runs_two_sweeps_side_by_side_each_job_once_and_one_report(tmp_path):
    """`--jobs 2`: a helper sweep of the same command shares the cache; every job runs once, each with cores / 2
    torch threads, the helper is gone when the command returns, and the report is the main sweep's."""
    sweep("teams", tmp_path, "--tasks", "rotten_tomatoes", "--jobs", "2")
    log = run_log(tmp_path)
    assert sorted(e["folder"] for e in log) == sorted({e["folder"] for e in log})  # no job run twice
    assert all(e["status"] == "done" and e["torch_threads"] == max(1, os.cpu_count() // 2) for e in log)
    assert (tmp_path / "cache" / "helper-1.log").stat().st_size > 0
    check_report(tmp_path, "teams")
    assert "--jobs 2" in json.loads((tmp_path / "teams" / "smoke" / "results.json").read_text())["command"]


def test_jobs_starts_helpers_of_the_same_command_and_sweep_only_writes_no_report(tmp_path, monkeypatch):
    """The helpers `--jobs 3` starts: the same command as --jobs 1 --sweep_only, in their own process group (stopped
    with the runs they hold), runs with cores / 3 threads; each helper is waited for."""
    import torch

    from encoder_zoo.repro import run as run_module
    from encoder_zoo.repro.sweep import Sweep

    started = []

    class Helper:
        def __init__(self, command, **kwargs):
            started.append(self)
            self.command, self.kwargs, self.threads = command, kwargs, os.environ["OMP_NUM_THREADS"]
            self.pid, self.returncode, self.waited = -1, 0, False

        def poll(self):
            return None

        def wait(self):
            self.waited = True
            return 0

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "1")  # restored afterwards
    monkeypatch.setattr(run_module.subprocess, "Popen", Helper)
    monkeypatch.setattr(run_module.os, "cpu_count", lambda: 6)
    monkeypatch.setattr(Sweep, "execute", lambda self, job: write_outputs(job, 0.7) or "done")
    argv = ["hire", "--budget", "smoke", "--tasks", "rotten_tomatoes", "--output_dir", str(tmp_path), "--jobs", "3",
            "--sweep_only"]
    threads = torch.get_num_threads()
    try:
        assert run_module.main(argv) == {}
    finally:
        torch.set_num_threads(threads)
    assert len(started) == 2 and all(h.waited and h.kwargs["start_new_session"] for h in started)
    assert all(h.command[2:] == [*argv, "--jobs", "1", "--sweep_only"] and h.threads == "2" for h in started)
    assert Path(started[0].command[1]) == REPO / "repro" / "run.py"
    assert {e["torch_threads"] for e in run_log(tmp_path)} == {2} and not (tmp_path / "hire").exists()


def write_outputs(job, value):
    """What a job's run leaves: each output a result JSON of `value` (stands in for the real entry points)."""
    for output in job.outputs:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps({"accuracy": value}))


def test_a_sweep_beside_another_runs_its_own_jobs_before_waiting(tmp_path, monkeypatch):
    """Two sweeps sharing a cache (say one per --units): a job the other sweep is running is put off while this sweep
    has other jobs it can start, then taken from the cache; the order is the job list's when nothing is held."""
    from encoder_zoo.repro.sweep import ENTRY_LOCK, Sweep
    from encoder_zoo.training import run as locks

    sweep = Sweep(EXPERIMENTS["hire"], BUDGETS["smoke"], tmp_path, None, ["rotten_tomatoes"])
    first = sweep.jobs[0]  # hire's first init: the other sweep is running it
    other_running = [True]
    real_try_hold = locks.try_hold
    monkeypatch.setattr(locks, "try_hold", lambda folder, name=ENTRY_LOCK: (
        not (folder == first.folder and other_running[0]) and real_try_hold(folder, name)))
    monkeypatch.setattr(locks, "wait_and_hold", lambda folder, name, message: (
        locks.try_hold(folder, name) or pytest.fail(f"waited for {folder}")))
    executed = []

    def execute(job):
        executed.append(job)
        if len(executed) == 2:  # meanwhile the other sweep finishes the first job
            write_outputs(first, 0.75)
            other_running[0] = False
        write_outputs(job, 0.75)
        return "done"

    monkeypatch.setattr(sweep, "execute", execute)
    sweep.run(tmp_path / "runs.jsonl")
    assert first.status == "cached" and all(job is not first for job in executed)
    put_off = sweep.jobs[1]  # the fine-tuning that needs the held init waits for it too
    assert first in put_off.needs and executed[:2] == sweep.jobs[2:4]  # the next unit's init and fine-tuning first
    rest = [job for job in sweep.jobs if all(job is not j for j in (first, *executed[:2]))]
    assert executed[2:] == rest and rest[0] is put_off  # then the list's order again, nothing run twice
    assert all(job.status in ("done", "cached") for job in sweep.jobs)


def test_the_zoo_reuses_a_papers_fine_tuning_run_made_under_another_arms_name(tmp_path, monkeypatch):
    """The zoo's fusions over MiniLM are the HIRE and BERTAC papers' own runs (same model, flags and seeds) under other
    arm names: a cache holding the papers' runs trains none of them again."""
    from encoder_zoo.repro.sweep import Sweep
    from encoder_zoo.repro.zoo import zoo_experiment

    papers = {name: Sweep(EXPERIMENTS[name], BUDGETS["smoke"], tmp_path, None, ["rotten_tomatoes"])
              for name in ("hire", "bertac")}
    for sweep in papers.values():
        for job in sweep.jobs:
            write_outputs(job, 0.7)
    zoo = Sweep(zoo_experiment(), BUDGETS["smoke"], tmp_path, None, ["rotten_tomatoes"])
    for arm, paper, paper_arm in (("hire+minilm", "hire", "hire"), ("bertac+minilm", "bertac", "gan_cnn")):
        reused = [j for j in zoo.jobs if j.arm == arm]
        made = {j.folder for j in papers[paper].jobs if j.arm == paper_arm}
        assert reused and {j.folder for j in reused} == made and all(j.done() for j in reused)
    executed = []
    monkeypatch.setattr(zoo, "execute", lambda job: executed.append(job) or write_outputs(job, 0.6) or "done")
    zoo.run(tmp_path / "runs.jsonl")
    assert executed and not any(j.arm.endswith("+minilm") for j in executed)
    assert zoo.values("hire+minilm", "rotten_tomatoes") == papers["hire"].values("hire", "rotten_tomatoes")
    # a run no other arm made keeps its own arm's name
    assert all(j.folder.name.startswith(f"{j.arm}-") for j in executed if j.kind == "finetune")


def test_the_reports_machine_line_names_the_runs_threads_not_the_report_writers(tmp_path, monkeypatch):
    """Each run's torch threads go to runs.jsonl beside its seconds; a report written later, by a process with another
    thread count, names the runs' count. Runs logged before threads were recorded count as the writer's."""
    from encoder_zoo.repro import sweep as sweep_module
    from encoder_zoo.repro.sweep import Sweep, machine

    sweep = Sweep(EXPERIMENTS["hire"], BUDGETS["smoke"], tmp_path, None, ["rotten_tomatoes"])
    monkeypatch.setattr(sweep, "execute", lambda job: write_outputs(job, 0.7) or "done")
    monkeypatch.setattr(sweep_module, "torch_threads", lambda: 1)
    sweep.run(tmp_path / "cache" / "runs.jsonl")
    monkeypatch.setattr(sweep_module, "torch_threads", lambda: 2)  # the process writing the report
    assert sweep.run_threads() == {1: len(sweep.jobs)}
    assert ", 1 torch thread(s) per run" in machine(sweep.run_threads())
    assert sweep.run_seconds() == sum(e["seconds"] for e in run_log(tmp_path))
    log = tmp_path / "cache" / "runs.jsonl"
    entries = run_log(tmp_path)
    del entries[0]["torch_threads"]  # logged by an older sweep
    log.write_text("".join(json.dumps(e) + "\n" for e in entries))
    assert sweep.run_threads() == {None: 1, 1: len(sweep.jobs) - 1}
    line = machine(sweep.run_threads())
    assert f"1 torch thread(s) per run ({len(sweep.jobs) - 1} runs) and 2 torch thread(s) per run (1 run)" in line


def test_a_reports_time_counts_a_resumed_pretrainings_killed_part(tmp_path, monkeypatch):
    """runs.jsonl logs only a pretraining's last, resumed run; its logged training intervals (restored with the
    checkpoint) hold the killed part too, and the report's time counts the larger of the two."""
    from encoder_zoo.repro.sweep import Sweep

    sweep = Sweep(EXPERIMENTS["teams"], BUDGETS["smoke"], tmp_path, None, ["rotten_tomatoes"])
    pretrain = next(j for j in sweep.jobs if j.kind == "pretrain")
    monkeypatch.setattr(sweep, "execute", lambda job: write_outputs(job, 0.7) or "done")
    sweep.run(tmp_path / "cache" / "runs.jsonl")
    logged = sweep.run_seconds()
    # 1,000 tokens at 10/s before the kill, 1,000 at 100/s after: 110 s of training, where the last run logged ~0 s
    history = [{"loss": 5.0, "num_input_tokens_seen": n, "tokens_per_second": r} for n, r in ((1000, 10), (2000, 100))]
    (pretrain.folder / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    entry = next(e for e in run_log(tmp_path) if e["folder"] == str(pretrain.folder))
    assert sweep.run_seconds() == pytest.approx(logged - entry["seconds"] + 110.0)


def test_a_reports_wall_clock_counts_overlapping_runs_once_and_gaps_between_sittings_not_at_all(tmp_path, monkeypatch):
    """Two sweeps sharing 2 cores run two jobs at once: the report's wall clock is the union of the runs' intervals
    (each logged with its end time and seconds), beside their sum."""
    from encoder_zoo.repro.sweep import Sweep

    sweep = Sweep(EXPERIMENTS["teams"], BUDGETS["smoke"], tmp_path, None, ["rotten_tomatoes"])
    monkeypatch.setattr(sweep, "execute", lambda job: write_outputs(job, 0.7) or "done")
    sweep.run(tmp_path / "cache" / "runs.jsonl")
    entries = run_log(tmp_path)
    assert len(entries) >= 4
    # (end, seconds): [0, 100] and [50, 150] overlap, [150, 160] touches, [1000, 1040] after a gap, the rest inside
    spans = [(100, 100), (150, 100), (160, 10), (1040, 40)] + [(1030, 5)] * (len(entries) - 4)
    for entry, (end, seconds) in zip(entries, spans):
        entry["time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(1_800_000_000 + end))
        entry["seconds"] = seconds
    (tmp_path / "cache" / "runs.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    assert sweep.wall_seconds() == pytest.approx(160 + 40)
    assert sweep.run_seconds() == pytest.approx(sum(seconds for _, seconds in spans))


def test_a_corrupted_cache_entry_is_named_moved_aside_and_recomputed(tmp_path, monkeypatch, capsys):
    """A result JSON that does not parse (a sweep killed while writing it) is not taken for a result: it is named,
    moved aside (the seed file; for an init, its model folder), never deleted, and its job runs again; a job with
    valid results stays cached."""
    import dataclasses

    from encoder_zoo.repro.sweep import Sweep

    budget = dataclasses.replace(BUDGETS["smoke"], finetune_seeds=(1, 2))
    sweep = Sweep(EXPERIMENTS["hire"], budget, tmp_path, None, ["rotten_tomatoes"])
    backbone = next(j for j in sweep.jobs if j.kind == "finetune" and j.arm == "backbone")
    init = next(j for j in sweep.jobs if j.kind == "init" and j.arm == "hire")
    for job in sweep.jobs:  # every result cached and valid...
        write_outputs(job, 0.5)
    broken_seed = backbone.outputs[1]
    broken_seed.write_text('{"accuracy": 0.5')  # ...but two of them cut short
    init.outputs[0].write_text('{"model_type": "hi')
    (init.folder / "model" / "model.safetensors").write_bytes(b"weights")
    executed = []

    def execute(job):
        executed.append(job)
        write_outputs(job, 0.75)
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


def test_readme_reproduction_table_is_generated_from_the_committed_reports():
    from encoder_zoo.repro.summary import BEGIN, END, ZOO_BEGIN, ZOO_END, table, zoo_table

    readme = (REPO / "README.md").read_text()
    for (begin, end), text in (((BEGIN, END), table()), ((ZOO_BEGIN, ZOO_END), zoo_table())):
        assert begin in readme and end in readme
        assert readme.split(begin)[1].split(end)[0].strip() == text.strip(), "rerun: python repro/summary.py --write"


def test_a_pretrainings_time_is_its_logged_intervals_so_a_resumed_run_keeps_its_whole_time(tmp_path):
    """Trainer restores total_flos, the tokens seen and the log of the intervals before the checkpoint, but
    train_runtime is the last part's: the time is the sum of the logged intervals' (tokens over tokens/s). A run
    whose intervals carry no token rate falls back to train_runtime, and has no time when it was resumed; the table
    says how many units were timed."""
    from encoder_zoo.repro.sweep import Job
    from encoder_zoo.repro.zoo import pretraining_compute, score_table

    # 3 intervals: 1,000 tokens in 10 s, 2,000 in 5 s (before the kill), then 1,000 in 10 s after resuming
    intervals = [{"loss": 5.0, "num_input_tokens_seen": n, "tokens_per_second": r}
                 for n, r in ((1000, "100"), (3000, "400"), (4000, "100"))]
    state = {"log_history": [*intervals, {"train_runtime": 10.0}], "global_step": 300, "train_batch_size": 16,
             "num_input_tokens_seen": 4000, "total_flos": 3e12}

    def compute(name, state, resumed):
        job = Job("pretrain", name, name, tmp_path / name, [], [])
        job.folder.mkdir()
        (job.folder / "trainer_state.json").write_text(json.dumps(state))
        job.log.write_text("$ python pretrain.py --seed 1\n" + ("$ python pretrain.py --seed 1 "
                                                                "--resume_from_checkpoint true\n" if resumed else ""))
        return pretraining_compute(job, BUDGETS["cpu"])

    timed = compute("resumed", state, resumed=True)
    assert timed == {"flops": 3e12, "tokens": 4000, "tokens_counted": True, "seconds": 25.0,
                     "tokens_per_second": 160.0}
    untimed = [{k: v for k, v in e.items() if k != "tokens_per_second"} for e in intervals]
    words = {**state, "log_history": [*untimed, {"train_runtime": 10.0}]}
    assert compute("words", words, resumed=False)["seconds"] == 10.0
    assert compute("words-resumed", words, resumed=True)["seconds"] is None
    score = {"median": 0.6, "low": 0.5, "high": 0.7, "n_units": 3}
    units = {"1": {**timed, "includes_minilm": False}, "2": {**timed, "seconds": None, "tokens_per_second": None,
                                                               "includes_minilm": False},
             "3": {**timed, "includes_minilm": False}}
    rows = score_table({"tasks": ["rotten_tomatoes"], "chance": {"rotten_tomatoes": 0.5},
                        "arms": {"bert": {"tasks": {"rotten_tomatoes": score}, "failed": [], "compute": units}}})
    assert "| bert | 0.6 [0.5, 0.7] (3) | 3e+12 | 4,000 | 160 (2 of 3 units) | 25 (2 of 3 units) |" in rows


def test_readme_zoo_table_shows_every_method_with_its_compute_and_the_significant_pairs(tmp_path):
    from encoder_zoo.repro.summary import zoo_table

    unit = {"flops": 2e12, "tokens": 4000, "tokens_per_second": 800.0, "seconds": 5.0, "includes_minilm": False}
    minilm = {"flops": None, "tokens": None, "tokens_per_second": None, "seconds": None, "includes_minilm": True}
    score = {"median": 0.61, "low": 0.58, "high": 0.64, "n_units": 3}
    results = {"tasks": ["rotten_tomatoes", "wiki_cloze"], "best_encoder": "teams",
               "chance": {"rotten_tomatoes": 0.572, "wiki_cloze": None},
               "arms": {"teams": {"tasks": {"rotten_tomatoes": score, "wiki_cloze": {**score, "median": 7.5}},
                                  "failed": [], "compute": {"1": unit, "2": {**unit, "flops": 4e12}, "3": unit}},
                        "hire+minilm": {"tasks": {"rotten_tomatoes": {**score, "median": 0.75}}, "failed": [],
                                        "compute": {"1": minilm}}},
               "pairs": [{"task": "rotten_tomatoes", "better": "hire+minilm", "worse": "teams", "significant": True},
                         {"task": "wiki_cloze", "better": "teams", "worse": "bert", "significant": False}]}
    (tmp_path / "zoo" / "cpu").mkdir(parents=True)
    (tmp_path / "zoo" / "cpu" / "results.json").write_text(json.dumps(results))
    text = zoo_table("cpu", tmp_path)
    assert "| teams | 0.61 [0.58, 0.64] (3) | 7.5 [0.58, 0.64] (3) | 2e+12 | 4,000 | 800 | 5 |" in text
    assert "| hire+minilm | 0.75 [0.58, 0.64] (3) | — | — + MiniLM | — | — | — |" in text
    assert "| chance | 0.572 | — | | | | |" in text
    assert "hire+minilm > teams on rotten_tomatoes accuracy" in text and "teams > bert" not in text
    assert "**teams**" in text and "(repro/reports/zoo/cpu/plot.png)" in text
    assert zoo_table("gpu", tmp_path).startswith("Not yet run at `gpu`")


def test_summary_write_replaces_only_the_table(tmp_path):
    from encoder_zoo.repro.summary import BEGIN, END, write_readme

    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n")
    write_readme("| new |\n", readme)
    assert readme.read_text() == f"# Title\n\nbefore\n{BEGIN}\n| new |\n{END}\nafter\n"
    readme.write_text("no markers")
    with pytest.raises(SystemExit, match="lacks the markers"):
        write_readme("| new |", readme)
    assert readme.read_text() == "no markers"


def test_every_committed_report_names_no_machine_path():
    for report in (REPO / "repro" / "reports").glob("*/*/report.md"):
        text = report.read_text()
        assert "/root/" not in text and "/tmp/" not in text and "/work/" not in text, report


@pytest.mark.slow
def test_zoo_smoke_trains_every_method_and_reports_compute_and_pairs(tmp_path):
    """`repro/run.py zoo --budget smoke`: every encoder and both fusions over MiniLM and over the best encoder, with
    each unit's pretraining FLOPs (Trainer's total_flos, the bench's count) next to its scores, and every pair of
    methods tested per task."""
    from encoder_zoo.repro.zoo import ENCODERS

    sweep("zoo", tmp_path)
    folder = tmp_path / "zoo" / "smoke"
    results = json.loads((folder / "results.json").read_text())
    best = results["best_encoder"]
    assert best in ENCODERS
    arms = results["arms"]
    assert set(arms) == {*ENCODERS, "hire+minilm", "bertac+minilm", f"hire+{best}", f"bertac+{best}"}
    units = [str(u) for u in BUDGETS["smoke"].unit_seeds]
    for name, arm in arms.items():
        assert arm["failed"] == [] and arm["tasks"]["rotten_tomatoes"]["n_units"] == len(units), name
        compute = arm["compute"]
        if name in ENCODERS or name.endswith(f"+{best}"):
            assert all(compute[u]["flops"] > 0 and compute[u]["tokens"] > 0 and compute[u]["seconds"] > 0 for u in units)
        if name.endswith(f"+{best}"):  # a fusion's compute includes its encoder's pretraining
            assert all(compute[u]["flops"] >= arms[best]["compute"][u]["flops"] for u in units)
    assert ("heldout_mlm" in arms["bert"]["tasks"]) and ("heldout_mlm" not in arms["teams"]["tasks"])
    rotten = [p for p in results["pairs"] if p["task"] == "rotten_tomatoes"]
    assert len(rotten) == len(arms) * (len(arms) - 1) // 2
    assert all(p["decision"]["alpha"] == 0.025 and p["decision"]["family_size"] <= len(rotten) for p in rotten)
    report = (folder / "report.md").read_text()
    assert "| method |" in report and "pretraining FLOPs" in report and str(tmp_path) not in report
    assert (folder / "plot.png").read_bytes()[:4] == b"\x89PNG"
    reused = {c["folder"] for c in results["commands"]}
    assert len(reused) == len(results["commands"])  # one job per folder: a run shared by two methods runs once


def test_a_task_reads_failed_only_where_its_own_run_or_a_run_it_needs_failed(tmp_path, monkeypatch):
    """A cell reads 'failed' where a run writing its score failed or was skipped for a failure upstream: a failed QA
    fine-tuning marks wiki_cloze only; a failed pretraining every task of its arm (held-out loss included); a failed
    fusion init its task's fine-tuning, not the held-out loss the fusion has no run for."""
    from encoder_zoo.repro.sweep import Sweep, failed_on

    tasks = ["wiki_cloze", "rotten_tomatoes", "heldout_mlm"]
    sweep = Sweep(EXPERIMENTS["spanbert"], BUDGETS["smoke"], tmp_path, None, tasks)
    failing = {next(j.folder for j in sweep.jobs if j.arm == "spanbert" and j.name.startswith("wiki_cloze")),
               next(j.folder for j in sweep.jobs if j.arm == "bert" and j.kind == "pretrain")}
    monkeypatch.setattr(sweep, "execute", lambda job: "failed" if job.folder in failing else
                        write_outputs(job, 0.7) or "done")
    sweep.run(tmp_path / "cache" / "runs.jsonl")
    qa, pretraining = {"failed": sweep.failures("spanbert")}, {"failed": sweep.failures("bert")}
    assert failed_on(qa, "wiki_cloze") and not failed_on(qa, "rotten_tomatoes") and not failed_on(qa, "heldout_mlm")
    assert all(failed_on(pretraining, task) for task in tasks)
    assert not any(failed_on({"failed": sweep.failures("span_1seq")}, task) for task in tasks)

    fusion = Sweep(EXPERIMENTS["hire"], BUDGETS["smoke"], tmp_path / "hire", None, ["rotten_tomatoes", "heldout_mlm"])
    init = next(j.folder for j in fusion.jobs if j.arm == "hire" and j.kind == "init")
    monkeypatch.setattr(fusion, "execute", lambda job: "failed" if job.folder == init else
                        write_outputs(job, 0.7) or "done")
    fusion.run(tmp_path / "hire" / "cache" / "runs.jsonl")
    hire = {"failed": fusion.failures("hire")}
    assert failed_on(hire, "rotten_tomatoes") and not failed_on(hire, "heldout_mlm")
