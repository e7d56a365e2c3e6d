"""Reproduce one paper's key comparison at a declared budget: train every arm's units (independently trained
models: one per pretraining or initialisation seed) on the same data and budget, fine-tune each, and write a report
with a verdict per claim from `repro.stats.decide_family` (t-test on unit means, Holm across the paper's claims),
its interval and its minimum detectable difference.

    python repro/run.py spanbert --budget smoke|cpu|gpu [--jobs 2] [--dataset PATH_OR_HUB_ID] [--output_dir runs/repro]

Experiments: spanbert, teams, cloze, hire, bertac; `zoo` puts every method on one budget in one table
(repro/zoo.py). Every model is trained by the project's own entry points
(training/pretrain.py, glue/init_hire.py, glue/init_bertac.py, glue/run_glue.py, qa/run_qa.py), run as
subprocesses with their logs in OUTPUT_DIR/cache/. Work is cached: a pretraining export is keyed by a hash of its
flags and data and reused across seeds, experiments and reruns; each fine-tuning result is a JSON. A killed sweep
continues where it stopped (a killed pretraining resumes from its last checkpoint). A failed run is reported as
failed with its log, and the other arms still finish. Reports: OUTPUT_DIR/<experiment>/<budget>/report.md,
results.json, plot.png.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path

from encoder_zoo.repro.budgets import BUDGETS
from encoder_zoo.repro.experiments import EXPERIMENTS, METRICS
from encoder_zoo.repro.sweep import (
    REPO, Sweep, chance_level, command_block, describe_arms, git_commit, machine, relative, score_cell,
)


# ------------------------------------------------------------------------------------------------------- report
def analyse(sweep: Sweep, seed: int) -> dict:
    """Per arm and task: `describe_arms`; per claim and task: the verdict of `decide_family` (one family per
    experiment: Holm across its claims and tasks)."""
    from encoder_zoo.repro.stats import decide_family

    experiment = sweep.experiment
    chance = {task: chance_level(task, sweep.budget) for task in sweep.tasks}
    arms, runs = describe_arms(sweep, seed, chance)
    claims, family = [], []
    tested = experiment.claims_at(sweep.budget.name)
    for claim in tested:
        for task in sweep.tasks:
            if task == "heldout_mlm":
                continue  # no paper claims a pretraining-loss difference
            entry = {**asdict(claim), "task": task, "metric": METRICS[task].key,
                     "margin": METRICS[task].margin(claim)}
            claims.append(entry)
            a, b = arms[claim.arm]["tasks"].get(task), arms[claim.baseline]["tasks"].get(task)
            if a is None or b is None:
                entry["verdict"] = f"unavailable ({claim.arm if a is None else claim.baseline} has no results)"
                continue
            entry["learned"] = chance[task] is None or bool(a["above_chance"] or b["above_chance"])
            family.append((entry, {"arm": runs[(claim.arm, task)], "baseline": runs[(claim.baseline, task)],
                                   "direction": claim.direction, "higher_is_better": METRICS[task].higher_is_better,
                                   "margin": entry["margin"], "learned": entry["learned"]}))
    for (entry, _), decision in zip(family, decide_family([arguments for _, arguments in family])):
        entry["decision"], entry["verdict"] = decision, decision["verdict"]
    return {"experiment": experiment.name, "paper": experiment.paper, "budget": asdict(sweep.budget),
            "bootstrap_seed": seed, "chance": chance, "schedules": sweep.schedules(),
            "untested_tasks": [t for t in experiment.tasks if t not in sweep.tasks],
            "untested_claims": [asdict(c) for c in experiment.claims if c not in tested],
            "arms": arms, "claims": claims}


def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def write_report(results: dict, sweep: Sweep, folder: Path, argv: list[str]) -> None:
    from encoder_zoo.repro.stats import NO_SIGNAL

    experiment, budget = sweep.experiment, sweep.budget
    output_dir = sweep.cache.parent
    folder.mkdir(parents=True, exist_ok=True)
    results = {**results, "command": relative([sys.executable, str(REPO / "repro" / "run.py"), *argv], output_dir),
               "commit": git_commit(),
               "machine": machine(sweep.run_threads()),
               "commands": [{"run": j.name, "status": j.status, "command": relative(j.command, output_dir),
                             "log": relative([str(j.log)], output_dir)} for j in sweep.jobs]}
    results["run_seconds"], results["wall_seconds"] = sweep.run_seconds(), sweep.wall_seconds()
    (folder / "results.json").write_text(json.dumps(results, indent=2))
    plot(results, sweep, folder / "plot.png")
    units = len(budget.unit_seeds)
    lines = [f"# {experiment.name} at the `{budget.name}` budget", "",
             f"**Paper:** {experiment.paper}. **Budget:** {budget.description}.", "",
             "## The paper's numbers", "", "```", experiment.paper_table, "```", "",
             "## Ours: median over units and its 95% bootstrap interval (units)", "",
             f"A unit is one independently trained model (seeds {list(budget.unit_seeds)}: pretraining seed, or the "
             f"seed of a fusion's new layers, or a fixed backbone's fine-tuning seed); its score is the mean over its "
             f"{len(budget.finetune_seeds)} fine-tuning run(s).", "",
             "| arm | " + " | ".join(METRICS[t].label for t in sweep.tasks) + " |",
             "| --- |" + " --- |" * len(sweep.tasks)]
    for name, arm in results["arms"].items():
        cells = [score_cell(arm, task) for task in sweep.tasks]
        lines.append(f"| {name}{' (baseline)' if name == experiment.baseline else ''} | " + " | ".join(cells) + " |")
    lines.append("| chance (a model that learned nothing) | " + " | ".join(
        "—" if results["chance"].get(t) is None else f"{results['chance'][t]:.4g}" for t in sweep.tasks) + " |")
    lines += ["", "![plot](plot.png)", "", "## Verdicts", "",
              "Difference = arm − baseline, mean over units paired by seed, with its two-sided 90% t interval (whose "
              "ends are the one-sided 95% bounds the verdict uses). Verdict: a one-sided t-test on unit means "
              "(`repro.stats.decide`), p-values Holm-adjusted across this report's claims and tasks (one family). "
              "MDD: the true difference this test finds 80% of the time with these units and the observed unit "
              "spread; a *not reproduced* reads as \"no difference of at least the MDD at this scale\". Where every "
              "unit differs by the same amount (no spread) the p-value is the exact permutation test's and the MDD "
              "is —. Where a task "
              "has a chance level and neither arm's interval lies above it, the verdict is *no signal*.", "",
              "| claim | task | difference [90% CI] | units | p (Holm) | MDD | verdict |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for claim in results["claims"]:
        d = claim.get("decision")
        what = f"{claim['arm']} {'>' if claim['direction'] == 'better' else '≤'} {claim['baseline']} ({claim['source']})"
        if claim.get("margin") is not None:
            what += f"; margin {claim['margin']:.4g}"
        if d:
            cells = [f"{fmt(d['estimate'])} [{fmt(d['low'])}, {fmt(d['high'])}]",
                     f"{d['units']['arm']}/{d['units']['baseline']}{' paired' if d['paired'] else ''}",
                     fmt(d["p_value"]), fmt(d["mdd"])]
        else:
            cells = ["—"] * 4
        verdict = claim["verdict"] + (f" ({d['reason']})" if d and d.get("reason") and d["reason"] not in claim["verdict"]
                                      and claim["verdict"] != NO_SIGNAL else "")
        lines.append(f"| {what} | {METRICS[claim['task']].label} | " + " | ".join(cells) + f" | **{verdict}** |")
    margins = {c["margin_source"] for c in results["claims"] if c.get("margin_source")}
    lines += [""] + [f"Margin: {m}." for m in sorted(margins)]
    if results["untested_tasks"]:
        lines += ["", f"Not tested at this budget: the claims on {', '.join(results['untested_tasks'])} (this report "
                  f"evaluates {', '.join(sweep.tasks)}; see the notes)."]
    if results["untested_claims"]:
        lines += ["", f"Not tested at this budget (their arms are not trained; see the notes): "
                  f"{'; '.join(c['source'] for c in results['untested_claims'])}."]
    failed = [f for arm in results["arms"].values() for f in arm["failed"]]
    if failed:
        lines += ["", "## Failed runs", ""] + [f"- {f['run']}: {f['status']} — log `{relative([f['log']], output_dir)}`"
                                              for f in failed]
    schedules = results["schedules"]
    if schedules:
        shapes = {(v["lr_scheduler_type"]) for v in schedules.values()}
        lines += ["", "## Schedules", "", f"Every pretrained arm warms up for {sweep.warmup_steps} of "
                  f"{budget.pretrain_steps} steps (the `{experiment.schedule_arm().name}` recipe's rule at this length)."
                  + ("" if len(shapes) == 1 else " Their schedule shapes differ (each its paper's): "
                     + ", ".join(f"{k} {v['lr_scheduler_type']}" for k, v in schedules.items()) + "."),
                  "", "| arm | schedule | peak learning rate | warmup steps |", "| --- | --- | --- | --- |"]
        lines += [f"| {k} | {v['lr_scheduler_type']} | {v['learning_rate']:g} | {v['warmup_steps']} |"
                  for k, v in schedules.items()]
    lines += ["", "## Notes", "", experiment.notes or "—", "",
              "## How this was run", "", f"- Command: `{results['command']}`", f"- Commit: `{results['commit']}`",
              f"- Machine: {results['machine']}",
              f"- Time: {results['wall_seconds'] / 60:.0f} minutes of wall clock with at least one run going (sweeps "
              f"sharing the cache counted once, gaps between sittings not at all); {results['run_seconds'] / 60:.0f} "
              "minutes of runs added up (every job's last successful run, from the cache's runs.jsonl; cached jobs "
              "count with the time they took when they ran; a pretraining resumed after a kill with its logged "
              "training intervals, the killed part's included)",
              f"- Budget preset: `{json.dumps(results['budget'])}`", "",
              f"Every subprocess (cached ones included), from the repository root ({units} units per arm):", "", "```"]
    lines += command_block([c["command"] for c in results["commands"]])
    (folder / "report.md").write_text("\n".join(lines))


def plot(results: dict, sweep: Sweep, path: Path) -> None:
    """One panel per task: every unit's score (dots; the runs of a unit in gray), the median over units and its
    interval, chance in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sweep.tasks
    figure, axes = plt.subplots(1, len(tasks), figsize=(max(6, 4 * len(tasks)), 3.8), squeeze=False)
    names = list(results["arms"])
    for ax, task in zip(axes[0], tasks):
        for i, name in enumerate(names):
            r = results["arms"][name]["tasks"].get(task)
            if r:
                ax.scatter([i + 0.12] * len(r["runs"]), [run["value"] for run in r["runs"]], s=6, alpha=0.35,
                           color="gray")
                ax.scatter([i] * r["n_units"], list(r["units"].values()), s=18, color=f"C{i}", zorder=3)
                ax.errorbar([i - 0.12], [r["median"]], yerr=[[r["median"] - r["low"]], [r["high"] - r["median"]]],
                            fmt="_", color="black", capsize=4, markersize=10)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_xlim(-0.5, len(names) - 0.5)
        if results["chance"].get(task) is not None:
            ax.axhline(results["chance"][task], color="red", linestyle=":", linewidth=1, label="chance")
            ax.legend(fontsize=7, loc="best")
        ax.set_title(METRICS[task].label, fontsize=9)
    title = (f"{sweep.experiment.name}, {sweep.budget.name} budget: every unit (dots), median over units and 95% "
             "bootstrap CI (black), fine-tuning runs (gray), chance (red)")
    figure.suptitle(textwrap.fill(title, width=int(figure.get_figwidth() * 14)), fontsize=9)  # one panel is narrow
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", choices=[*sorted(EXPERIMENTS), "zoo"],
                        help="A paper's comparison, or `zoo`: every method on one budget (repro/zoo.py).")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="smoke",
                        help="smoke: plumbing in minutes; cpu: under 2 hours per paper on 2 cores; gpu: one H100 "
                        "(see repro/budgets.py).")
    parser.add_argument("--dataset", help="Pretraining corpus (pretrain.py --dataset); default: the embedded "
                                          "Wikipedia text. BERTAC's CNN keeps its enwiki excerpt.")
    parser.add_argument("--output_dir", default="runs/repro", help="Cache and reports (default: runs/repro).")
    parser.add_argument("--tasks", nargs="+", help="Restrict the evaluation tasks (default: the budget's).")
    parser.add_argument("--units", nargs="+", type=int, help="Unit seeds: one independently trained model per arm "
                        "and seed (pretraining or initialisation seed; default: the budget's).")
    parser.add_argument("--seeds", nargs="+", type=int, help="Fine-tuning seeds within each unit (default: the "
                        "budget's); unit u runs seed s as 100 u + s.")
    parser.add_argument("--bootstrap_seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="Runs side by side: this sweep and JOBS - 1 helper sweeps "
                        "of the same command on the same cache, each run with cores / JOBS torch threads (on 2 cores "
                        "`--jobs 2` did 1.35x the steps of one two-thread sweep); helpers log to "
                        "OUTPUT_DIR/cache/helper-<i>.log, and this process writes the report once every job is done.")
    parser.add_argument("--sweep_only", action="store_true", help="Run the sweep's jobs and write no report (what a "
                        "--jobs helper does; or one of several machines sharing OUTPUT_DIR).")
    args = parser.parse_args(argv)
    unknown = set(args.tasks or []) - set(METRICS)
    if unknown:
        parser.error(f"unknown task(s) {sorted(unknown)}: choose from {sorted(METRICS)}")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more sweeps to run side by side")
    return args


