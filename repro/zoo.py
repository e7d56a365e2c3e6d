"""The zoo table: every method trained by the same code, on the same data and budget, evaluated by the same harness,
with its compute next to every score.

    python repro/run.py zoo --budget smoke|cpu|gpu [--output_dir runs/repro]

Two stages of one sweep (`repro.run.Sweep`, same cache as the papers' experiments):
1. the pretrained encoders (bert, bert_2seq_nsp, spanbert, electra, teams, cloze), each with its own recipe and warmup
   (the paper's run), and the two fusions over the embedded MiniLM (HIRE, BERTAC with the GAN CNN) as their papers'
   experiments train them; runs of the same flags and data that a paper's experiment already made are reused;
2. HIRE and BERTAC over the best encoder of stage 1 (highest mean over the GLUE-style tasks of the median over
   units): models no paper trained.
Every encoder, and every fusion over one, fine-tunes with one protocol (`PROTOCOL`); the fusions over MiniLM keep
their papers' presets. Pairwise differences: `repro.stats.decide`, two-sided at 5% (the better-looking arm tested at
2.5% one-sided), Holm across the pairs of each task.
"""

from __future__ import annotations

import itertools
import json
import math
import shlex
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

from encoder_zoo.repro.experiments import CNN_GAN, GLUE_TASKS, METRICS, Arm, Experiment

ENCODERS = {
    "bert": "BERT-1seq: subword MLM, single sequence",
    "bert_2seq_nsp": "BERT: subword MLM, two segments + NSP",
    "spanbert": "SpanBERT: span masking + SBO",
    "electra": "ELECTRA: replaced-token detection",
    "teams": "TEAMS: RTD + multi-word selection",
    "cloze": "two-tower cloze LM",
}
# Held-out MLM loss is comparable only between models predicting the same masked words with their own encoder:
# ELECTRA's and TEAMS's is their generator's, the cloze model has no masks.
HELDOUT_COMPARABLE = ("bert", "bert_2seq_nsp", "spanbert")
PROTOCOL = "teams_small"  # ELECTRA/TEAMS-Small fine-tuning: the one preset made for small encoders trained from scratch
TASKS = ("rotten_tomatoes", "movie_sentiment_regression", "wiki_cloze", "heldout_mlm")


def zoo_experiment(best: str | None = None) -> Experiment:
    arms = [Arm(name, description, pretrain=("--model", name)) for name, description in ENCODERS.items()]
    arms += [Arm("hire+minilm", "HIRE + fusion over the embedded MiniLM", init="hire", glue_preset="hire"),
             Arm("bertac+minilm", "BERTAC (GAN-style CNN + TIER) over the embedded MiniLM", init="bertac", cnn=CNN_GAN,
                 glue_preset="bertac")]
    if best:
        arms += [Arm(f"hire+{best}", f"HIRE + fusion over {best} (same unit)", init="hire", backbone_from=best),
                 Arm(f"bertac+{best}", f"BERTAC over {best} (same unit)", init="bertac", cnn=CNN_GAN,
                     backbone_from=best)]
    return Experiment(
        name="zoo", paper="every method of the zoo on one budget", arms=tuple(arms), baseline="bert", claims=(),
        tasks=TASKS, glue_preset=PROTOCOL, paper_table="", shared_warmup=False,
        notes=f"Encoders and the fusions over one fine-tune with one protocol (`--preset {PROTOCOL}`); the fusions "
              "over MiniLM with their papers' presets (`hire`, `bertac`), so that the papers' runs are reused.")


def best_encoder(sweep) -> str:
    """The encoder with the highest mean, over the GLUE-style tasks it has results on, of its median over units."""
    from encoder_zoo.repro.stats import unit_means

    def score(name):
        medians = []
        for task in (t for t in sweep.tasks if t in GLUE_TASKS):
            values = sweep.values(name, task)
            if values:
                medians.append(statistics.median(unit_means(values).values()))
        return sum(medians) / len(medians) if medians else -math.inf

    return max(ENCODERS, key=score)  # ties: the first in ENCODERS


