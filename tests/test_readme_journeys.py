"""README's small commands, run as written and in order: every journey's first command (the ones README marks
`# small`) finishes, on the embedded data, in a fresh working directory, with README's shell variables
(`MINILM=$(python -c ...)`) set as a shell sets them. `make test-all` runs it (minutes)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
ASSIGNMENT = re.compile(r"^([A-Z_]+)=\$\((python .*)\)$")  # a shell variable set from a Python one-liner


def small_commands(readme: Path = REPO / "README.md") -> list[list[str]]:
    """The commands README marks small: those right after a `# small...` comment line (a variable set in between
    keeps the mark), or ending in `# small...`. Their `$NAME` words stay as written (`shell_variables`)."""
    commands = []
    for body in FENCE.findall(readme.read_text()):
        marked = False
        for line in body.replace("\\\n", " ").splitlines():
            text = line.strip()
            if text.startswith("#"):
                marked = text.startswith("# small")
                continue
            if ASSIGNMENT.match(text):
                continue
            command, _, comment = text.partition(" #")
            if command and (marked or comment.strip().startswith("small")):
                commands.append(shlex.split(command))
            marked = False
    return commands


def shell_variables(readme: Path = REPO / "README.md") -> dict[str, list[str]]:
    """README's `NAME=$(python ...)` lines: each variable's command."""
    return {match[1]: shlex.split(match[2]) for body in FENCE.findall(readme.read_text())
            for match in map(ASSIGNMENT.match, (line.strip() for line in body.splitlines())) if match}


def test_readme_marks_a_small_command_for_every_journey():
    scripts = list(dict.fromkeys(words[1] for words in small_commands()))
    assert scripts[:4] == ["training/pretrain.py", "glue/run_glue.py", "qa/run_qa.py", "repro/run.py"], scripts
    # Fine-tuning shows learning first: the shipped MiniLM (a 100-step tiny export scores the majority class).
    first_fine_tuning = next(words for words in small_commands() if words[1] == "glue/run_glue.py")
    assert first_fine_tuning[first_fine_tuning.index("--model_name_or_path") + 1] == "$MINILM"
    assert shell_variables()["MINILM"][:2] == ["python", "-c"]
    assert any(words[1:3] == ["repro/run.py", "zoo"] for words in small_commands())
    # Small means small throughout: the fine-tuning commands score a limited number of evaluation rows too.
    assert all("--max_eval_samples" in words for words in small_commands() if words[1] in ("glue/run_glue.py",
                                                                                           "qa/run_qa.py"))


@pytest.mark.slow
def test_readme_small_commands_run_as_written(tmp_path, share_smoke_cache):
    # README's smoke sweeps run as written; the runs they share with tests/test_repro.py's smoke sweeps (the same
    # jobs, keyed by their flags and data) come from the session's cache, trained once.
    for folder in ("repro", "zoo"):
        share_smoke_cache(tmp_path / "runs" / "small" / folder)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    variables = {name: subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, cwd=tmp_path,
                                      env=env, check=True).stdout.strip() for name, words in shell_variables().items()}
    for words in small_commands():
        assert words[0] == "python", words
        command = [sys.executable, str(REPO / words[1]), *(variables.get(w[1:], w) if w.startswith("$") else w
                                                           for w in words[2:])]
        result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
        assert result.returncode == 0, f"{shlex.join(words)}\n{result.stderr[-3000:]}"
    assert (tmp_path / "runs" / "small" / "pretrain" / "export" / "model.safetensors").is_file()
    assert (tmp_path / "runs" / "small" / "repro").is_dir() and (tmp_path / "runs" / "small" / "zoo").is_dir()
