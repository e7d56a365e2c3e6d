"""README's reproduction tables, generated from the committed reports (`repro/reports/<name>/<budget>/results.json`):
- the papers': per paper and budget (README: `README_BUDGETS`, a paper's budgets side by side), the positive control
  on the primary claim's task and the primary claim, each with the difference [interval], units, minimum detectable
  difference and verdict, then the secondary claims counted by verdict (a report made before primary claims: every
  claim);
- the zoo's (README: at `README_ZOO_BUDGET`, the budget that fits one sitting): one row per method with its scores
  and compute (`repro.report.score_table`), its plot and its significant pairs.

    python repro/summary.py [--budget adapt] [--write]  # prints README's tables (or one budget's); --write puts
                                                       # README's into it between their markers
    python repro/summary.py --rerender repro/reports/spanbert/adapt  # a committed report's text and plot written
                                                                    # again from its results.json, training nothing
    python repro/summary.py --since COMMIT --because TEXT REPORT_FOLDER...  # after a rerun: each folder's results.json
        # keeps its report at COMMIT in short (`git show COMMIT:<folder>/results.json`, `repro.changes`) under
        # "previous", and the folder is re-rendered as --rerender does, with a section "Since the previous report"
        # (per claim and positive control: verdict and difference before and now, and what changed). TEXT completes
        # "rerun because ..."; running it again writes the same files.

`tests/test_repro.py` checks that README's tables are this output, so they are never edited by hand.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from encoder_zoo.repro.budgets import arm_label
from encoder_zoo.repro.experiments import EXPERIMENTS
from encoder_zoo.repro.results import name_the_gate
from encoder_zoo.repro.stats import ALPHA, verdict_key, verdict_word
from encoder_zoo.repro.tasks import shown_difference, significant, task_facts

REPORTS = Path(__file__).resolve().parent / "reports"
README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- repro-table: begin (python repro/summary.py) -->", "<!-- repro-table: end -->"
ZOO_BEGIN, ZOO_END = "<!-- zoo-table: begin (python repro/summary.py) -->", "<!-- zoo-table: end -->"
# README's tables: the papers' at each budget a CPU runs, paper by paper; the zoo at `adapt`, which fits one sitting
# with floors, both controls and one scale.
README_BUDGETS = ("cpu", "adapt")
README_ZOO_BUDGET = "adapt"
# `repro.zoo.SIGNIFICANCE_RULE` in short, for README; each zoo report quotes the rule whole.
ZOO_RULE_IN_SHORT = ("every pair of methods on each task, paired by unit seed, two-sided at 5%, Holm across the "
                     "task's pairs; significant only where one of the two clears its floor")


# The papers' table's one scale (`display_scale`); no paper claims a difference in held-out loss, which is in nats.
DIFFERENCE_KEY = ("Differences, intervals and MDDs are in percent points (accuracy, F1 and Pearson x 100), the papers' "
                  "scale, to 3 significant digits; a held-out loss, where shown, in nats.")


# A report whose held-out MLM row is the 80/10/10 mean (task heldout_mlm), made before the masked-only loss: that loss
# needs the pretrained models, which its cache alone keeps.
MIXED_HELDOUT = ("Its held-out MLM loss averages all 80/10/10 targets, a tenth of them left unchanged and copied from "
                 "the input (made before the masked-only loss became the headline, which needs its cached "
                 "pretrainings to recompute).")


def made_before_controls(results: dict) -> bool:
    """A report written before floors, positive controls and one scale: its results hold no control."""
    return "control" not in results


def readme_tables(reports: Path = REPORTS) -> tuple[str, str]:
    """What README holds between its two pairs of markers: the papers' table and the zoo's."""
    return table(README_BUDGETS, reports), zoo_table(README_ZOO_BUDGET, reports)


def table(budgets: str | tuple[str, ...] = README_BUDGETS, reports: Path = REPORTS) -> str:
    """The papers' rows at each of `budgets`, a paper's budgets side by side, then what each budget's rows test and
    which reports are missing or predate the current statistics."""
    budgets = (budgets,) if isinstance(budgets, str) else tuple(budgets)
    lines = ["| paper | claim | task | difference, points [90% CI] | units | MDD | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    missing = {budget: [] for budget in budgets}
    before_controls, tests = [], {}
    for name in EXPERIMENTS:
        for budget in budgets:
            path = reports / name / budget / "results.json"
            if not path.exists():
                if runs_at(name, budget):
                    missing[budget].append(name)
                continue
            results = name_the_gate(json.loads(path.read_text(encoding="utf-8")))
            tests.setdefault(budget, results.get("tests_what") or "")
            if not all("decision" in c or "unavailable" in c["verdict"] for c in results["claims"]):
                missing[budget].append(f"{name} (a report of the former statistics)")
                continue
            if made_before_controls(results):
                before_controls.append(name if len(budgets) == 1 else f"{name} at `{budget}`")
            label = name if len(budgets) == 1 else f"{name}, `{budget}`"
            lines += paper_lines(results, f"[{label}](repro/reports/{name}/{budget}/report.md)", budget)
    lines += ["", f"{DIFFERENCE_KEY} Verdicts: {verdict_key()}"]
    lines += [line for budget, what in tests.items() if what
              for line in ("", f"At `{budget}` every row tests {what}.")]
    if before_controls:
        its, reports_show = ("their", "reports show") if len(before_controls) > 1 else ("its", "report shows")
        lines += ["", "Run before floors, positive controls and primary claims: "
                  f"{', '.join(before_controls)}; {its} verdicts were not gated by a control, {its} MDD is at the "
                  f"unadjusted 5%, and {its} {reports_show} accuracy and Pearson as 0-1 (here in points)."]
    for budget, names in missing.items():
        if names:
            lines += ["", f"Not yet run at `{budget}` with the current statistics: {', '.join(names)}."]
    return "\n".join(lines)


def paper_lines(results: dict, paper: str, budget: str) -> list[str]:
    """One report's rows (`paper_rows`), the first naming the paper with a link to its report."""
    rows, secondary = paper_rows(results)
    lines = []
    for claim in rows:
        d = claim.get("decision") or {}
        units = f"{d['units']['arm']}/{d['units']['baseline']}" if d else "—"
        relation = ">" if claim.get("direction", "better") == "better" else "≤"
        task, verdict = ((task_facts(claim["task"]).description, claim["verdict"]) if "task" in claim else
                         ("—", f"not tested at `{budget}` (its arm is not trained there)"))
        role = {"primary": " (primary)", "control": " (positive control)",
                "adaptation": " (adaptation control)"}.get(claim.get("role"), "")
        on = claim.get("task")
        mdd = significant(d.get("mdd") if on else None, on) + (
            f" (α {d['mdd_alpha']:.2g})" if d.get("mdd") is not None and d.get("mdd_alpha", ALPHA) != ALPHA else "")
        lines.append(f"| {paper if claim is rows[0] else ''} | {arm_label(claim['arm'], results)} {relation} "
                     f"{arm_label(claim['baseline'], results)}{role} | "
                     f"{task} | {shown_difference(d.get('estimate'), d.get('low'), d.get('high'), on) if on else '—'}"
                     f" | {units} | {mdd} | {verdict} |")
    if secondary:
        lines.append(f"|  | {secondary} | | | | | |")
    return lines


