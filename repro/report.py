"""The reports a sweep writes into its folder: report.md, results.json and plot.png, for a paper's experiment
(`write_report`) and for the zoo (`write_zoo_report`); and the zoo's score table, which README shows too
(`score_table`, read by `repro/summary.py`). Commands are written as a reader runs them, from the repository root
with no path of the machine that ran them (`relative`)."""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
from pathlib import Path

from encoder_zoo.repro.budgets import arm_label
from encoder_zoo.repro.provenance import CODE_HASH_MEANING, REPO, git_commit, machine
from encoder_zoo.repro.results import (
    code_of_runs,
    run_seconds,
    run_threads,
    score_cell,
    score_key,
    wall_seconds,
)
from encoder_zoo.repro.tasks import FLOOR_NAMES, shown, shown_difference, significant, task_facts

# Shell variables the report's commands use for paths that differ between machines (defined above its commands).
MINILM_VARIABLE = 'MINILM=$(python -c "from encoder_zoo.training.run import minilm_path; print(minilm_path())")'
# The one scale of every score, difference, interval, MDD and floor the reports and README show (`display_scale`).
SCALE_KEY = ("Scores and floors in percent points (0-100: accuracy, F1 and Pearson x 100, as GLUE and SQuAD print "
             "them), held-out token-prediction losses (MLM, cloze, bilm) in nats")
COMPUTE_KEY = ("Compute: median over units of the pretraining behind the model (for a fusion: its encoder's and its "
               "CNN's); the MiniLM's own pretraining is not ours and not counted (—)")


def table_key(results: dict) -> str:
    """What a row of `score_table` holds, in the words of the results it comes from: the report and README's table
    say it in these words."""
    control = "; the positive control has none (0)" if results.get("control") else ""
    return f"Score: {score_key(results)}. {SCALE_KEY}. {COMPUTE_KEY}{control}."


PAPER_SCALE = ("The paper's scores are percent points (accuracy, F1, EM, Pearson and MCC x 100, as GLUE and SQuAD "
               "print them); ours below are on the same scale.")
def verdict_key_text() -> str:
    """The reports' key to their verdicts: the test, the gates, the MDD and one line per verdict word
    (`repro.stats.VERDICT_WORDS`, the vocabulary README's table states too)."""
    from encoder_zoo.repro.stats import NO_CONTROL, NO_SIGNAL, verdict_key

    return (
        "Difference = arm − baseline in percent points, mean over units paired by seed, with its two-sided 90% t "
        "interval (unadjusted; its ends are the one-sided 95% bounds of a test at 5%), to 3 significant digits. "
        "Verdict: a one-sided t-test on unit means (`repro.stats.decide`). The **primary** claim is tested alone at "
        "5%; the **secondary** claims form one family, their p-values Holm-adjusted across claims and tasks. Every "
        "claim is judged only where the positive control (pretrained > random, below) reads *reproduced* on its task: "
        f"elsewhere it reads *{NO_CONTROL}*. Where neither arm clears its floor (its 95% interval wholly above the "
        f"higher of chance and the task's trivial model), it reads *{NO_SIGNAL}*, unless the arm is significantly "
        "worse (*opposite*). Where both arms score the same on every unit, *indistinguishable*, with the share of "
        "evaluation rows on which their predictions differ. MDD: the true difference the test finds 80% of the time "
        "with these units and the observed unit spread, at the level the verdict uses (5% for the primary; 5% / m, "
        "Holm's first step, for m secondary claims). Where every unit differs by the same amount (no spread) the "
        "p-value is the exact permutation test's and the MDD is —. FLOPs ratio: the arm's pretraining FLOPs over the "
        "baseline's (median over units; tokens seen beside it where they differ); the claim says what it holds equal "
        f"instead. Verdicts: {verdict_key()}")


# ------------------------------------------------------------------------------------------------------ helpers
def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def row(cells: list[str]) -> str:
    """A Markdown table row; an empty cell is written `| |`."""
    return "|" + "".join(f" {cell} |" if cell else " |" for cell in cells)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [row(header), "|" + " --- |" * len(header), *(row(cells) for cells in rows)]


