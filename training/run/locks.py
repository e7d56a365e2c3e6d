"""One run per folder: an exclusive lock on a file in the folder, held for the whole run.

The lock is an `flock` (through `fcntl` on POSIX systems, `filelock.FileLock` elsewhere): the kernel releases it when
its process ends, however it ends (SIGKILL, a crash, a node reboot), so a killed run never leaves a stale lock behind.
Next to the lock file a small JSON names its holder (host, pid, start time, command) for the refusal message. Both
files are hidden, never a previous run's files, and are removed when the run ends (`release`, or at the exit of the
process): the holder unlinks them while it still holds the lock, and a process that locked the file just before it
was unlinked sees that its file is gone and takes the new one, so two runs never both hold a folder.
"""

from __future__ import annotations

import atexit
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


class _Flock:
    """An exclusive, non-blocking `flock` on a file that its holder removes on release (POSIX)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None
        self.pid = os.getpid()

    def acquire(self) -> bool:
        import errno
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                os.close(fd)
                if error.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    return False
                raise
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            if current is not None and os.path.samestat(os.fstat(fd), current):
                self.fd = fd
                return True
            os.close(fd)  # the holder unlinked this file while releasing it: lock the one at the path now

    def release(self, also_remove: tuple[Path, ...] = ()) -> None:
        import fcntl

        if self.fd is None:
            return
        if os.getpid() == self.pid:  # a forked child shares the lock: only the process that took it gives it up
            for path in (*also_remove, self.path):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def try_hold(folder: Path, name: str = LOCK_NAME) -> bool:
    """Take `folder`'s lock if it is free (True) or already ours; False while another process holds it."""
    path = _lock_path(folder, name)
    if str(path) in _HELD:
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl  # noqa: F401  (POSIX)

        lock = _Flock(path)
        if not lock.acquire():
            return False
    except ImportError:
        from filelock import FileLock, Timeout

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
    """Give up `folder`'s lock, if this process holds it, and remove its files (the holder record first)."""
    path = _lock_path(folder, name)
    _release(str(path), _HELD.pop(str(path), None))


def _release(path: str, lock) -> None:
    if isinstance(lock, _Flock):
        lock.release(also_remove=(Path(path + HOLDER_SUFFIX),))
    elif lock is not None:
        lock.release()


def _forget_locks_in_child() -> None:
    """A forked child (a DataLoader worker) closes its copies of the lock files: the lock stays its parent's alone, and
    a parent killed with SIGKILL frees the folder at once, not when its orphaned workers notice and exit."""
    for lock in _HELD.values():
        if isinstance(lock, _Flock) and lock.fd is not None:
            try:
                os.close(lock.fd)
            except OSError:
                pass
            lock.fd = None
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks_in_child)


@atexit.register
def _release_all() -> None:
    """A script that never calls `release` (or ends with an error) still leaves no lock files behind."""
    while _HELD:
        path, lock = _HELD.popitem()
        try:
            _release(path, lock)
        except OSError:
            pass


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