def runs_at(name: str, budget: str) -> bool:
    """Whether experiment `name` runs at `budget`: a continued-pretraining budget runs only the experiments with an
    arm that can continue its encoder (`Experiment.adapted`)."""
    from encoder_zoo.repro.budgets import BUDGETS

    if budget not in BUDGETS or not BUDGETS[budget].init_from:
        return True
    try:
        EXPERIMENTS[name].adapted(BUDGETS[budget])
    except ValueError:
        return False
    return True


def paper_rows(results: dict) -> tuple[list[dict], str]:
    """A report's rows in README: with a primary claim, the positive control on its task and the primary itself,
    the secondary claims counted by verdict in one line (each report lists them); a report made before primaries,
    every claim."""
    from collections import Counter

    controls = {task: {**c, "role": "control"} for task, c in (results.get("control") or {}).items()}
    adapted = {task: {**c, "role": "adaptation"} for task, c in (results.get("adaptation_control") or {}).items()}
    primary = [c for c in results["claims"] if c.get("role") == "primary"]
    if not primary:
        return [*controls.values(), *adapted.values(), *results["claims"], *results.get("untested_claims", [])], ""
    task = primary[0]["task"]
    secondary = [c for c in results["claims"] if c.get("role") != "primary"]
    untested = len(results.get("untested_claims", []))
    verdicts = Counter(verdict_word(c["verdict"]) for c in secondary)
    counted = "; ".join(f"{n} {verdict}" for verdict, n in verdicts.items())
    line = (f"secondary claims (Holm): {len(secondary)} tested{f' ({counted})' if counted else ''}"
            f"{f', {untested} not tested here' if untested else ''}; in the report")
    return [*([controls[task]] if task in controls else []), *([adapted[task]] if task in adapted else []),
            *primary], line