def start_helpers(argv: list[str], jobs: int, output_dir: Path) -> list[subprocess.Popen]:
    """`--jobs`: every run (this sweep's and the helpers') gets cores / jobs torch threads, and jobs - 1 helper sweeps
    of the same command share the cache: each takes the next job no other sweep holds (sweep.Sweep.run)."""
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = threads  # inherited by every run
    try:
        import torch

        torch.set_num_threads(int(threads))  # what runs.jsonl records per run
    except ImportError:
        pass
    (output_dir / "cache").mkdir(parents=True, exist_ok=True)
    helpers = []
    for i in range(1, jobs):
        with open(output_dir / "cache" / f"helper-{i}.log", "a") as log:
            helpers.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv, "--jobs", "1",
                                             "--sweep_only"], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                            start_new_session=True))  # stopped as a group, with the run it holds
    return helpers


def stop_helpers(helpers: list[subprocess.Popen], finished: bool) -> None:
    """Wait for the helpers once this sweep has finished (every job is then done or failed, so they only confirm it);
    if it was interrupted, stop them with the runs they started (a killed pretraining resumes on the next sweep). A
    helper that failed is named with its log."""
    for i, helper in enumerate(helpers, 1):
        if not finished and helper.poll() is None:
            os.killpg(helper.pid, signal.SIGTERM)
        if helper.wait() != 0 and finished:
            print(f"Helper sweep {i} exited with {helper.returncode}: see its log, cache/helper-{i}.log")


