"""Shared test utilities (imported by test modules as `from helpers import ...`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# Blocking these makes `import models` etc. fail inside the child, as on a machine without this repository.
PROJECT_PACKAGES = ("models", "training", "glue", "qa", "hub_cards", "bench")


def run_isolated(code: str, cwd: str | None = None, timeout: int = 300) -> str:
    """Run `code` in a fresh Python process where this repository is NOT importable; return its stdout.

    Use it for save/load round-trips: a checkpoint must load through `trust_remote_code=True` from its own files.
    """
    blocker = "import sys\nfor _name in %r:\n    sys.modules[_name] = None\n" % (PROJECT_PACKAGES,)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [sys.executable, "-c", blocker + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=cwd or os.path.expanduser("~"),
        env=env,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"isolated process failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result.stdout