def zoo_table(budget: str = README_ZOO_BUDGET, reports: Path = REPORTS) -> str:
    from encoder_zoo.repro.report import score_table, table_key

    path = reports / "zoo" / budget / "results.json"
    if not path.exists():
        return f"Not yet run at `{budget}`: `python repro/run.py zoo --budget {budget}`."
    results = name_the_gate(json.loads(path.read_text(encoding="utf-8")))
    pairs = [f"{arm_label(p['better'], results)} > {arm_label(p['worse'], results)} on "
                   f"{task_facts(p['task']).description}" for p in results["pairs"] if p["significant"]]
    # README states the rule in short; the report quotes it whole.
    rule = (f"{ZOO_RULE_IN_SHORT} ([the whole rule](repro/reports/zoo/{budget}/report.md))"
            if results.get("significance_rule") else
            "two-sided 5%, Holm across the pairs of each task, a pair counting only where one of its methods is above "
            "chance (the rule this report was made under)")
    control, adapted = ([f"{arm_label(c['arm'], results)} > {arm_label(c['baseline'], results)} on "
                         f"{task_facts(task).description}: {c['verdict']}"
                         for task, c in (results.get(key) or {}).items()] for key in ("control", "adaptation_control"))
    former = (" Made before floors, controls and one scale: its report shows accuracy and Pearson as 0-1."
              if made_before_controls(results) else "") + (f" {MIXED_HELDOUT}" if "heldout_mlm" in results["tasks"]
                                                           else "")
    return "\n".join([
        *score_table(results), "",
        f"{table_key(results)} Fusions are built over the best encoder, **{results['best_encoder']}**. "
        + (f"Positive control (pretrained > random): {'; '.join(control)}. " if control else "")
        + (f"Adaptation control (adapted > not adapted): {'; '.join(adapted)}. " if adapted else "")
        + f"Significant pairs: {'; '.join(pairs) or 'none'}. [Report](repro/reports/zoo/{budget}/report.md)."
        + former,
        "", f"Significance rule: {rule}", "",
        f"![zoo at the {budget} budget: every unit's score against its pretraining FLOPs]"
        f"(repro/reports/zoo/{budget}/plot.png)"])


def report_results(folder: Path) -> dict:
    """A report folder's results.json, or one line saying what `folder` is instead (missing, a file, no results.json,
    damaged)."""
    if not folder.exists():
        raise FileNotFoundError(f"{folder} does not exist: give a report folder (repro/reports/<paper>/<budget>).")
    if not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a report folder: give its folder (repro/reports/<paper>/<budget>).")
    path = folder / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no results.json: it is no report folder, or its report was never "
                                "written (repro/run.py writes it).")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{path} is damaged ({error}): restore it (git checkout -- {path}) or rerun the report.") \
            from None


def rerender(folder: Path) -> None:
    """Write a committed report's report.md and plot.png again from its results.json, training nothing: the text as
    `repro.report` now renders it (the gate that held a claim back named, `name_the_gate`; the arms labelled,
    `arm_label`; the budget line from `repro.budgets`). Its numbers are kept; the budget preset is refused where the
    settings differ from the budget's now (only its prose may change), and its prose is refreshed in results.json."""
    import dataclasses
    import tempfile

    from encoder_zoo.repro.budgets import BUDGETS
    from encoder_zoo.repro.report import render_report, render_zoo_report

    results = name_the_gate(report_results(folder))
    budget = BUDGETS[results["budget"]["name"]]
    prose = ("description", "cnn_description", "tests_what")
    now = json.loads(json.dumps(dataclasses.asdict(budget)))
    changed = sorted(k for k in {*now, *results["budget"]} - set(prose) if now.get(k) != results["budget"].get(k))
    if changed:
        raise ValueError(f"{folder}/results.json was made at other {results['budget']['name']} settings than the "
                         f"budget's now ({', '.join(changed)}): rerun it (repro/run.py); a re-render would misdescribe "
                         "it")
    results = {**results, "budget": now}
    with tempfile.TemporaryDirectory() as scratch:  # the sweep's setting only: its cache is never read
        sweep = report_sweep(results, Path(scratch))
        (render_zoo_report if results["experiment"] == "zoo" else render_report)(results, sweep, folder)


def report_sweep(results: dict, scratch: Path):
    """The sweep a committed report's results were made by, its setting only (budget, tasks, units), over an empty
    `scratch` folder: what `rerender` renders with, never reading a cache."""
    from encoder_zoo.repro.budgets import BUDGETS
    from encoder_zoo.repro.jobs import Sweep
    from encoder_zoo.repro.zoo import zoo_experiment

    budget = BUDGETS[results["budget"]["name"]]
    tasks = list(results.get("tasks") or results["chance"])
    experiment = (zoo_experiment(results["best_encoder"]) if results["experiment"] == "zoo"
                  else EXPERIMENTS[results["experiment"]])
    return Sweep(experiment.at(budget, tasks=tasks, units=results["units"]), scratch)


def git(args: list[str], where: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True)


