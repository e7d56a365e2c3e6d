"""Reproduce one paper's key comparison at a declared budget: train every arm's units (independently trained
models: one per pretraining or initialisation seed) on the same data and budget, and a positive control (the baseline's
model at random initialisation), fine-tune each, and write a report with the floors (chance and a trivial model on the
same rows), the control (pretrained > random), and a verdict per claim (`repro.stats`: t-test on unit means; the
primary claim alone at 5%, the secondary ones with Holm), its interval and its minimum detectable difference.

    python repro/run.py spanbert --budget smoke|cpu|adapt|gpu [--jobs 2] [--dataset PATH_OR_HUB_ID]
        [--output_dir runs/repro]

Experiments: spanbert, teams, cloze, hire, bertac; `zoo` puts every method on one budget in one table
(repro/zoo.py). Every model is trained by the project's own entry points
(training/pretrain.py, glue/init_hire.py, glue/init_bertac.py, glue/run_glue.py, qa/run_qa.py), run as
subprocesses with their logs in OUTPUT_DIR/cache/. Work is cached: a pretraining export is keyed by a hash of its
flags and data and reused across seeds, experiments and reruns; each fine-tuning result is a JSON. A killed sweep
continues where it stopped (a killed pretraining resumes from its last checkpoint). Each run records the code it ran
and the content of the models it read: a run over a model that has changed since runs again, and runs from other code
are named stale in the report (`--rerun_stale` retrains them). A failed run is reported as failed with its log and
no score (not an earlier run's), the other arms still finish, and the command exits 1 naming what to do. Reports:
OUTPUT_DIR/<experiment>/<budget>/report.md, results.json, plot.png.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from encoder_zoo.repro.budgets import BUDGETS, OneLineParser, refuse_repeats, unit_seed
from encoder_zoo.repro.experiments import all_experiments
from encoder_zoo.repro.jobs import Sweep, start_helpers, stop_helpers
from encoder_zoo.repro.report import write_report, write_zoo_report
from encoder_zoo.repro.results import analyse
from encoder_zoo.repro.tasks import scored_tasks


def parse_args(argv):
    parser = OneLineParser(prog="run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", choices=[*sorted(all_experiments()), "zoo"],
                        help="A paper's comparison, or `zoo`: every method on one budget (repro/zoo.py).")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="smoke",
                        help="smoke: plumbing in minutes; cpu: under 2 hours per paper on 2 cores; adapt: each arm "
                        "continues the shipped MiniLM with its objective (spanbert, teams, zoo), under an hour; gpu: "
                        "one H100 (see repro/budgets.py).")
    parser.add_argument("--dataset", help="Pretraining corpus (pretrain.py --dataset); default: the embedded "
                                          "Wikipedia text. BERTAC's CNN keeps its enwiki excerpt.")
    parser.add_argument("--output_dir", default="runs/repro", help="Cache and reports (default: runs/repro).")
    parser.add_argument("--tasks", nargs="+", help="Restrict the evaluation tasks (default: the budget's).")
    parser.add_argument("--units", nargs="+", type=unit_seed, help="Unit seeds: one independently trained model per "
                        "arm and seed (pretraining or initialisation seed; default: the experiment's at this budget, "
                        "else the budget's).")
    parser.add_argument("--seeds", nargs="+", type=unit_seed, help="Fine-tuning seeds within each unit (default: the "
                        "budget's); unit u runs seed s as 100 u + s.")
    parser.add_argument("--bootstrap_seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="Runs side by side: this sweep and JOBS - 1 helper sweeps "
                        "of the same command on the same cache, each run with cores / JOBS torch threads (on 2 cores "
                        "`--jobs 2` did 1.35x the steps of one two-thread sweep); helpers log to "
                        "OUTPUT_DIR/cache/helper-<i>.log, and this process writes the report once every job is done.")
    parser.add_argument("--sweep_only", action="store_true", help="Run the sweep's jobs and write no report (what a "
                        "--jobs helper does; or one of several machines sharing OUTPUT_DIR).")
    parser.add_argument("--rerun_stale", action="store_true", help="Retrain the cached runs that ran other code than "
                        "this checkout's, or did not record theirs (the report names them as stale); by default they "
                        "are reused and the report says so.")
    args = parser.parse_args(argv)
    known = scored_tasks()
    unknown = set(args.tasks or []) - set(known)
    if unknown:
        parser.error(f"unknown task(s) {sorted(unknown)}: choose from {sorted(known)}")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more sweeps to run side by side")
    refuse_repeats(parser, args, ("units", "seeds"))
    try:  # a budget that continues a shipped encoder needs its package before any job
        BUDGETS[args.budget].starting_weights()
    except OSError as error:
        parser.error(f"--budget {args.budget}: {error}")
    return args


def run_experiment(experiment, budget, output_dir: Path, args, argv: list[str]) -> tuple[dict, list[Sweep]]:
    sweep = Sweep(experiment.at(budget, args.dataset, args.tasks, args.units), output_dir)
    sweep.run(output_dir / "cache" / "runs.jsonl", rerun_stale=args.rerun_stale)
    if args.sweep_only:
        return {}, [sweep]
    results = analyse(sweep, args.bootstrap_seed)
    folder = output_dir / args.experiment / budget.name
    write_report(results, sweep, folder, argv)
    print(f"Report: {folder / 'report.md'}")
    for control in results["control"].values():
        print(f"  control {control['arm']} vs {control['baseline']} on {control['task']}: {control['verdict']}")
    for claim in results["claims"]:
        print(f"  {claim['role']}: {claim['arm']} vs {claim['baseline']} on {claim['task']}: {claim['verdict']}")
    print(primary_line(results))
    return results, [sweep]


def primary_line(results: dict) -> str:
    """The closing line: the paper's primary claim, its difference and its verdict (or why it is not tested)."""
    from encoder_zoo.repro.tasks import shown_difference

    primary = results.get("primary")
    if not primary:
        return "Primary claim: none declared for this experiment."
    claim = next((c for c in results["claims"] if c.get("role") == "primary"), None)
    what = f"{primary['arm']} > {primary['baseline']} on {primary['task']}"
    if not primary["tested"] or claim is None:
        return f"Primary claim: {what}: not tested at this budget ({primary['why_not'] or 'no result'})."
    d = claim.get("decision") or {}
    difference = (f"{shown_difference(d['estimate'], d['low'], d['high'], claim['task'])} (90% CI), "
                  if d.get("estimate") is not None else "")
    return f"Primary claim: {what}: {difference}{claim['verdict']}."


