"""One run per folder: an exclusive lock on a file in the folder, held for the whole run.

The lock is `filelock.FileLock`, an `flock` on Linux: the kernel releases it when its process ends, however it ends
(SIGKILL, a crash, a node reboot), so a killed run never leaves a stale lock behind. Next to the lock file a small JSON
names its holder (host, pid, start time, command) for the refusal message. Both files are hidden and stay in the
folder after the run; they are never a previous run's files.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

LOCK_NAME = ".encoder-zoo.lock"
HOLDER_SUFFIX = ".json"  # LOCK_NAME + this: who holds it
LOCK_FILES = (LOCK_NAME, LOCK_NAME + HOLDER_SUFFIX)

# Locks this process holds, by lock file: a process never competes with itself (a script's main() called twice).
_HELD: dict[str, object] = {}


class FolderInUse(FileExistsError):
    """Another live process holds the folder's lock."""


def _lock_path(folder: Path, name: str) -> Path:
    return Path(folder).resolve() / name


def holder_of(folder: Path, name: str = LOCK_NAME) -> str:
    """Who holds (or last held) `folder`'s lock, in words."""
    try:
        record = json.loads(_lock_path(folder, name + HOLDER_SUFFIX).read_text(encoding="utf-8"))
        return (f"pid {record['pid']} on {record['host']}, started {record['started']}"
                + (f": {record['command']}" if record.get("command") else ""))
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not recorded itself yet"


def try_hold(folder: Path, name: str = LOCK_NAME) -> bool:
    """Take `folder`'s lock if it is free (True) or already ours; False while another process holds it."""
    from filelock import FileLock, Timeout

    path = _lock_path(folder, name)
    if str(path) in _HELD:
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    _HELD[str(path)] = lock
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:500]}
    holder = path.with_name(name + HOLDER_SUFFIX)
    staged = holder.with_name(f"{holder.name}.{os.getpid()}")
    staged.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(staged, holder)
    return True


def hold(folder: Path, what: str = "--output_dir", name: str = LOCK_NAME) -> None:
    """Hold `folder`'s lock until `release` or the end of this process; refuse (FolderInUse) while another holds it."""
    if not try_hold(folder, name):
        raise FolderInUse(in_use_message(folder, what, name))


def in_use_message(folder: Path, what: str = "--output_dir", name: str = LOCK_NAME) -> str:
    return (f"{what} {folder} is in use by another run ({holder_of(folder, name)}). Wait for it to finish, or stop "
            f"it, or pass another {what}; two runs never write into one folder.")


def wait_and_hold(folder: Path, name: str, waiting_message) -> None:
    """Hold `folder`'s lock, waiting for its holder to finish first (`waiting_message(holder)` is called once)."""
    told = False
    while not try_hold(folder, name):
        if not told:
            waiting_message(holder_of(folder, name))
            told = True
        time.sleep(0.5)


def release(folder: Path, name: str = LOCK_NAME) -> None:
    lock = _HELD.pop(str(_lock_path(folder, name)), None)
    if lock is not None:
        lock.release()


def hold_run_folder(folder: Path, training_args, what: str = "--output_dir") -> None:
    """`hold` for a run of one or more processes (`accelerate launch`): the main process holds the lock for the whole
    launch, and every process stops with the same refusal when another run has it."""
    if training_args.world_size <= 1:
        return hold(folder, what)
    import torch
    import torch.distributed as dist

    refused = 0 if training_args.process_index != 0 else int(not try_hold(folder))
    if dist.is_available() and dist.is_initialized():
        flag = torch.tensor([refused], device=training_args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        refused = int(flag.item())
    if refused:
        raise FolderInUse(in_use_message(folder, what))