def run_experiment(experiment, budget, output_dir: Path, args, argv: list[str]) -> dict:
    sweep = Sweep(experiment, budget, output_dir, args.dataset, args.tasks)
    sweep.run(output_dir / "cache" / "runs.jsonl")
    if args.sweep_only:
        return {}
    results = analyse(sweep, args.bootstrap_seed)
    folder = output_dir / args.experiment / budget.name
    write_report(results, sweep, folder, argv)
    print(f"Report: {folder / 'report.md'}")
    for claim in results["claims"]:
        print(f"  {claim['arm']} vs {claim['baseline']} on {claim['task']}: {claim['verdict']}")
    return results


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    budget = BUDGETS[args.budget]
    if args.seeds or args.units:
        import dataclasses

        budget = dataclasses.replace(budget, finetune_seeds=tuple(args.seeds or budget.finetune_seeds),
                                     unit_seeds=tuple(args.units or budget.unit_seeds))
    output_dir = Path(args.output_dir).resolve()
    helpers = start_helpers(argv, args.jobs, output_dir) if args.jobs > 1 else []
    finished = False
    try:  # this sweep's run returns once every job is done or failed (it waits for those a helper holds)
        if args.experiment == "zoo":
            from encoder_zoo.repro.zoo import run_zoo

            results = run_zoo(budget, output_dir, args.dataset, args.tasks, args.bootstrap_seed, argv,
                              report=not args.sweep_only)
        else:
            results = run_experiment(EXPERIMENTS[args.experiment], budget, output_dir, args, argv)
        finished = True
    finally:
        stop_helpers(helpers, finished)
    return results


if __name__ == "__main__":
    main()
