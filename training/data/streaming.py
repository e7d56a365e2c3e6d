"""`--streaming`: pretraining text read as training needs it, from a `datasets` IterableDataset (a Hub id or local
files), packed into the recipe's examples on the fly, in an order that a seed fixes and a checkpoint restores.

Order. `datasets` shuffles the order of the corpus shards (files) every epoch (`shuffle(seed)`, `set_epoch`). The
examples packed from each window of `--shuffle_window_documents` consecutive documents are then shuffled together, by
a permutation keyed by (seed, epoch, window). The stream never ends: after the last document the next epoch begins,
so a run is measured in `--max_steps`.

One global stream (`GLOBAL`). Every process reads the whole stream and keeps its own micro-batches of it: with
per-device batch m over P processes, global example i goes to process (i // m) mod P, so update k trains global
examples [k x global batch, (k + 1) x global batch) however the global batch is split, as in-memory runs do. (Every
process packs every document: reading is P times the work of one process, training is not.)

Resume. With every checkpoint each process saves `stream_state-rank<N>.json`: the documents iterable's
`state_dict()` at the start of a window, the window's number, and the global count of examples the run trained on
(steps x global batch). `--resume_from_checkpoint` reloads that state (`load_state_dict`: the shards and documents
before it are not read again), packs that window again and skips to the count: training continues with exactly the
next example, on any number of processes and per-device batch that keep the global batch. (A shuffle buffer would
not do: `datasets` does not save its content.) Runs saved before the global stream (`PER_PROCESS`: each process read
its own part, `split_dataset_by_node`) resume that way, on their own number of processes only.

Masks. An example's index (the collators' `example_index`) is its place in the global stream, counted across epochs:
masks stay a pure function of (seed, index), differ in every epoch (each pass gives new indices) and are the same
after a restart, whatever the number of processes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import datasets
import numpy as np
import torch
from datasets.distributed import split_dataset_by_node
from transformers import TrainerCallback

from encoder_zoo.training.masking.spans import INDEX_COLUMN

logger = logging.getLogger("pretrain")

STATE_FILE = "stream_state-rank{rank}.json"
# How the stream is spread over the processes (`StreamSettings.layout`, module docstring).
GLOBAL, PER_PROCESS = "global", "per_process"


class _NoLostBufferWarning(logging.Filter):
    """`shuffle(buffer_size=1)` (shard order only) holds no example between two reads, so a restored state loses
    none: drop datasets' warning that a shuffle buffer's content was not saved."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "shuffle buffer" not in record.getMessage()


logging.getLogger("datasets.iterable_dataset").addFilter(_NoLostBufferWarning())


@dataclass
class StreamPosition:
    """Where one process's stream stands: the next example is the `offset`-th of window `window` of `epoch`, whose
    documents start at `window_start` (the documents' `state_dict()`; None: the start of the epoch). `count`
    examples were handed out before it."""

    epoch: int = 0
    window: int = 0
    window_start: dict | None = None
    offset: int = 0
    count: int = 0


@dataclass(frozen=True)
class StreamSettings:
    """What a saved position is only valid with: a resumed run must stream the same way (`GLOBAL`: with the same seed
    and window, on any number of processes and per-device batch)."""

    seed: int
    window_documents: int
    world_size: int
    micro_batch: int = 1
    layout: str = GLOBAL

    def same_stream(self, other: StreamSettings) -> bool:
        fixed = ("seed", "window_documents", "layout") + (("world_size",) if self.layout == PER_PROCESS else ())
        return all(getattr(self, key) == getattr(other, key) for key in fixed)


def document_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def document_texts(rows: Iterator[dict], text_column: str, held_out: frozenset[bytes] = frozenset()) -> Iterator[str]:
    """The non-empty texts of streamed rows, except held-out documents."""
    for row in rows:
        if text_column not in row:
            raise ValueError(f"Column {text_column!r} not found in the streamed dataset; its columns are "
                             f"{sorted(row)}. Pass --text_column with the column that holds the raw text.")
        text = row[text_column]
        if text and text.strip() and (not held_out or document_digest(text) not in held_out):
            yield text


