"""Write README's "Works with" table from the client-matrix results (tests/test_clients.py).

    UPDATE_WORKS_WITH=1 pytest tests/test_clients.py   # refreshes tests/works_with.json
    python tests/works_with.py                         # rewrites the table between the README markers
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- works-with:begin -->", "<!-- works-with:end -->"
FAMILIES = ["spanbert", "teams", "electra", "cloze", "bertac", "hire"]
ORDER = ["feature-extraction", "fill-mask", "text-classification", "pretraining-head inference",
         "resize_token_embeddings", "PEFT LoRA (sequence classification)", "sentence-transformers",
         "gradient checkpointing", "torch.compile"]


def table(results: dict[str, dict[str, str]]) -> str:
    clients = set(name for family in FAMILIES for name in results.get(family, {}))
    clients = sorted(clients, key=lambda name: (ORDER.index(name) if name in ORDER else len(ORDER), name))
    lines = ["| client | " + " | ".join(FAMILIES) + " |", "|---" * (len(FAMILIES) + 1) + "|"]
    for name in clients:
        cells = []
        for family in FAMILIES:
            outcome = results.get(family, {}).get(name)
            cells.append("–" if outcome is None else "✓" if outcome == "ok" else "✗")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("\n✓ passes, ✗ fails, – not applicable (no such head; SpanBERT and cloze pretraining heads are read through fill-mask). torch.compile: the `aot_eager` backend, output = eager.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(HERE / "works_with.json"), help="the client-matrix JSON")
    parser.add_argument("--readme", default=str(HERE.parent / "README.md"), help="the README to update in place")
    parser.add_argument("--print", action="store_true", help="print the table instead of writing the README")
    args = parser.parse_args()
    rendered = table(json.loads(Path(args.results).read_text()))
    if args.print:
        print(rendered)
        return
    readme = Path(args.readme).read_text()
    if BEGIN not in readme or END not in readme:
        sys.exit(f"{args.readme} has no {BEGIN} ... {END} markers; add them where the table belongs.")
    head, rest = readme.split(BEGIN, 1)
    Path(args.readme).write_text(head + BEGIN + "\n" + rendered + "\n" + END + rest.split(END, 1)[1])


if __name__ == "__main__":
    main()
