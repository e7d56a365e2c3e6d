"""Docs that cannot rot: every fenced command in README.md and docs/ names a script that exists, flags its parser
accepts, `--model`/`--model_size`/`--preset` values that are registered and repository paths that exist; every
repository path quoted in their prose exists too (as transformers' doc checks do for docstrings)."""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", REPO / "glue" / "README.md", REPO / "qa" / "README.md",
                *(REPO / "docs").rglob("*.md")])
ROOTS = ("models", "training", "glue", "qa", "bench", "repro", "tests", "docs", "hub_cards")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
PATH = re.compile(rf"^(?:{'|'.join(ROOTS)})/[\w./-]*$")
LAUNCHERS = {"python", "python3", "accelerate", "torchrun", "srun"}


def fenced_commands(page: Path) -> list[list[str]]:
    """Shell commands of a page's bash/sh/unlabelled blocks: continuation lines joined, comments and placeholders'
    brackets dropped."""
    commands = []
    for language, body in FENCE.findall(page.read_text()):
        if language not in ("", "bash", "sh", "shell"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            try:
                words = shlex.split(line.replace("[", " ").replace("]", " "))
            except ValueError:
                continue
            if words and words[0] in LAUNCHERS | {"make"}:
                commands.append(words)
    return commands


def script_of(words: list[str]) -> tuple[str | None, list[str]]:
    """The repository script a command runs and the words after it (None for a command of another tool)."""
    for index, word in enumerate(words):
        if word.endswith(".py"):
            return word, words[index + 1:]
        if word == "-m" and index + 1 < len(words):
            return words[index + 1], words[index + 2:]
    return None, []


@functools.cache
def accepted_flags(script: str) -> frozenset[str]:
    """The flags a script's `--help` lists (run once per script, in a fresh process)."""
    command = [sys.executable, "-m", script] if not script.endswith(".py") else [sys.executable, str(REPO / script)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert result.returncode == 0, f"{script} --help failed:\n{result.stderr[-2000:]}"
    return frozenset(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", result.stdout))


def registered_values() -> dict[str, set[str]]:
    from encoder_zoo.glue.run_glue import PRESETS
    from encoder_zoo.training.recipes import all_recipes

    recipes = all_recipes()
    return {"--model": set(recipes), "--model_size": {size for recipe in recipes.values() for size in recipe.sizes},
            "--preset": set(PRESETS)}


def is_placeholder(value: str) -> bool:
    return value.isupper() or value.startswith(("$", "<")) or "..." in value


COMMANDS = [(page, words) for page in PAGES for words in fenced_commands(page)]


def test_pages_have_commands():
    """The check is not empty by mistake: README's journeys are found."""
    scripts = {script_of(words)[0] for page, words in COMMANDS if page.name == "README.md"}
    assert {"training/pretrain.py", "glue/run_glue.py", "qa/run_qa.py", "repro/run.py"} <= scripts


@pytest.mark.parametrize("page,words", COMMANDS, ids=[f"{p.relative_to(REPO)}:{' '.join(w)[:60]}" for p, w in COMMANDS])
def test_fenced_command(page, words):
    if words[0] == "make":
        targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
        assert set(w for w in words[1:] if "=" not in w and not w.startswith("-")) <= targets, f"{page.name}: {words}"
        return
    script, rest = script_of(words)
    if script is None:
        return
    if script.endswith(".py"):
        assert (REPO / script).is_file(), f"{page.name}: no script {script}"
    flags = accepted_flags(script)
    values = registered_values()
    for index, word in enumerate(rest):
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            assert flag in flags, f"{page.name}: {script} does not accept {flag}"
            value = rest[index + 1] if index + 1 < len(rest) else ""
            if flag in values and value and not value.startswith("-") and not is_placeholder(value):
                for choice in value.split("|"):
                    assert choice in values[flag], f"{page.name}: {flag} {choice} is not registered"
    for word in words:
        if PATH.match(word) and not is_placeholder(word):
            assert (REPO / word).exists(), f"{page.name}: {word} does not exist"
    if script == "repro/run.py" and rest and not rest[0].startswith("-"):
        from encoder_zoo.repro.experiments import EXPERIMENTS

        for choice in rest[0].split("|"):
            assert choice in (*EXPERIMENTS, "zoo"), f"{page.name}: repro/run.py has no experiment {choice}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_quoted_paths_exist(page):
    text = FENCE.sub("", page.read_text())
    quoted = [path for path in re.findall(r"`([^`\s]+)`", text)
              if PATH.match(path) and not re.search(r"[<{]|\.\.\.", path)]
    missing = [path for path in quoted if not (any(REPO.glob(path)) if "*" in path else (REPO / path).exists())]
    assert not missing, f"{page.relative_to(REPO)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_named_tests_exist(page):
    """A page that names the test holding a guarantee (`tests/FILE.py::NAME`) names one that exists."""
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", page.read_text())
    missing = [f"{path}::{name}" for path, name in named
               if not (REPO / path).exists() or not re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M)]
    assert not missing, f"{page.name} names tests that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_links_resolve(page):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    broken = [link for link in links if "://" not in link and not (page.parent / link).exists()]
    assert not broken, f"{page.relative_to(REPO)} links to missing files: {broken}"


def test_readme_fits_one_screen():
    """README's own text stays short; the reproduction and zoo tables that `repro/summary.py` writes between their
    markers are data, one row per claim or method, and are bounded on their own."""
    import re

    text = (REPO / "README.md").read_text()
    generated = re.findall(r"<!-- (?:repro|zoo)-table: begin.*?<!-- (?:repro|zoo)-table: end -->", text, re.S)
    assert len(generated) == 2
    assert len(text) - sum(map(len, generated)) <= 10_000
    # The papers' table holds each paper's `cpu` and `adapt` rows side by side: 1,000 characters more than one budget.
    assert len(text) <= 17_000
    # Words for users, the generated tables' included: what a budget or a report is, never an internal issue number.
    assert not re.findall(r"\bissues? \d+", text, re.I)
