"""Where a sweep's runs come from: the machine and torch threads they ran on, the commit, the code they ran (a content
hash of the project's packages) and the content of the models they read (a hash of weights and config)."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The exit status of an entry point that refused its input (training.run.entry.run_cli, argparse): a value the sweep's
# command or budget gave the run, which running the same command again cannot change.
REFUSED = 2
# The packages the runs' entry points import: their .py files are the code a run ran.
CODE_PACKAGES = ("models", "training", "glue", "qa")
CODE_HASH_MEANING = f"a content hash of the .py files of {', '.join(p + '/' for p in CODE_PACKAGES)}"


@functools.cache
def code_hash() -> str:
    """A hash of the names and contents of every .py file of `CODE_PACKAGES`, computed once per process: the same
    without git, in a copy of the tree, in an installed package."""
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            digest.update(str(path.relative_to(REPO).as_posix()).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:12]


_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def file_hash(path: Path) -> str:
    """A file's content hash, computed once per (path, modification time, size) in this process."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _FILE_HASHES:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _FILE_HASHES[key] = digest.hexdigest()
    return _FILE_HASHES[key]


def model_files(folder: Path) -> list[Path]:
    """What a model folder's content is: its weights and its config (a tokenizer or a card do not change it)."""
    return sorted(folder.glob("*.safetensors")) + [p for p in [folder / "config.json"] if p.is_file()]


def model_hash(folder: Path) -> str | None:
    """A hash of a model folder's weights and config; None where it holds neither."""
    files = model_files(Path(folder))
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + file_hash(path).encode())
    return digest.hexdigest()[:16]


def torch_threads() -> int | None:
    """The intra-op threads of this process's torch, which the runs it starts inherit (through OMP_NUM_THREADS, or
    torch's default from the same cores)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.get_num_threads()


def machine(threads: dict | None = None) -> str:
    """The CPU, its cores, the torch threads per run (`threads`: a sweep's `run_threads`; runs not logged with theirs
    are taken to have this process's) and the GPU."""
    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    description = f"{cpu}, {os.cpu_count()} logical cores"
    # Two sweeps sharing 2 cores run one thread each (1.35x the throughput of one sweep on two threads for the tiny
    # models, measured): the wall times are those of the runs' thread count.
    counts = Counter()
    for n, runs in (threads or {None: 1}).items():
        counts[n if n is not None else torch_threads()] += runs
    if None not in counts:
        shares = [f"{n} torch thread(s) per run" + (f" ({runs} run{'s' * (runs != 1)})" if len(counts) > 1 else "")
                  for n, runs in sorted(counts.items())]
        description += ", " + " and ".join(shares)
    try:
        import torch

        if torch.cuda.is_available():
            description += f"; GPU: {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return description


def git_commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")
