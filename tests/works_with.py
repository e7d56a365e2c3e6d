"""Write docs/clients.md's "Works with" table from the client-matrix results (tests/test_clients.py).

    UPDATE_WORKS_WITH=1 pytest tests/test_clients.py   # refreshes tests/works_with.json
    UPDATE_WORKS_WITH=1 pytest -m common tests/test_transformers_common.py   # refreshes tests/common_tests.json
    python tests/works_with.py                         # rewrites the table between the markers of docs/clients.md

Its columns and rows are what the families declare (`Family.client_matrix`, `CLIENTS`); a column already in the page
keeps its place, a new one is added after them, in declaration order.
"""

import argparse
import json
import sys
from pathlib import Path

from encoder_zoo.training.recipes import CLIENTS, client_columns, families

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- works-with:begin -->", "<!-- works-with:end -->"
FAMILIES = list(client_columns())  # the table's columns, in declaration order
ORDER = list(CLIENTS)


# transformers' own common tests (tests/test_transformers_common.py): test class -> the family column it counts for,
# as each family declares them (`CommonTests.works_with_column`).
COMMON_TEST_FAMILIES = {f"{spec.name}ModelTest": spec.works_with_column
                        for family in families().values() for spec in family.common_tests}
COMMON_TESTS = "transformers common tests (passed / skipped)"


def stable_columns(page: str | None) -> list[str]:
    """`FAMILIES`, those the table of `page` (docs/clients.md's text) already shows first, in its order."""
    shown = []
    if page and BEGIN in page:
        header = page.split(BEGIN, 1)[1].strip().splitlines()[0]
        shown = [cell.strip() for cell in header.strip("|").split("|")[1:]]
    return [name for name in shown if name in FAMILIES] + [name for name in FAMILIES if name not in shown]


def common_tests_row(counts: dict[str, dict[str, int]], columns: list[str]) -> str:
    """`counts`: family -> {"passed": n, "skipped": n, "failed": n} (written by tests/conftest.py)."""
    cells = []
    for family in columns:
        count = counts.get(family)
        if count is None:
            cells.append("–")
        elif count.get("failed"):
            cells.append(f"✗ {count['failed']} failed")
        else:
            cells.append(f"✓ {count.get('passed', 0)} / {count.get('skipped', 0)}")
    return f"| {COMMON_TESTS} | " + " | ".join(cells) + " |"


def table(results: dict[str, dict[str, str]], common: dict[str, dict[str, int]] | None = None,
          columns: list[str] | None = None) -> str:
    columns = columns or FAMILIES
    clients = set(name for family in columns for name in results.get(family, {}))
    clients = sorted(clients, key=lambda name: (ORDER.index(name) if name in ORDER else len(ORDER), name))
    lines = ["| client | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name in clients:
        cells = []
        for family in columns:
            outcome = results.get(family, {}).get(name)
            cells.append("–" if outcome is None else "✓" if outcome == "ok" else "✗")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if common:
        lines.append(common_tests_row(common, columns))
    lines.append("\n✓ passes, ✗ fails, – not applicable (no such head: HIRE has no pretraining head, BERTAC's is its "
                 "part-1 CNN's). Pretraining-head inference: `AutoModelForPreTraining` without labels. torch.compile: "
                 "the `aot_eager` backend, output = eager. transformers common tests: transformers' `ModelTesterMixin` "
                 "(from the installed version's sdist) on every head of the family, passed / skipped (each skip has "
                 "its reason in tests/test_transformers_common.py or comes from transformers, e.g. GPU-only tests).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(HERE / "works_with.json"), help="the client-matrix JSON")
    parser.add_argument("--readme", default=str(HERE.parent / "docs" / "clients.md"),
                        help="the page to update in place")
    parser.add_argument("--common", default=str(HERE / "common_tests.json"),
                        help="transformers' common-test counts (UPDATE_WORKS_WITH=1 pytest -m common ...)")
    parser.add_argument("--print", action="store_true", help="print the table instead of writing the README")
    args = parser.parse_args()
    common = json.loads(Path(args.common).read_text()) if Path(args.common).exists() else None
    readme = Path(args.readme).read_text() if Path(args.readme).exists() else None
    rendered = table(json.loads(Path(args.results).read_text()), common, stable_columns(readme))
    if args.print:
        print(rendered)
        return
    if BEGIN not in readme or END not in readme:
        sys.exit(f"{args.readme} has no {BEGIN} ... {END} markers; add them where the table belongs.")
    head, rest = readme.split(BEGIN, 1)
    Path(args.readme).write_text(head + BEGIN + "\n" + rendered + "\n" + END + rest.split(END, 1)[1])


if __name__ == "__main__":
    main()
