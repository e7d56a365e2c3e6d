"""README's reproduction table, generated from the committed reports (`repro/reports/<paper>/<budget>/results.json`):
one row per claim and task with the difference [interval], units, minimum detectable difference and verdict.

    python repro/summary.py [--budget cpu] [--write]   # prints the table; --write puts it into README between its
                                                      # repro-table markers

`tests/test_repro.py` checks that README's table is this output, so it is never edited by hand.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from encoder_zoo.repro.experiments import EXPERIMENTS, METRICS

REPORTS = Path(__file__).resolve().parent / "reports"
README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- repro-table: begin (python repro/summary.py) -->", "<!-- repro-table: end -->"


def fmt(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def table(budget: str = "cpu", reports: Path = REPORTS) -> str:
    lines = ["| paper | claim | task | difference [90% CI] | units | MDD | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    missing = []
    for name in EXPERIMENTS:
        path = reports / name / budget / "results.json"
        if not path.exists():
            missing.append(name)
            continue
        results = json.loads(path.read_text(encoding="utf-8"))
        if not all("decision" in c or "unavailable" in c["verdict"] for c in results["claims"]):
            missing.append(f"{name} (a report of the former statistics)")
            continue
        for claim in results["claims"]:
            d = claim.get("decision") or {}
            units = f"{d['units']['arm']}/{d['units']['baseline']}" if d else "—"
            relation = ">" if claim["direction"] == "better" else "≤"
            lines.append(f"| [{name}](repro/reports/{name}/{budget}/report.md) | {claim['arm']} {relation} "
                         f"{claim['baseline']} | {METRICS[claim['task']].label} | {fmt(d.get('estimate'))} "
                         f"[{fmt(d.get('low'))}, {fmt(d.get('high'))}] | {units} | {fmt(d.get('mdd'))} | "
                         f"{claim['verdict']} |")
    if missing:
        lines += ["", f"Not yet run at `{budget}` with the current statistics: {', '.join(missing)}."]
    return "\n".join(lines)


def write_readme(text: str, readme: Path = README) -> None:
    """Replace what README holds between its repro-table markers by `text`, the rest untouched."""
    content = readme.read_text(encoding="utf-8")
    if BEGIN not in content or END not in content:
        raise SystemExit(f"{readme} lacks the markers {BEGIN!r} ... {END!r}: put them where the table belongs.")
    head, rest = content.split(BEGIN, 1)
    readme.write_text(f"{head}{BEGIN}\n{text.strip()}\n{END}{rest.split(END, 1)[1]}", encoding="utf-8")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", default="cpu")
    parser.add_argument("--write", action="store_true", help=f"Write the table into {README.name} too.")
    args = parser.parse_args(argv)
    text = table(args.budget)
    print(text)
    if args.write:
        write_readme(text)


if __name__ == "__main__":
    main()