def run_zoo(budget, output_dir: Path, args, argv: list[str]) -> tuple[dict, list[Sweep]]:
    """The zoo's two stages (repro/zoo.py): every method, then the fusions over the best encoder of the first."""
    from encoder_zoo.repro.zoo import analyse_zoo, best_encoder, zoo_experiment

    log = output_dir / "cache" / "runs.jsonl"
    stage_one = Sweep(zoo_experiment().at(budget, args.dataset, args.tasks, args.units), output_dir)
    stage_one.run(log, rerun_stale=args.rerun_stale)
    best = best_encoder(stage_one)
    sweep = Sweep(zoo_experiment(best).at(budget, args.dataset, args.tasks, args.units), output_dir)
    sweep.run(log, rerun_stale=args.rerun_stale)  # stage one's jobs are cached: only the fusions over `best` train
    if args.sweep_only:
        return {}, [stage_one, sweep]
    results = analyse_zoo(sweep, best, args.bootstrap_seed)
    folder = output_dir / "zoo" / budget.name
    write_zoo_report(results, sweep, folder, argv)
    print(f"Report: {folder / 'report.md'} (best encoder: {best})")
    print(shlex.join(["significant:", *(f"{p['better']}>{p['worse']}@{p['task']}" for p in results["pairs"]
                                         if p["significant"])]))
    return results, [stage_one, sweep]


def main(argv=None) -> dict:
    """Run the sweep and write its report; exits 1 (report written) when a run failed, naming each with its log and
    folder and what to do."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    budget = BUDGETS[args.budget]
    if args.seeds:
        import dataclasses

        budget = dataclasses.replace(budget, finetune_seeds=tuple(args.seeds))
    output_dir = Path(args.output_dir).resolve()
    helpers = start_helpers(Path(__file__).resolve(), argv, args.jobs, output_dir) if args.jobs > 1 else []
    finished = False
    try:  # this sweep's run returns once every job is done or failed (it waits for those a helper holds)
        if args.experiment == "zoo":
            results, sweeps = run_zoo(budget, output_dir, args, argv)
        else:
            results, sweeps = run_experiment(all_experiments()[args.experiment], budget, output_dir, args, argv)
        finished = True
    finally:
        stop_helpers(helpers, finished)
    failed = next((sweep for sweep in reversed(sweeps) if sweep.failed_jobs()), None)
    if failed is not None:  # the zoo's second sweep holds every job of the first
        print(failed.failure_advice(), file=sys.stderr)
        sys.exit(1)
    return results


if __name__ == "__main__":
    main()