def relative(command: list[str], output_dir: Path) -> str:
    """A command as a reader of the report runs it: from the repository root, `python`, the sweep's folder relative to
    the root (or $OUTPUT_DIR when it lies elsewhere), the embedded MiniLM as $MINILM; no path of the machine that
    ran it."""
    from encoder_zoo.training.run import minilm_path

    places = [(Path(minilm_path()), "$MINILM"), (output_dir, os.path.relpath(output_dir, REPO)
                                                 if output_dir.is_relative_to(REPO) else "$OUTPUT_DIR"), (REPO, "")]

    def shown(part: str) -> str:
        if part == sys.executable:
            return "python"
        for root, name in places:
            try:
                rest = Path(part).relative_to(root)
            except ValueError:
                continue
            text = str(Path(name) / rest) if name else str(rest)
            return text.rstrip("/.") if text.endswith("/.") else text
        return shlex.quote(part)

    return " ".join(shown(part) for part in command)


def command_block(commands: list[str]) -> list[str]:
    """A report's fenced block of `relative` commands, preceded by the shell variables they use."""
    lines = []
    if any("$OUTPUT_DIR" in c for c in commands):
        lines.append("OUTPUT_DIR=...  # the sweep's --output_dir")
    if any("$MINILM" in c for c in commands):
        lines.append(MINILM_VARIABLE)
    return [*lines, *commands, "```", ""]


# ---------------------------------------------------------------------------------------------- how it was run
def with_provenance(results: dict, sweep, argv: list[str], zoo: bool = False) -> dict:
    """`results` with how they were made: the command, commit, machine, the code the runs ran (`code_of_runs`),
    their time, and every job's command (the zoo's with its folder, a paper's with its log)."""
    output_dir = sweep.cache.parent
    commands = [{"run": j.name, "status": j.status, **({"folder": j.folder.name} if zoo else {}),
                 "command": relative(j.command, output_dir),
                 **({} if zoo else {"log": relative([str(j.log)], output_dir)})} for j in sweep.jobs]
    return {**results, "command": relative([sys.executable, str(REPO / "repro" / "run.py"), *argv], output_dir),
            "commit": git_commit(), "machine": machine(run_threads(sweep)), "code": code_of_runs(sweep),
            "commands": commands, "run_seconds": run_seconds(sweep), "wall_seconds": wall_seconds(sweep)}


def code_line(code: dict) -> str:
    """The header's line on the code the runs ran, naming the stale ones (`--rerun_stale` retrains them)."""
    current, runs = code["current"], sum(code["runs"].values())
    if not runs:
        return f"**Code:** no run finished; this checkout's code is `{current}` ({CODE_HASH_MEANING})."
    if not code["stale"] and not code["unknown"]:
        return f"**Code:** every run ran this checkout's code, `{current}` ({CODE_HASH_MEANING})."
    other = {h: n for h, n in code["runs"].items() if h not in (current, "unknown")}
    stale = [f"{sum(other.values())} ran other code ({', '.join(f'`{h}` x{n}' for h, n in other.items())})"] * bool(
        other) + [f"{len(code['unknown'])} did not record their code (cached before runs did)"] * bool(code["unknown"])
    return (f"**Code:** {code['runs'].get(current, 0)} of {runs} runs ran this checkout's code, `{current}` "
            f"({CODE_HASH_MEANING}). **Stale:** {' and '.join(stale)}; `--rerun_stale` retrains them (listed in "
            "results.json under `code`).")


def time_line(results: dict, zoo: bool = False) -> str:
    if zoo:
        return (f"- Time: {results['wall_seconds'] / 60:.0f} minutes of wall clock with at least one run going, "
                f"{results['run_seconds'] / 60:.0f} minutes of runs added up")
    return (f"- Time: {results['wall_seconds'] / 60:.0f} minutes of wall clock with at least one run going (sweeps "
            f"sharing the cache counted once, gaps between sittings not at all); {results['run_seconds'] / 60:.0f} "
            "minutes of runs added up (every job's last successful run, from the cache's runs.jsonl; cached jobs "
            "count with the time they took when they ran; a pretraining resumed after a kill with its logged "
            "training intervals, the killed part's included)")


def save(results: dict, lines: list[str], folder: Path) -> None:
    (folder / "results.json").write_text(json.dumps(results, indent=2))
    (folder / "report.md").write_text("\n".join(lines))


