"""Keeps the code that family folders repeat by design in sync, as transformers' `utils/check_copies.py` does.

A definition preceded by

    # Copied from models.hire.configuration_hire.HireConfig._backbone_from_dict with HIRE->BERTAC,RoBERTa->BERT

must equal its original (a module-level function or class, or a method `Class.method`) after the replacements, each
applied to the original's text in order. Each family folder travels alone inside its checkpoints, so the code cannot
be shared by import.

    python tests/check_copies.py          # lists the copies that drifted, exit 1 if any
    python tests/check_copies.py --fix    # rewrites each drifted copy from its original
"""

from __future__ import annotations

import argparse
import ast
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^(?P<indent>\s*)# Copied from (?P<target>[\w.]+)(?: with (?P<replacements>.+))?$")


@dataclass
class Copy:
    file: Path
    line: int  # 0-based index of the marker line
    target: str
    replacements: list[tuple[str, str]]
    start: int  # 0-based first line of the copied definition (decorators included)
    end: int  # 0-based line after it


def definition_span(lines: list[str], tree: ast.Module, path: list[str]) -> tuple[int, int]:
    """Line span (0-based, end exclusive, decorators included) of the definition `path` (e.g. ["Cls", "forward"])."""
    body = tree.body
    node = None
    for name in path:
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == name), None)
        if node is None:
            raise LookupError(name)
        body = node.body
    first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    return first, node.end_lineno


def original_source(target: str) -> tuple[str, int]:
    """The original's text and its indentation width, found in `models/` by its dotted name."""
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        file = REPO.joinpath(*parts[:split]).with_suffix(".py")
        if file.is_file():
            text = file.read_text()
            lines = text.splitlines(keepends=True)
            start, end = definition_span(lines, ast.parse(text), parts[split:])
            indent = len(lines[start]) - len(lines[start].lstrip())
            return "".join(lines[start:end]), indent
    raise LookupError(target)


def find_copies(root: Path) -> list[Copy]:
    copies = []
    for file in sorted(root.rglob("*.py")):
        text = file.read_text()
        if "# Copied from" not in text:
            continue
        lines = text.splitlines(keepends=True)
        tree = ast.parse(text)
        starts = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
                starts[first] = node.end_lineno
        for index, line in enumerate(lines):
            match = MARKER.match(line.rstrip("\n"))
            if not match:
                continue
            if index + 1 not in starts:
                raise ValueError(f"{file}:{index + 1}: '# Copied from' must sit right above a def or class.")
            pairs = [tuple(item.strip().split("->")) for item in (match["replacements"] or "").split(",")
                     if item.strip()]
            copies.append(Copy(file, index, match["target"], pairs, index + 1, starts[index + 1]))
    return copies


def expected_text(copy: Copy, copy_indent: int) -> str:
    text, indent = original_source(copy.target)
    for old, new in copy.replacements:
        text = text.replace(old, new)
    lines = [line[indent:] if line.strip() else line for line in text.splitlines(keepends=True)]
    return "".join((" " * copy_indent + line) if line.strip() else line for line in lines)


def check(root: Path = REPO / "models", fix: bool = False) -> list[str]:
    """Copies under `root` that differ from their originals ("file:line target"); rewritten when `fix`."""
    drifted = []
    for copy in reversed(find_copies(root)):  # bottom-up, so rewrites keep earlier line numbers valid
        lines = copy.file.read_text().splitlines(keepends=True)
        indent = len(lines[copy.start]) - len(lines[copy.start].lstrip())
        expected = expected_text(copy, indent)
        if "".join(lines[copy.start : copy.end]) != expected:
            drifted.append(f"{copy.file.relative_to(REPO)}:{copy.line + 1} {copy.target}")
            if fix:
                lines[copy.start : copy.end] = [expected]
                copy.file.write_text("".join(lines))
    return sorted(drifted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fix", action="store_true", help="Rewrite each drifted copy from its original.")
    fix = parser.parse_args().fix
    drifted = check(fix=fix)
    for entry in drifted:
        print(f"{'fixed' if fix else 'differs from its original'}: {entry}")
    if drifted and not fix:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
