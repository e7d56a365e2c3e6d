"""Packing documents into examples in parallel (`--streaming --dataloader_num_workers N`): a pool of N processes, each
holding the recipe's packer, packs chunks of a window's documents while the training process trains.

The main process still reads the documents, keeps the stream's position and hands out the examples in order: a
window's chunks are packed wherever, and their examples are concatenated in chunk order, so N = 0, 1 or 2 give the
same examples in the same order, and a checkpoint saves the position of the examples trained on, whatever N is.
(DataLoader workers would each hold a copy of the stream and run ahead of what was trained.)
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Callable

import numpy as np

Packer = Callable[[dict], dict]
# The packer of this pool worker, set by `_start_worker` (inherited through fork: a closure need not pickle).
_WORKER_PACKER: Packer | None = None


def examples_of(columns: dict[str, list]) -> list[dict[str, Any]]:
    """A packer's batch of columns as one dict of int64 arrays per example."""
    names = list(columns)
    count = len(columns[names[0]]) if names else 0
    return [{name: np.asarray(columns[name][i], dtype=np.int64) for name in names} for i in range(count)]


def pack_chunk(packer: Packer, texts: list[str]) -> list[dict[str, Any]]:
    return examples_of(packer({"text": texts}))


def _start_worker(packer: Packer) -> None:
    global _WORKER_PACKER
    _WORKER_PACKER = packer
    # The training process saves and stops on SIGTERM/SIGINT, which a scheduler sends to the whole process group.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """A training process killed outright (SIGKILL, out of memory) cannot stop its pool: each worker leaves by itself
    once its parent is gone, instead of lingering with the packer's memory."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _pack_in_worker(texts: list[str]) -> list[dict[str, Any]]:
    return pack_chunk(_WORKER_PACKER, texts)


class _Done(Future):
    """A chunk packed lazily in this process (no pool): computed when its result is asked for."""

    def __init__(self, packer: Packer, texts: list[str]):
        super().__init__()
        self._work = (packer, texts)

    def result(self, timeout=None):
        if self._work is not None:
            packer, texts = self._work
            self._work = None
            self.set_result(pack_chunk(packer, texts))
        return super().result(timeout)


class PackerPool:
    """`submit(texts)` -> a list of futures, one per chunk of `chunk_documents` documents, whose results are the
    chunk's examples. With `workers` = 0 nothing runs ahead: each chunk is packed here when its result is read."""

    def __init__(self, packer: Packer, workers: int = 0, chunk_documents: int = 64):
        if workers < 0:
            raise ValueError(f"--dataloader_num_workers {workers}: pass 0 (pack in the training process) or more.")
        self.packer = packer
        self.workers = workers
        self.chunk_documents = chunk_documents
        self._executor: ProcessPoolExecutor | None = None

    def submit(self, texts: list[str]) -> list[Future]:
        chunks = [texts[begin : begin + self.chunk_documents] for begin in range(0, len(texts), self.chunk_documents)]
        if not self.workers:
            return [_Done(self.packer, chunk) for chunk in chunks]
        if self._executor is None:
            self._executor = self._start()
        return [self._executor.submit(_pack_in_worker, chunk) for chunk in chunks]

    def _start(self) -> ProcessPoolExecutor:
        # fork: the workers inherit the packer (a closure over the tokenizer, perhaps spaCy) without pickling it. The
        # fast tokenizer's own threads are not wanted in a worker: the pool is the parallelism.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("fork"),
                                   initializer=_start_worker, initargs=(self.packer,))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def __del__(self):
        self.close()