# ------------------------------------------------------------------------------------------ a paper's report
def write_report(results: dict, sweep, folder: Path, argv: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    render_report(with_provenance(results, sweep, argv), sweep, folder)


def trains_cnn(sweep) -> bool:
    """Whether the sweep pretrains BERTAC's CNN (its budget line then says how: `Budget.description_for`)."""
    return any(arm.cnn is not None for arm in sweep.arms)


def render_report(results: dict, sweep, folder: Path) -> None:
    """A paper's report.md, plot.png and results.json from its results (with their provenance) and its sweep's
    setting: what a finished sweep writes, and what `repro/summary.py --rerender` writes again from a committed
    results.json, training nothing."""
    from encoder_zoo.repro.plots import plot

    plot(results, sweep, folder / "plot.png")
    experiment, budget = sweep.experiment, sweep.budget
    lines = [f"# {experiment.name} at the `{budget.name}` budget", "",
             f"**Paper:** {experiment.paper}. **Budget:** {budget.description_for(trains_cnn(sweep))}.", "",
             *([f"**What this tests:** {budget.tests_what}.", ""] if budget.tests_what else []),
             code_line(results["code"]), "",
             "## The paper's numbers", "", "```", experiment.paper_table, "```", "", PAPER_SCALE, "",
             *primary_line(results), *since_section(results), *scores_section(results, sweep),
             *verdicts_section(results, sweep),
             *failures_section(results, sweep),
             *schedules_section(results, sweep), "## Notes", "", experiment.notes or "—", "",
             *how_run_section(results, sweep)]
    save(results, lines, folder)


def floor_table_rows(results: dict, tasks: list[str], width: int = 0) -> list[list[str]]:
    """The floors' rows of a score table: chance, then each trivial model (bag-of-words per set of training rows,
    trivial answer, unigram and bigram per tokenizer), one row per kind and rows with each task's value; `width`
    empty cells after them."""
    floors = results.get("floors")
    if floors is None:  # a report written before floors: chance only
        return [["chance (a model that learned nothing)", *(shown(results["chance"].get(t), t) for t in tasks),
                 *[""] * width]]
    labels: dict[str, dict] = {}
    for task in tasks:
        kinds = {floor["kind"] for floor in floors.get(task, [])}
        missing = [{"kind": "bigram", "value": None}] if "unigram" in kinds and "bigram" not in kinds else []
        for floor in [*floors.get(task, []), *missing]:  # a report from before the bigram floor: its row reads —
            label = floor_label(floor)
            labels.setdefault(label, {})
            previous = labels[label].get(task)
            value = shown(floor["value"], task)
            labels[label][task] = value if previous in (None, value) else f"{previous}; {value}"
    return [[label, *(cells.get(t, "—") for t in tasks), *[""] * width] for label, cells in labels.items()]


def floor_label(floor: dict) -> str:
    name = FLOOR_NAMES.get(floor["kind"], floor["kind"])
    if floor["kind"] == "chance":
        return "floor: chance (one constant answer)"
    if floor["kind"] == "bag_of_words" and floor.get("rows"):
        return f"floor: {name} ({floor['rows']:,} training rows)"
    if floor["kind"] == "unigram":
        return "floor: unigram loss (same tokenizer and documents)"
    if floor["kind"] == "bigram":
        return "floor: bigram loss from both neighbours (same tokenizer and documents; shown, not gated)"
    return f"floor: {name}"


def scores_section(results: dict, sweep) -> list[str]:
    budget, baseline = sweep.budget, sweep.experiment.baseline
    rows = [[f"{arm_label(name, results)}{' (baseline)' if name == baseline else ''}",
             *(score_cell(arm, t) for t in sweep.tasks)] for name, arm in results["arms"].items()]
    rows += floor_table_rows(results, sweep.tasks)
    described = sorted({f"{floor_label(f)}: {f['description']}" for t in sweep.tasks
                        for f in results["floors"].get(t, []) if f["kind"] != "chance"})
    return ["## Ours: mean over units [95% t interval] (units)", "",
            f"A unit is one independently trained model (seeds {results['units']}: pretraining seed, or the seed of a "
            f"fusion's new layers, or a fixed backbone's fine-tuning seed, or the positive control's initialisation "
            f"seed); its score is the mean over its {len(budget.finetune_seeds)} fine-tuning run(s). The interval is "
            "the t interval of the mean over unit means. * marks an arm whose interval does not lie wholly above its "
            "floor (the higher of chance and the task's trivial model, fitted on the same training rows and scored "
            f"on the same evaluation rows; repro/floors.py). {SCALE_KEY}.", "",
            *table(["arm", *(task_facts(t).description for t in sweep.tasks)], rows), "",
            *(f"- {line}" for line in described), *([""] if described else []), "![plot](plot.png)", ""]


def decision_cells(d: dict | None, task: str) -> list[str]:
    """difference [90% CI], units, p, MDD (at α); the difference, its interval and the MDD on `task`'s scale."""
    if not d:
        return ["—"] * 4
    mdd = "—" if d["mdd"] is None else f"{significant(d['mdd'], task)} (α {d['mdd_alpha']:.3g})"
    return [shown_difference(d["estimate"], d["low"], d["high"], task),
            f"{d['units']['arm']}/{d['units']['baseline']}{' paired' if d['paired'] else ''}", fmt(d["p_value"]), mdd]


def verdict_text(entry: dict) -> str:
    from encoder_zoo.repro.stats import INDISTINGUISHABLE, NO_CONTROL, NO_SIGNAL

    d, verdict = entry.get("decision"), entry["verdict"]
    text = verdict + (f" ({d['reason']})" if d and d.get("reason") and d["reason"] not in verdict
                      and verdict not in (NO_SIGNAL, NO_CONTROL) else "")
    if verdict == INDISTINGUISHABLE and d:
        text += "; " + difference_text(d.get("prediction_difference"))
    return f"**{text}**"


def difference_text(difference: dict | None) -> str:
    if not difference or difference.get("fraction") is None:
        return "predictions not recorded (" + ((difference or {}).get("reason") or "none") + ")"
    return (f"predictions differ on {100 * difference['fraction']:.1f}% of {difference['rows']:,} evaluation rows "
            f"({difference['pairs']} paired runs)")


def ratio_cell(claim: dict) -> str:
    flops, tokens = claim.get("flops_ratio"), claim.get("tokens_ratio")
    if flops is None:
        return "—"
    return f"{flops:.2f}x" + (f" (tokens {tokens:.2f}x)" if tokens and abs(tokens - 1) > 0.005 else "")


def claim_row(claim: dict, results: dict) -> list[str]:
    what = (f"{arm_label(claim['arm'], results)} {'>' if claim['direction'] == 'better' else '≤'} "
            f"{arm_label(claim['baseline'], results)} ({claim['source']})")
    if claim.get("margin") is not None:
        what += f"; margin {shown(claim['margin'], claim['task'])}"
    if claim.get("compares_at"):
        what += f"; at {claim['compares_at']}"
    return [claim.get("role", "—"), what, task_facts(claim["task"]).description,
            *decision_cells(claim.get("decision"), claim["task"]),
            ratio_cell(claim), verdict_text(claim)]


def control_section(results: dict) -> list[str]:
    from encoder_zoo.repro.stats import NO_CONTROL

    control = results.get("control") or {}
    if not control:
        return []
    lines = ["## Positive control: pretrained > random", "",
             "The same model as the source arm, re-created from its config at random initialisation (seed: the unit; "
             "repro/random_init.py) and fine-tuned exactly as that arm, against the pretrained one: a one-sided t-test "
             "on unit means at 5%, alone. Where it is not *reproduced*, this budget cannot show what pretraining does "
             f"on that task, and every claim there reads *{NO_CONTROL}*. A pretrained model significantly below its "
             "random start reads *opposite*, at every budget.", ""]
    lines += [control_line("pretrained > random", task, entry, results) for task, entry in control.items()]
    return [*lines, "", *adaptation_section(results)]


def control_line(label: str, task: str, entry: dict, results: dict) -> str:
    """One control's line on one task: its difference, interval, MDD, p and units, and its verdict."""
    d = entry.get("decision")
    numbers = (f"difference {shown_difference(d['estimate'], d['low'], d['high'], task)} (90% CI), "
               f"MDD {decision_cells(d, task)[3]}, p {fmt(d['p_value'])}, "
               f"{d['units']['arm']}/{d['units']['baseline']} units; " if d else "")
    return (f"- **{label}** on {task_facts(task).description} ({arm_label(entry['arm'], results)} > "
            f"{arm_label(entry['baseline'], results)}): "
            f"{numbers}{verdict_text(entry)}")


def adaptation_section(results: dict) -> list[str]:
    """The second control of a continued-pretraining budget: adapted > not adapted."""
    from encoder_zoo.repro.stats import ADAPTATION_REASON, NO_CONTROL, NOT_REPRODUCED, OPPOSITE, no_adaptation

    adaptation = results.get("adaptation_control") or {}
    if not adaptation:
        return []
    lines = ["## Adaptation control: adapted > not adapted", "",
             "The same encoder continued with plain MLM on the same text for the same steps, against it fine-tuned "
             "directly, both fine-tuned alike: a one-sided t-test on unit means at 5%, alone. Claims are judged only "
             "where this control and the positive control both read *reproduced*. Where the positive control does "
             f"not, they read *{NO_CONTROL}*; where this control alone does not, "
             f"they name it, *{no_adaptation(OPPOSITE)}* (or *{no_adaptation(NOT_REPRODUCED)}*): the budget detects "
             "pretraining but "
             f"cannot credit an objective as a continued-pretraining step, as {ADAPTATION_REASON}.", ""]
    lines += [control_line("adapted > not adapted", task, entry, results) for task, entry in adaptation.items()]
    return [*lines, ""]


def primary_line(results: dict) -> list[str]:
    primary = results.get("primary")
    if not primary:
        return []
    claim = next((c for c in results["claims"] if c.get("role") == "primary"), None)
    task = task_facts(primary["task"]).description
    if not primary["tested"] or claim is None:
        return [f"**Primary claim:** {arm_label(primary['arm'], results)} > "
                f"{arm_label(primary['baseline'], results)} on {task} ({primary['source']}): not tested at this "
                f"budget ({primary['why_not'] or 'no result'}).", ""]
    d = claim.get("decision") or {}
    units = f"{d['units']['arm']}/{d['units']['baseline']} units" if d else "no units"
    return [f"**Primary claim**, tested alone at 5% with {units}: {arm_label(primary['arm'], results)} > "
            f"{arm_label(primary['baseline'], results)} on "
            f"{task} ({primary['source']}): {verdict_text(claim)}.", ""]


def since_section(results: dict) -> list[str]:
    """What changed since the report this one replaced (`results["previous"]`, stored by `repro/summary.py --since`):
    per positive control and claim, the difference and verdict before and now and what changed
    (`repro.changes.changes`); nothing for a report without a previous one."""
    from encoder_zoo.repro.changes import changes, difference

    previous = results.get("previous")
    if not previous:
        return []

    def cell(entry: dict | None, task: str) -> str:
        return "—" if entry is None else f"{difference(entry, task)}, {entry['verdict']}"

    rows = [[change["role"] or "—", f"{arm_label(change['arm'], results)} vs {arm_label(change['baseline'], results)}",
             task_facts(change["task"]).description if change["task"] else "—", cell(change["before"], change["task"]),
             cell(change["now"], change["task"]), change["why"]] for change in changes(previous, results)]
    ran_at = previous.get("ran_at") or previous.get("commit") or "unknown"
    commit = ran_at[:7] + (" (with uncommitted changes)" if "uncommitted" in ran_at else "")
    read_from = (previous.get("commit") or "")[:7]
    kept = f", kept in the repository at `{read_from}`" if read_from and read_from != ran_at[:7] else ""
    because = (previous.get("because") or "").rstrip(". ")
    return ["## Since the previous report", "",
            f"This report replaces the one run at commit `{commit}` (code `{previous.get('code') or 'unknown'}`"
            f"{kept}), rerun "
            f"because {because or 'no reason given'}. Differences and floors on the tables' scale (percent points; a "
            "held-out loss in nats); what changed is composed from the two results (`repro/changes.py`).", "",
            *table(["role", "claim", "task", "before: difference [90% CI], verdict",
                    "now: difference [90% CI], verdict", "what changed"], rows), ""]


def verdicts_section(results: dict, sweep) -> list[str]:
    lines = ["## Verdicts", "", verdict_key_text(), "",
             *table(["role", "claim", "task", "difference, points [90% CI]", "units",
                     "p (primary: alone; secondary: Holm)", "MDD (α)", "FLOPs ratio", "verdict"],
                   [claim_row(claim, results) for claim in results["claims"]]), ""]
    margins = {c["margin_source"] for c in results["claims"] if c.get("margin_source")}
    lines += [f"Margin: {m}." for m in sorted(margins)]
    if results["untested_tasks"]:
        lines += ["", f"Not tested at this budget: the claims on {', '.join(results['untested_tasks'])} (this report "
                  f"evaluates {', '.join(sweep.tasks)}; see the notes)."]
    if results["untested_claims"]:
        lines += ["", f"Not tested at this budget (their arms are not trained; see the notes): "
                  f"{'; '.join(c['source'] for c in results['untested_claims'])}."]
    return [*lines, "", *control_section(results)]


def failures_section(results: dict, sweep) -> list[str]:
    from encoder_zoo.repro.jobs import FLOOR_ARM
    from encoder_zoo.repro.results import failures

    failed = [f for arm in results["arms"].values() for f in arm["failed"]] + failures(sweep, FLOOR_ARM)
    output_dir = sweep.cache.parent
    refused = " (refused its input: change the flag or file its log's last line names)"
    return ["", "## Failed runs", "", *(f"- {f['run']}: {f['status']}{refused if f.get('refused') else ''} — log "
                                        f"`{relative([f['log']], output_dir)}`" for f in failed), "",
            "Their scores are left out (never an earlier run's). A run that refused its input fails the same way "
            "until the flag or file it names changes; for any other, fix what the log names and run the same "
            "command again; a run that fails on its own cached files starts over once its folder (the log's) is "
            "deleted, and `--rerun_stale` retrains runs cached by other code."] if failed else []


def schedules_section(results: dict, sweep) -> list[str]:
    schedules, budget = results["schedules"], sweep.budget
    if not schedules:
        return [""]
    shapes = {v["lr_scheduler_type"] for v in schedules.values()}
    return ["", "## Schedules", "", f"Every pretrained arm warms up for {sweep.warmup_steps} of "
            f"{budget.pretrain_steps} steps (the `{sweep.experiment.schedule_arm().name}` recipe's rule at this "
            "length)." + ("" if len(shapes) == 1 else " Their schedule shapes differ (each its paper's): "
                          + ", ".join(f"{k} {v['lr_scheduler_type']}" for k, v in schedules.items()) + "."), "",
            *table(["arm", "schedule", "peak learning rate", "warmup steps"],
                   [[arm_label(k, results), v["lr_scheduler_type"], f"{v['learning_rate']:g}", str(v["warmup_steps"])]
                    for k, v in schedules.items()]), ""]


def how_run_section(results: dict, sweep) -> list[str]:
    return ["## How this was run", "", f"- Command: `{results['command']}`", f"- Commit: `{results['commit']}`",
            f"- Machine: {results['machine']}", time_line(results),
            f"- Budget preset: `{json.dumps(results['budget'])}`",
            "", f"Every subprocess (cached ones included), from the repository root ({len(sweep.units)} "
            "units per arm):", "", "```", *command_block([c["command"] for c in results["commands"]])]


# ------------------------------------------------------------------------------------------ the zoo's report
def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def compute_cells(compute: list[dict]) -> list[str]:
    """A method's pretraining FLOPs, tokens seen, tokens/s and time: the median over its units."""
    flops, tokens = median([c["flops"] for c in compute]), median([c["tokens"] for c in compute])
    speed, seconds = median([c["tokens_per_second"] for c in compute]), median([c["seconds"] for c in compute])
    minilm = " + MiniLM" if compute and compute[0]["includes_minilm"] else ""
    timed = sum(c["seconds"] is not None for c in compute)
    of = f" ({timed} of {len(compute)} units)" if 0 < timed < sum(c["flops"] is not None for c in compute) else ""
    return [("—" if not flops else f"{flops:.3g}") + minilm, f"{tokens:,.0f}" if tokens else "—",
            f"{speed:,.0f}{of}" if speed else "—", f"{seconds:.0f}{of}" if seconds else "—"]


def score_table(results: dict) -> list[str]:
    """One row per method: each task's score cell (`score_cell`), then the median over units of its pretraining FLOPs,
    tokens seen, tokens/s and time; then the floors (chance, the trivial models). The report's table and README's
    (`repro/summary.py`). A task no method scored (the held-out cloze loss where no two-tower model runs) gets no
    column."""
    tasks = [task for task in results["tasks"] if any(arm["tasks"].get(task) for arm in results["arms"].values())]
    rows = [[arm_label(name, results), *(score_cell(arm, task) for task in tasks),
             *compute_cells(list(arm["compute"].values()))] for name, arm in results["arms"].items()]
    rows += floor_table_rows(results, tasks, width=4)
    return table(["method", *(task_facts(t).description for t in tasks), "pretraining FLOPs", "tokens seen", "tokens/s",
                  "pretraining time (s)"], rows)


def write_zoo_report(results: dict, sweep, folder: Path, argv: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    render_zoo_report(with_provenance(results, sweep, argv, zoo=True), sweep, folder)


def render_zoo_report(results: dict, sweep, folder: Path) -> None:
    """The zoo's report from its results (with their provenance) and its sweep's setting (`render_report`)."""
    from encoder_zoo.repro.plots import plot_zoo

    plot_zoo(results, sweep, folder / "plot.png")
    budget = sweep.budget
    described = sorted({f"{floor_label(f)}: {f['description']}" for t in sweep.tasks
                        for f in results["floors"].get(t, []) if f["kind"] != "chance"})
    lines = [f"# The zoo at the `{budget.name}` budget", "",
             f"**Budget:** {budget.description_for(trains_cnn(sweep))}.", "",
             *([f"**What this tests:** {budget.tests_what}.", ""] if budget.tests_what else []),
             code_line(results["code"]), "",
             f"Every method trained by this repository's code on the same data, steps and batch; units: "
             f"{len(results['units'])} independently trained models per method (seeds {results['units']}). "
             f"Best encoder of stage 1 (fusions built over it): **{results['best_encoder']}**.", "",
             "## Scores and compute", "",
             f"{table_key(results)} Time: the sum of the run's logged intervals (each interval's tokens over its "
             "tokens/s), which a run resumed after a kill keeps; tokens/s: tokens seen over that time.", "",
             *score_table(results), "", *(f"- {line}" for line in described), *([""] if described else []),
             "![score against pretraining FLOPs](plot.png)", "", *control_section(results),
             *pairs_section(results, sweep),
             "## What this can and cannot say", "",
             ("Every method continues the same pretrained encoder for minutes on the task's own text: a difference "
              "here is what each objective adds as a continued-pretraining step at this budget, and says nothing of "
              "its from-scratch run at the papers' scale. " if budget.init_from else
              "Tiny models pretrained for minutes rank methods at tiny scale only: a difference here is real for this "
              "budget, and the absence of one says nothing of the papers' scale. ") +
             "Compute differs per method (TEAMS and ELECTRA run a generator, the cloze model two towers): read each "
             "score next to its FLOPs.", "",
             "## How this was run", "", f"- Command: `{results['command']}`", f"- Commit: `{results['commit']}`",
             f"- Machine: {results['machine']}", time_line(results, zoo=True), "",
             "Every subprocess from the repository root; a folder name carries its flags' hash, and `cached` in "
             "results.json marks a run reused from an earlier sweep:", "", "```",
             *command_block([c["command"] for c in results["commands"]])]
    save(results, lines, folder)


def pair_text(pair: dict, results: dict) -> str:
    d = pair["decision"]
    p = d.get("p_two_sided", d["p_value"])
    return (f"{arm_label(pair['better'], results)} > {arm_label(pair['worse'], results)} "
            f"({'+' if d['estimate'] > 0 else ''}{significant(d['estimate'], pair['task'])}, p {p:.3g}, "
            f"MDD {significant(d['mdd'], pair['task'])})")


def pairs_section(results: dict, sweep) -> list[str]:
    from encoder_zoo.repro.stats import INDISTINGUISHABLE

    lines = ["## Significant differences", "", results["significance_rule"], "",
             "Each pair: the difference and its MDD on the scores' scale (percent points; nats for a loss).", ""]
    for task in sweep.tasks:
        found = [p for p in results["pairs"] if p["task"] == task and p["significant"]]
        same = [p for p in results["pairs"] if p["task"] == task and p["decision"]["verdict"] == INDISTINGUISHABLE]
        tested = sum(p["task"] == task for p in results["pairs"])
        significant = ", ".join(pair_text(p, results) for p in found) or "no significant difference"
        lines.append(f"- **{task_facts(task).description}** ({tested} pairs): {significant}." + (
            " Indistinguishable: " + "; ".join(f"{arm_label(p['better'], results)} and "
                                               f"{arm_label(p['worse'], results)} ("
                                               f"{difference_text(p['decision'].get('prediction_difference'))})"
                                               for p in same) + "." if same else ""))
    return [*lines, ""]
