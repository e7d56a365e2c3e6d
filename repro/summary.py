"""README's reproduction tables, generated from the committed reports (`repro/reports/<name>/<budget>/results.json`):
- the papers': per paper, the positive control on the primary claim's task and the primary claim, each with the
  difference [interval], units, minimum detectable difference and verdict, then the secondary claims counted by
  verdict (a report made before primary claims: every claim);
- the zoo's: one row per method with its scores and compute (`repro.report.score_table`), its plot and its significant
  pairs.

    python repro/summary.py [--budget cpu] [--write]   # prints the tables; --write puts each into README between its
                                                      # markers

`tests/test_repro.py` checks that README's tables are this output, so they are never edited by hand.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from encoder_zoo.repro.experiments import EXPERIMENTS
from encoder_zoo.repro.tasks import display_scale, task_facts

REPORTS = Path(__file__).resolve().parent / "reports"
README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- repro-table: begin (python repro/summary.py) -->", "<!-- repro-table: end -->"
ZOO_BEGIN, ZOO_END = "<!-- zoo-table: begin (python repro/summary.py) -->", "<!-- zoo-table: end -->"


# The papers' table's one scale (`display_scale`); no paper claims a difference in held-out loss, which is in nats.
DIFFERENCE_KEY = ("Differences, intervals and MDDs are in percent points (accuracy, F1 and Pearson x 100), the papers' "
                  "scale; a held-out loss, where shown, is in nats.")


# A report whose held-out MLM row is the 80/10/10 mean (task heldout_mlm), made before issue 51: the masked-only loss
# needs the pretrained models, which its cache alone keeps.
MIXED_HELDOUT = ("Its held-out MLM loss averages all 80/10/10 targets, a tenth of them left unchanged and copied from "
                 "the input (made before the masked-only loss became the headline, which needs its cached "
                 "pretrainings to recompute).")


def made_before_controls(results: dict) -> bool:
    """A report written before floors, positive controls and one scale (issue 37): its results hold no control."""
    return "control" not in results


def fmt(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def shown(x, task: str | None) -> str:
    """A difference, interval end or MDD of `task` on the tables' scale (`display_scale`)."""
    return fmt(None if x is None or task is None else x * display_scale(task))