def previous_results(folder: Path, commit: str) -> tuple[str, dict]:
    """The commit (its full hash) and the results.json that `folder` held at `commit`, read from the git repository
    the folder lies in."""
    root = git(["rev-parse", "--show-toplevel"], folder)
    if root.returncode:
        raise ValueError(f"--since: {folder} lies in no git repository: give a report folder of the repository")
    path = f"{(folder.resolve().relative_to(Path(root.stdout.strip()).resolve())).as_posix()}/results.json"
    resolved = git(["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], folder)
    if resolved.returncode:
        raise ValueError(f"--since: git knows no commit {commit!r}: give a commit of this repository (git log)")
    shown = git(["show", f"{commit}:{path}"], folder)
    if shown.returncode:
        raise ValueError(f"--since: commit {commit} has no {path}: give the commit of the report it replaces "
                         f"(git log -- {path})")
    return resolved.stdout.strip(), json.loads(shown.stdout)


def since(folder: Path, commit: str, because: str) -> None:
    """Store in `folder`'s results.json its report at `commit` in short (`repro.changes.previous_record`, under
    "previous"), then re-render the folder (`rerender`); a refused re-render leaves results.json as it was."""
    from encoder_zoo.repro.changes import previous_record

    report_results(folder)  # the folder as it stands, before git is asked about it
    resolved, old = previous_results(folder, commit)
    if old.get("experiment") == "zoo":
        raise ValueError(f"--since: {folder} is the zoo's report, which has no claims: give a paper's report folder")
    path = folder / "results.json"
    before = path.read_text(encoding="utf-8")
    path.write_text(json.dumps({**json.loads(before), "previous": previous_record(old, resolved, because)}, indent=2))
    try:
        rerender(folder)
    except ValueError as error:
        path.write_text(before)
        raise ValueError(f"--since: {error}") from None


def write_readme(text: str, readme: Path = README, markers: tuple[str, str] = (BEGIN, END)) -> None:
    """Replace what README holds between `markers` by `text`, the rest untouched."""
    begin, end = markers
    content = readme.read_text(encoding="utf-8")
    if begin not in content or end not in content:
        raise ValueError(f"{readme} lacks the markers {begin!r} ... {end!r}: put them where the table belongs.")
    head, rest = content.split(begin, 1)
    readme.write_text(f"{head}{begin}\n{text.strip()}\n{end}{rest.split(end, 1)[1]}", encoding="utf-8")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", help="Print this budget's tables only (default: README's, the papers' at "
                        f"{', '.join(README_BUDGETS)} and the zoo's at {README_ZOO_BUDGET}).")
    parser.add_argument("--write", action="store_true", help=f"Write README's tables into {README.name}.")
    parser.add_argument("--rerender", nargs="+", type=Path, metavar="REPORT_FOLDER", help="Write these committed "
                        "reports' report.md and plot.png again from their results.json (no run), then stop.")
    parser.add_argument("--since", metavar="COMMIT", help="After a rerun: store in each REPORT_FOLDER's results.json "
                        "its report at COMMIT in short (read with git show COMMIT:<folder>/results.json) and re-render "
                        "the folder as --rerender does, with a section on what changed since; needs --because.")
    parser.add_argument("--because", metavar="TEXT", help="With --since: why the reports were rerun, as the report "
                        "says it after 'rerun because' (e.g. 'the cpu budget fine-tunes on 2,000 rows').")
    parser.add_argument("folders", nargs="*", type=Path, metavar="REPORT_FOLDER",
                        help="With --since: the rerun reports' folders (e.g. repro/reports/hire/cpu).")
    args = parser.parse_args(argv)
    if args.since is not None or args.because is not None or args.folders:
        if args.since is None or not args.because or not args.folders:
            parser.error("--since COMMIT --because TEXT REPORT_FOLDER... go together: give all three")
        for folder in args.folders:
            since(folder, args.since, args.because)
            print(f"Re-rendered {folder / 'report.md'} with what changed since {args.since}")
        return
    if args.rerender:
        for folder in args.rerender:
            rerender(folder)
            print(f"Re-rendered {folder / 'report.md'}")
        return
    if args.write and args.budget:
        parser.error(f"--write writes README's tables ({', '.join(README_BUDGETS)}; zoo {README_ZOO_BUDGET}): "
                     "leave out --budget")
    papers, zoo = (table(args.budget), zoo_table(args.budget)) if args.budget else readme_tables()
    print(f"{papers}\n\n{zoo}")
    if args.write:
        write_readme(papers)
        write_readme(zoo, markers=(ZOO_BEGIN, ZOO_END))


def cli() -> None:
    """`python repro/summary.py`: a refusal is one line and exit status 2 (`training.run.entry.run_cli`)."""
    from encoder_zoo.training.run.entry import run_cli

    run_cli(main, "summary.py")


if __name__ == "__main__":
    cli()
