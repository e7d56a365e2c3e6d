"""Shared test utilities (imported by test modules as `from helpers import ...`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRETRAIN = os.path.join(REPO, "training", "pretrain.py")
# Blocking this makes `import encoder_zoo.models` etc. fail inside the child, as on a machine without this repository.
PROJECT_PACKAGES = ("encoder_zoo",)


def session_dir(tmp_path_factory) -> Path:
    """This session's temporary root, shared by every pytest-xdist worker (each worker's own is a folder under it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def free_port() -> int:
    """A TCP port no process listens on now. Multi-process tests running side by side (pytest-xdist) must not both
    rendezvous on the default 29500: the second fails with EADDRINUSE."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# `accelerate launch` through this interpreter: works without the venv's bin/ on PATH (a venv used, not activated).
ACCELERATE_LAUNCH = (sys.executable, "-m", "accelerate.commands.launch")


def two_process_launcher() -> tuple[str, ...]:
    """`accelerate launch` of two processes on a free port: on a CPU-only machine Trainer runs them as DDP over gloo."""
    return (*ACCELERATE_LAUNCH, "--multi_gpu", "--num_processes", "2", "--main_process_port", str(free_port()))


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


def save_tiny_spanbert(path, head_class_name: str, max_position_embeddings: int = 256) -> str:
    """A tiny random SpanBERT `head_class_name` model with the offline MiniLM tokenizer, saved like any zoo
    checkpoint (config with auto_map, code, safetensors, tokenizer): a fixture for the fine-tuning harnesses."""
    import torch
    from transformers import AutoTokenizer

    import encoder_zoo.models.spanbert.modeling_spanbert as spanbert
    from encoder_zoo.models.spanbert.configuration_spanbert import SpanBertConfig
    from encoder_zoo.training.data.resources import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    config = SpanBertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=max_position_embeddings)
    getattr(spanbert, head_class_name)(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def terminate_when(command: list[str], marker, env: dict, timeout: float = 300) -> None:
    """Start `command`, send it SIGTERM as soon as the file `marker` exists (e.g. a run's first checkpoint), and
    check that it then stops as SaveOnSignal makes it: a checkpoint saved, exit status 128 + SIGTERM (143)."""
    import signal
    import time
    from pathlib import Path

    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + timeout
    while not Path(marker).exists():
        if process.poll() is not None:
            raise AssertionError(f"the run ended before {marker} appeared:\n{process.stderr.read()[-3000:]}")
        if time.time() > deadline:
            process.kill()
            raise AssertionError(f"{marker} did not appear within {timeout} s")
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    if process.wait(timeout=120) != 128 + signal.SIGTERM:
        raise AssertionError(f"the interrupted run ended with {process.returncode}, not 143:\n"
                             f"{process.stderr.read()[-3000:]}")


def call_cli(module: str, *args: str) -> subprocess.CompletedProcess:
    """Run a script's `cli()` (what `python script.py` runs) in this process with `args` in sys.argv, and return its
    exit status, stdout and stderr as `subprocess.run` would: the same code path without paying the imports again.
    For tests of what a script says and refuses; use a subprocess where a fresh process is what the test is about."""
    import contextlib
    import importlib
    import io

    entry_point = importlib.import_module(module).cli
    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = [module.rsplit(".", 1)[-1] + ".py", *args]
    status = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            entry_point()
    except SystemExit as exit:
        status = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(sys.argv, status, out.getvalue(), err.getvalue())


def pretrain_env(**extra) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore", **extra}


def pretrain(*args, launcher=(sys.executable,), timeout=600, check=True, env=None):
    """Run `training/pretrain.py` in a subprocess; fail with its stderr unless `check=False`."""
    result = subprocess.run([*launcher, PRETRAIN, *args], capture_output=True, text=True, env=env or pretrain_env(),
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"pretrain failed ({result.returncode}):\n{result.stderr[-5000:]}")
    return result


def local_paths_in(folder, *roots) -> list[str]:
    """Files of a folder meant for the Hub that name a local absolute path: one of `roots` (e.g. the test's tmp
    dir), this repository, the user's home or a site-packages directory. Empty when the folder is clean."""
    import site
    from pathlib import Path

    needles = {str(r) for r in roots} | {str(Path(__file__).resolve().parents[1]), str(Path.home()), "site-packages",
                                         *site.getsitepackages()}
    found = []
    for path in Path(folder).rglob("*"):
        if path.is_file() and path.suffix in (".json", ".md", ".py", ".txt", ".yaml", ".yml", ".model"):
            text = path.read_text(errors="ignore")
            found += [f"{path.name}: {needle}" for needle in sorted(needles) if needle and needle in text]
    return found


def card_without_time(export: Path) -> str:
    """An export's card but for its wall-clock row (where the training time went), which two equal runs do not
    share; the card must have that row once."""
    lines = (Path(export) / "README.md").read_text().splitlines()
    assert sum(line.startswith("| time | waiting for data ") for line in lines) == 1
    return "\n".join(line for line in lines if not line.startswith("| time | "))