def table(budget: str = "cpu", reports: Path = REPORTS) -> str:
    lines = ["| paper | claim | task | difference, points [90% CI] | units | MDD | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    missing, before_controls, tests = [], [], set()
    for name in EXPERIMENTS:
        path = reports / name / budget / "results.json"
        if not path.exists():
            if runs_at(name, budget):
                missing.append(name)
            continue
        results = json.loads(path.read_text(encoding="utf-8"))
        tests.add(results.get("tests_what") or "")
        if not all("decision" in c or "unavailable" in c["verdict"] for c in results["claims"]):
            missing.append(f"{name} (a report of the former statistics)")
            continue
        if made_before_controls(results):
            before_controls.append(name)
        rows, secondary = paper_rows(results)
        for claim in rows:
            d = claim.get("decision") or {}
            units = f"{d['units']['arm']}/{d['units']['baseline']}" if d else "—"
            relation = ">" if claim.get("direction", "better") == "better" else "≤"
            paper = f"[{name}](repro/reports/{name}/{budget}/report.md)" if claim is rows[0] else ""
            task, verdict = ((task_facts(claim["task"]).description, claim["verdict"]) if "task" in claim else
                             ("—", f"not tested at `{budget}` (its arm is not trained there)"))
            role = {"primary": " (primary)", "control": " (positive control)",
                    "adaptation": " (adaptation control)"}.get(claim.get("role"), "")
            on = claim.get("task")
            mdd = shown(d.get("mdd"), on) + (f" (α {d['mdd_alpha']:.2g})" if d.get("mdd") is not None
                                             and "mdd_alpha" in d else "")
            lines.append(f"| {paper} | {claim['arm']} {relation} {claim['baseline']}{role} | {task} | "
                         f"{shown(d.get('estimate'), on)} [{shown(d.get('low'), on)}, {shown(d.get('high'), on)}] | "
                         f"{units} | {mdd} | {verdict} |")
        if secondary:
            lines.append(f"|  | {secondary} | | | | | |")
    lines += ["", DIFFERENCE_KEY]
    lines += [line for what in sorted(tests - {""}) for line in ("", f"At `{budget}` every row tests {what}.")]
    if before_controls:
        its, reports_show = ("their", "reports show") if len(before_controls) > 1 else ("its", "report shows")
        lines += ["", "Run before floors, positive controls and primary claims: "
                  f"{', '.join(before_controls)}; {its} verdicts were not gated by a control, {its} MDD is at the "
                  f"unadjusted 5%, and {its} {reports_show} accuracy and Pearson as 0-1 (here in points)."]
    if missing:
        lines += ["", f"Not yet run at `{budget}` with the current statistics: {', '.join(missing)}."]
    return "\n".join(lines)


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
    verdicts = Counter(c["verdict"].split(":")[0].split(" (")[0] for c in secondary)
    counted = "; ".join(f"{n} {verdict}" for verdict, n in verdicts.items())
    line = (f"secondary claims (Holm): {len(secondary)} tested{f' ({counted})' if counted else ''}"
            f"{f', {untested} not tested here' if untested else ''}; in the report")
    return [*([controls[task]] if task in controls else []), *([adapted[task]] if task in adapted else []),
            *primary], line


def zoo_table(budget: str = "cpu", reports: Path = REPORTS) -> str:
    from encoder_zoo.repro.report import score_table, table_key

    path = reports / "zoo" / budget / "results.json"
    if not path.exists():
        return f"Not yet run at `{budget}`: `python repro/run.py zoo --budget {budget}`."
    results = json.loads(path.read_text(encoding="utf-8"))
    significant = [f"{p['better']} > {p['worse']} on {task_facts(p['task']).description}" for p in results["pairs"]
                   if p["significant"]]
    rule = results.get("significance_rule") or (
        "two-sided 5%, Holm across the pairs of each task, a pair counting only where one of its methods is above "
        "chance (the rule this report was made under)")
    control = [f"{c['arm']} > {c['baseline']} on {task_facts(task).description}: {c['verdict']}"
               for task, c in (results.get("control") or {}).items()]
    former = (" Made before floors, controls and one scale: its report shows accuracy and Pearson as 0-1."
              if made_before_controls(results) else "") + (f" {MIXED_HELDOUT}" if "heldout_mlm" in results["tasks"]
                                                           else "")
    return "\n".join([
        *score_table(results), "",
        f"{table_key(results)} Fusions are built over the best encoder, **{results['best_encoder']}**. "
        + (f"Positive control (pretrained > random): {'; '.join(control)}. " if control else "")
        + f"Significant pairs: {'; '.join(significant) or 'none'}. [Report](repro/reports/zoo/{budget}/report.md)."
        + former,
        "", f"Significance rule: {rule}", "",
        f"![zoo at the {budget} budget: every unit's score against its pretraining FLOPs]"
        f"(repro/reports/zoo/{budget}/plot.png)"])


def write_readme(text: str, readme: Path = README, markers: tuple[str, str] = (BEGIN, END)) -> None:
    """Replace what README holds between `markers` by `text`, the rest untouched."""
    begin, end = markers
    content = readme.read_text(encoding="utf-8")
    if begin not in content or end not in content:
        raise SystemExit(f"{readme} lacks the markers {begin!r} ... {end!r}: put them where the table belongs.")
    head, rest = content.split(begin, 1)
    readme.write_text(f"{head}{begin}\n{text.strip()}\n{end}{rest.split(end, 1)[1]}", encoding="utf-8")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", default="cpu")
    parser.add_argument("--write", action="store_true", help=f"Write the table into {README.name} too.")
    args = parser.parse_args(argv)
    papers, zoo = table(args.budget), zoo_table(args.budget)
    print(f"{papers}\n\n{zoo}")
    if args.write:
        write_readme(papers)
        write_readme(zoo, markers=(ZOO_BEGIN, ZOO_END))


if __name__ == "__main__":
    main()