# ----------------------------------------------------------------------------------------------------- compute
def pretraining_compute(job, budget) -> dict | None:
    """FLOPs (Trainer's total_flos: the bench's per-batch count where the recipe has one), tokens seen (non-padding,
    or steps x batch x length when the run did not count them) and wall time of one pretraining `job`, from its
    trainer_state.json. The time is `training_seconds`, which a run resumed after a kill keeps whole; where the
    intervals carry no token rate (the BERTAC CNN counts words), train_runtime, and no time for a resumed run."""
    from encoder_zoo.repro.sweep import training_seconds

    try:
        state = json.loads((job.folder / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    tokens = state.get("num_input_tokens_seen") or 0
    counted = bool(tokens)
    if not counted:
        tokens = state["global_step"] * state["train_batch_size"] * budget.max_seq_length
    seconds = training_seconds(state.get("log_history"))
    if seconds is None:
        resumed = job.log.exists() and any(line.startswith("$ ") and "--resume_from_checkpoint" in line for line in
                                           job.log.read_text(encoding="utf-8", errors="replace").splitlines())
        end = next((e for e in reversed(state["log_history"]) if "train_runtime" in e), None)
        seconds = end["train_runtime"] if end and not resumed else None
    return {"flops": float(state.get("total_flos") or 0.0), "tokens": int(tokens), "tokens_counted": counted,
            "seconds": seconds, "tokens_per_second": tokens / seconds if seconds else None}


def unit_compute(sweep, arm: Arm, unit: int) -> dict:
    """The pretraining compute behind one unit of `arm`: its own pretraining, or its backbone's and its CNN's; the
    MiniLM's pretraining is not ours and is left out (None)."""
    parts = []
    if arm.pretrain or arm.backbone_from:
        source = arm if arm.pretrain else sweep.experiment.arm(arm.backbone_from)
        parts.append(sweep.encoder_job(source, unit))
    if arm.cnn is not None:
        parts.append(sweep.pretrain_job(arm, [*sweep.budget.cnn_flags(), *arm.cnn], unit, "cnn"))
    measured = [pretraining_compute(job, sweep.budget) for job in parts]
    if not parts or any(m is None for m in measured):
        return {"flops": None, "tokens": None, "seconds": None, "tokens_per_second": None,
                "runs": [job.folder.name for job in parts], "includes_minilm": not arm.pretrain and not arm.backbone_from}
    main = measured[0]
    timed = all(m["seconds"] is not None for m in measured)
    return {"flops": sum(m["flops"] for m in measured), "tokens": main["tokens"], "tokens_counted": main["tokens_counted"],
            "seconds": sum(m["seconds"] for m in measured) if timed else None,
            "tokens_per_second": main["tokens_per_second"],
            "runs": [job.folder.name for job in parts], "includes_minilm": not arm.pretrain and not arm.backbone_from}


# ----------------------------------------------------------------------------------------------------- analysis
def analyse_zoo(sweep, best: str, seed: int) -> dict:
    from encoder_zoo.repro.sweep import chance_level, describe_arms
    from encoder_zoo.repro.stats import REPRODUCED, decide_family, unit_means

    experiment = sweep.experiment
    chance = {task: chance_level(task, sweep.budget) for task in sweep.tasks}
    arms, runs = describe_arms(sweep, seed, chance)
    for arm in experiment.arms:
        if "heldout_mlm" in arms[arm.name]["tasks"] and arm.name not in HELDOUT_COMPARABLE:
            del arms[arm.name]["tasks"]["heldout_mlm"]  # not comparable (HELDOUT_COMPARABLE)
        compute = [unit_compute(sweep, arm, unit) for unit in sweep.budget.unit_seeds]
        arms[arm.name]["compute"] = {str(u): c for u, c in zip(sweep.budget.unit_seeds, compute)}
    pairs = []
    for task in sweep.tasks:
        metric = METRICS[task]
        names = [a.name for a in experiment.arms if task in arms[a.name]["tasks"]]
        family = []
        for a, b in itertools.combinations(names, 2):
            means = {n: sum(unit_means(runs[(n, task)]).values()) / arms[n]["tasks"][task]["n_units"] for n in (a, b)}
            better, worse = (a, b) if (means[a] >= means[b]) == metric.higher_is_better else (b, a)
            learned = chance[task] is None or bool(arms[a]["tasks"][task]["above_chance"]
                                                   or arms[b]["tasks"][task]["above_chance"])
            family.append(({"task": task, "better": better, "worse": worse},
                           {"arm": runs[(better, task)], "baseline": runs[(worse, task)], "direction": "better",
                            "higher_is_better": metric.higher_is_better, "learned": learned}))
        for (entry, _), decision in zip(family, decide_family([f[1] for f in family], alpha=0.025)):
            pairs.append({**entry, "significant": decision["verdict"] == REPRODUCED, "decision": decision})
    return {"experiment": "zoo", "budget": asdict(sweep.budget), "tasks": list(sweep.tasks),
            "best_encoder": best, "protocol": PROTOCOL, "bootstrap_seed": seed, "chance": chance,
            "schedules": sweep.schedules(), "arms": arms, "pairs": pairs}


# ------------------------------------------------------------------------------------------------------- report
def fmt_flops(x) -> str:
    return "—" if not x else f"{x:.3g}"


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# What a row of `score_table` holds: the report and README's table say it in these words.
TABLE_KEY = ("Score: median over units [95% bootstrap interval] (units). Compute: median over units of the pretraining "
             "behind the model (for a fusion: its encoder's and its CNN's); the MiniLM's own pretraining is not ours "
             "and not counted (—).")


def score_table(results: dict) -> list[str]:
    """One row per method: each task's median over units [95% bootstrap interval] (units), then the median over units
    of its pretraining FLOPs, tokens seen, tokens/s and time; a last row with each task's chance level. The report's
    table and README's (`repro/summary.py`)."""
    from encoder_zoo.repro.sweep import score_cell

    tasks = results["tasks"]
    lines = ["| method | " + " | ".join(METRICS[t].label for t in tasks)
             + " | pretraining FLOPs | tokens seen | tokens/s | pretraining time (s) |",
             "| --- |" + " --- |" * (len(tasks) + 4)]
    for name, arm in results["arms"].items():
        cells = [score_cell(arm, task) for task in tasks]
        compute = list(arm["compute"].values())
        flops, tokens = median([c["flops"] for c in compute]), median([c["tokens"] for c in compute])
        speed, seconds = median([c["tokens_per_second"] for c in compute]), median([c["seconds"] for c in compute])
        minilm = " + MiniLM" if compute and compute[0]["includes_minilm"] else ""
        timed = sum(c["seconds"] is not None for c in compute)
        of = f" ({timed} of {len(compute)} units)" if 0 < timed < sum(c["flops"] is not None for c in compute) else ""
        cells += [fmt_flops(flops) + minilm, f"{tokens:,.0f}" if tokens else "—",
                  f"{speed:,.0f}{of}" if speed else "—", f"{seconds:.0f}{of}" if seconds else "—"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| chance | " + " | ".join("—" if results["chance"].get(t) is None else f"{results['chance'][t]:.4g}"
                                             for t in tasks) + " | | | | |")
    return lines


def write_zoo_report(results: dict, sweep, folder: Path, argv: list[str]) -> None:
    from encoder_zoo.repro.sweep import REPO, command_block, git_commit, machine, relative

    budget, output_dir = sweep.budget, sweep.cache.parent
    folder.mkdir(parents=True, exist_ok=True)
    results = {**results, "command": relative([sys.executable, str(REPO / "repro" / "run.py"), *argv], output_dir),
               "commit": git_commit(), "machine": machine(sweep.run_threads()), "run_seconds": sweep.run_seconds(),
               "wall_seconds": sweep.wall_seconds(),
               "commands": [{"run": j.name, "status": j.status, "folder": j.folder.name,
                             "command": relative(j.command, output_dir)} for j in sweep.jobs]}
    (folder / "results.json").write_text(json.dumps(results, indent=2))
    plot_zoo(results, sweep, folder / "plot.png")
    tasks = list(sweep.tasks)
    lines = [f"# The zoo at the `{budget.name}` budget", "", f"**Budget:** {budget.description}.", "",
             f"Every method trained by this repository's code on the same data, steps and batch; units: "
             f"{len(budget.unit_seeds)} independently trained models per method (seeds {list(budget.unit_seeds)}). "
             f"Best encoder of stage 1 (fusions built over it): **{results['best_encoder']}**.", "",
             "## Scores and compute", "",
             f"{TABLE_KEY} Time: the sum of the run's logged intervals (each interval's tokens over its tokens/s), "
             "which a run resumed after a kill keeps; tokens/s: tokens seen over that time.", "",
             *score_table(results)]
    lines += ["", "![score against pretraining FLOPs](plot.png)", "", "## Significant differences", "",
              "Every pair of methods on each task: `repro.stats.decide` on unit means (paired by seed), two-sided at "
              "5%, Holm-adjusted across the pairs of the task. Where neither arm is above chance, no difference "
              "counts.", ""]
    for task in tasks:
        found = [p for p in results["pairs"] if p["task"] == task and p["significant"]]
        tested = sum(p["task"] == task for p in results["pairs"])
        lines.append(f"- **{METRICS[task].label}** ({tested} pairs): " + (", ".join(
            f"{p['better']} > {p['worse']} ({p['decision']['estimate']:+.3g}, p {p['decision']['p_value']:.3g})"
            for p in found) or "no significant difference") + ".")
    lines += ["", "## What this can and cannot say", "",
              "Tiny models pretrained for minutes rank methods at tiny scale only: a difference here is real for this "
              "budget, and the absence of one says nothing of the papers' scale. Compute differs per method (TEAMS "
              "and ELECTRA run a generator, the cloze model two towers): read each score next to its FLOPs.", "",
              "## How this was run", "", f"- Command: `{results['command']}`", f"- Commit: `{results['commit']}`",
              f"- Machine: {results['machine']}",
              f"- Time: {results['wall_seconds'] / 60:.0f} minutes of wall clock with at least one run going, "
              f"{results['run_seconds'] / 60:.0f} minutes of runs added up", "",
              "Every subprocess from the repository root; a folder name carries its flags' hash, and `cached` in "
              "results.json marks a run reused from an earlier sweep:", "", "```"]
    lines += command_block([c["command"] for c in results["commands"]])
    (folder / "report.md").write_text("\n".join(lines))


def plot_zoo(results: dict, sweep, path: Path) -> None:
    """Score against pretraining FLOPs, one panel per task: every unit's point, a marker per method. Fusions over
    MiniLM have no FLOPs of ours and are left out of the plot (the table lists them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(sweep.tasks)
    figure, axes = plt.subplots(1, len(tasks), figsize=(max(6, 4.2 * len(tasks)), 4), squeeze=False)
    markers = itertools.cycle("os^vDP*Xhp")
    style = {name: (f"C{i}", next(markers)) for i, name in enumerate(results["arms"])}
    for ax, task in zip(axes[0], tasks):
        for name, arm in results["arms"].items():
            r = arm["tasks"].get(task)
            if not r:
                continue
            points = [(arm["compute"][unit]["flops"], value) for unit, value in r["units"].items()
                      if arm["compute"].get(unit, {}).get("flops")]
            if points:
                color, marker = style[name]
                ax.scatter(*zip(*points), color=color, marker=marker, s=26, label=name, alpha=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("pretraining FLOPs", fontsize=8)
        ax.set_title(METRICS[task].label, fontsize=9)
        if results["chance"].get(task) is not None:
            ax.axhline(results["chance"][task], color="red", linestyle=":", linewidth=1)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5) or 1, fontsize=7)
    figure.suptitle(f"zoo, {sweep.budget.name} budget: every unit's score against its pretraining FLOPs (chance "
                    "dotted red)", fontsize=9)
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)


# --------------------------------------------------------------------------------------------------------- main
def run_zoo(budget, output_dir: Path, dataset: str | None, tasks, seed: int, argv: list[str],
            report: bool = True) -> dict:
    from encoder_zoo.repro.sweep import Sweep

    log = output_dir / "cache" / "runs.jsonl"
    stage_one = Sweep(zoo_experiment(), budget, output_dir, dataset, tasks)
    stage_one.run(log)
    best = best_encoder(stage_one)
    sweep = Sweep(zoo_experiment(best), budget, output_dir, dataset, tasks)
    sweep.run(log)  # stage one's jobs are cached: only the fusions over `best` train
    if not report:
        return {}
    results = analyse_zoo(sweep, best, seed)
    folder = output_dir / "zoo" / budget.name
    write_zoo_report(results, sweep, folder, argv)
    print(f"Report: {folder / 'report.md'} (best encoder: {best})")
    print(shlex.join(["significant:", *(f"{p['better']}>{p['worse']}@{p['task']}" for p in results["pairs"]
                                         if p["significant"])]))
    return results