class StreamedExamples(torch.utils.data.IterableDataset):
    """One process's endless stream of packed examples (see the module docstring). `packer` turns a batch of
    documents `{"text": [...]}` into a batch of examples (e.g. `training.data.block_packer`); `held_out` holds the
    digests of documents kept for evaluation, which training skips. Iterate it in the main process (DataLoader
    workers would each hold a copy of the position): `position` is then where the examples handed out so far end."""

    def __init__(self, documents: datasets.IterableDataset, packer: Callable[[dict], dict], *, text_column: str,
                 settings: StreamSettings, rank: int = 0, held_out: frozenset[bytes] = frozenset(),
                 start: StreamPosition | None = None, pack_batch_size: int = 64):
        self.documents = documents
        self.packer = packer
        self.text_column = text_column
        self.settings = settings
        self.rank = rank
        self.held_out = held_out
        self.position = start or StreamPosition()
        self.pack_batch_size = pack_batch_size

    # ------------------------------------------------------------------ documents
    def _documents_of(self, epoch: int, start: dict | None) -> datasets.IterableDataset:
        """The documents in `epoch`'s shard order (this process's part of them in the `PER_PROCESS` layout), from
        `start` (a `state_dict()`) or the beginning."""
        stream = self.documents.shuffle(seed=self.settings.seed, buffer_size=1)
        if self.settings.layout == PER_PROCESS:
            stream = split_dataset_by_node(stream, rank=self.rank, world_size=self.settings.world_size)
        stream.set_epoch(epoch)
        if start is not None:
            stream.load_state_dict(start)
        return stream

    def _window_examples(self, texts: list[str], epoch: int, window: int) -> list[dict[str, Any]]:
        """The examples packed from one window's documents, in the window's shuffled order."""
        columns: dict[str, list] = {}
        for begin in range(0, len(texts), self.pack_batch_size):
            for name, values in self.packer({"text": texts[begin : begin + self.pack_batch_size]}).items():
                columns.setdefault(name, []).extend(values)
        names = list(columns)
        count = len(columns[names[0]]) if names else 0
        examples = [{name: np.asarray(columns[name][i], dtype=np.int64) for name in names} for i in range(count)]
        # (The key keeps a rank slot, 0 for the global stream: a one-process run of either layout is the same stream.)
        rank = self.rank if self.settings.layout == PER_PROCESS else 0
        order = np.random.default_rng([self.settings.seed, epoch, rank, window]).permutation(count)
        return [examples[i] for i in order]

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[dict[str, Any]]:
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("StreamedExamples must be iterated in the main process (--dataloader_num_workers 0).")
        position = replace(self.position)
        world, window_documents = self.settings.world_size, self.settings.window_documents
        per_process = self.settings.layout == PER_PROCESS
        micro = self.settings.micro_batch
        # The global stream restarts at its window and skips to `count` (which may lie in a later window).
        target, position = position.count, replace(position, count=position.count - position.offset, offset=0)
        while True:  # epochs
            stream = self._documents_of(position.epoch, position.window_start)
            texts = document_texts(iter(stream), self.text_column, self.held_out)
            whole_epoch, count_before = position.window_start is None and position.count >= target, position.count
            while True:  # windows
                window_texts = [text for _, text in zip(range(window_documents), texts)]
                if not window_texts:
                    break
                next_start = stream.state_dict()  # before the next window's first document
                examples = self._window_examples(window_texts, position.epoch, position.window)
                for offset, example in enumerate(examples):
                    index = position.count
                    position = replace(position, offset=offset + 1, count=index + 1)
                    if index < target or (not per_process and (index // micro) % world != self.rank):
                        continue  # trained before the resume, or another process's
                    example[INDEX_COLUMN] = index * world + self.rank if per_process else index
                    self.position = position
                    yield example
                position = replace(position, window=position.window + 1, window_start=next_start, offset=0)
                if position.count > target:
                    self.position = position
            if whole_epoch and position.count == count_before:
                raise ValueError("The streamed corpus gave no training example for this process: it has no "
                                 "non-empty document (or fewer documents than processes).")
            position = StreamPosition(epoch=position.epoch + 1, count=position.count)
            self.position = position

    # ------------------------------------------------------------------ checkpoints
    def save(self, checkpoint: Path, consumed: int | None = None) -> None:
        """Write the stream's position into `checkpoint`: this process's (`PER_PROCESS`), or, in the global stream,
        that of the `consumed` examples every process trained on together (steps x global batch)."""
        position = self.position
        if self.settings.layout == GLOBAL and consumed is not None:
            # This process stopped after its last example (before `consumed`): its window starts at or before it.
            position = replace(position, count=consumed, offset=consumed - (position.count - position.offset))
        record = {"settings": asdict(self.settings), "position": asdict(position)}
        (Path(checkpoint) / STATE_FILE.format(rank=self.rank)).write_text(json.dumps(record))


def saved_settings(checkpoint: str | Path) -> StreamSettings | None:
    """The stream settings `checkpoint` was saved with (None: no stream state there). A run from before the global
    stream saved none of `layout`: its processes each read their own part (`PER_PROCESS`), which is the global stream
    for one process."""
    path = Path(checkpoint) / STATE_FILE.format(rank=0)
    if not path.is_file():
        return None
    saved = dict(json.loads(path.read_text())["settings"])
    saved.setdefault("layout", PER_PROCESS if saved.get("world_size", 1) > 1 else GLOBAL)
    return StreamSettings(**saved)


def load_position(checkpoint: str | Path, rank: int, settings: StreamSettings) -> StreamPosition:
    """The position a streaming run saved in `checkpoint` for process `rank` (any process's, in the global stream);
    refuses a checkpoint of another kind of run."""
    saved = saved_settings(checkpoint)
    if saved is None:
        raise FileNotFoundError(f"{checkpoint} has no {STATE_FILE.format(rank=0)}: it was not saved by a --streaming "
                                "run. Resume it without --streaming, or start a new run.")
    if not saved.same_stream(settings):
        keys = ("seed", "window_documents", "layout") + (("world_size",) if saved.layout == PER_PROCESS else ())
        changed = ", ".join(f"{key} {getattr(saved, key)} then, {getattr(settings, key)} now"
                            for key in keys if getattr(saved, key) != getattr(settings, key))
        each_own = (" and, for a run whose processes each streamed their own part, the same number of processes"
                    if saved.layout == PER_PROCESS else "")
        raise ValueError(f"{checkpoint} was saved by a stream read another way ({changed}); resume with the same "
                         f"--seed and --shuffle_window_documents{each_own}.")
    path = Path(checkpoint) / STATE_FILE.format(rank=rank if saved.layout == PER_PROCESS else 0)
    return StreamPosition(**json.loads(path.read_text())["position"])


class StreamEpoch(TrainerCallback):
    """Trainer counts a stream's steps as one long epoch and restarts that count after a resume (it skips no
    batch: the stream resumes itself). Log `epoch` as the fraction of the run done, as an uninterrupted run does."""

    def on_step_end(self, args, state, control, **kwargs):
        state.epoch = state.global_step / state.max_steps


def streamable(recipe) -> bool:
    """Whether `recipe`'s examples can be packed document by document (see `Recipe.document_packer`)."""
    return recipe.document_packer is not None or recipe.build_dataset is None


def document_packer(recipe, tokenizer, args) -> Callable[[dict], dict]:
    """The batch function that packs documents into `recipe`'s examples, as its in-memory builder does."""
    from encoder_zoo.training.data.blocks import block_packer
    from encoder_zoo.training.masking.spans import LINGUISTIC_SCHEMES

    if recipe.document_packer is not None:
        return recipe.document_packer(tokenizer, args)
    annotate = args.masking_scheme if args.masking_scheme in LINGUISTIC_SCHEMES else None
    return block_packer(tokenizer, args.max_seq_length, annotate, args.spacy_model)


def read_stream_head(args) -> tuple[datasets.IterableDataset, datasets.Dataset | None, datasets.Dataset]:
    """The `--dataset` stream, its first `--validation_documents` non-empty documents (held out: training skips
    them) and the next `--streaming_sample_documents` (a training sample for the tokenizer and the unigram law)."""
    from tqdm.auto import tqdm

    from encoder_zoo.training.data.corpus import stream_corpus

    documents = stream_corpus(args.dataset, args.dataset_config, args.dataset_split, args.max_documents)
    n_validation = args.validation_documents
    if args.max_documents is not None:
        n_validation = min(n_validation, args.max_documents // 10)
    wanted = n_validation + args.streaming_sample_documents
    texts = tqdm(document_texts(iter(documents), args.text_column), total=wanted, desc="Reading the head of the stream",
                 unit=" documents")
    head = [text for _, text in zip(range(wanted), texts)]
    texts.close()
    if len(head) <= n_validation:
        raise ValueError(f"The stream {args.dataset!r} has {len(head)} non-empty documents: too few to hold out "
                         f"{n_validation} for evaluation and train on the rest. Lower --validation_documents.")
    validation = datasets.Dataset.from_dict({"text": head[:n_validation]}) if n_validation else None
    return documents, validation, datasets.Dataset.from_dict({"text": head[n_validation:]})
