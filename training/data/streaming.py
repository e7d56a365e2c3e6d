"""`--streaming`: pretraining text read as training needs it, from a `datasets` IterableDataset (a Hub id or local
files), packed into the recipe's examples on the fly, in an order that a seed fixes and a checkpoint restores.

Order. `datasets` shuffles the order of the corpus shards (files) every epoch (`shuffle(seed)`, `set_epoch`). The
examples packed from each window of `--shuffle_window_documents` consecutive documents are then shuffled together, by
a permutation keyed by (seed, epoch, window). The stream never ends: after the last document the next epoch begins,
so a run is measured in `--max_steps`.

Partitions (`PARTITIONED`, every new run). The stream is cut, when a run starts, into K partitions
(`--stream_partitions`, recorded with the stream's position): partition j holds the documents `datasets` gives node j
of K (`split_dataset_by_node`: whole shards when K divides the shard count, else every K-th document). Each partition
is packed on its own, its windows of ceil(W / K) documents shuffled as above, into a sequence of examples. With a
global batch of G = K x g, update k trains examples [k g, (k + 1) g) of every partition, in partition order. Process p
of P (P divides K) owns partitions [p K/P, (p + 1) K/P): it reads and packs only those, and its micro-batches are
slots [p G/P, (p + 1) G/P) of each update. So the examples of an update depend on K, not on the split into
processes x per-device batch x accumulation, and each process tokenizes 1/P of the documents.

Older layouts, still resumed as saved. `GLOBAL`: every process read the one global stream and kept its micro-batches
(global example i went to process (i // m) mod P), packing every document. `PER_PROCESS` (before that): each process
read its own part (`split_dataset_by_node` over the processes) and resumes on its own number of processes only.

Resume. With every checkpoint each process saves the position of each partition it owns (`stream_state-partition<j>
.json`; older layouts `stream_state-rank<N>.json`): the documents iterable's `state_dict()` at the start of a window,
the window's number and the examples handed out. `--resume_from_checkpoint` reloads that state (`load_state_dict`: the
shards and documents before it are not read again), packs that window again and skips to the saved count: training
continues with exactly the next example, on any number of processes that divides K and keeps the global batch. (A
shuffle buffer would not do: `datasets` does not save its content.)

Packing in parallel. `--dataloader_num_workers N` packs a window's documents in a pool of N processes
(`training.data.packer_pool`), a window ahead of training, while this process reads, orders and hands out the
examples: the examples and the saved position are the same for every N.

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

STATE_FILE = "stream_state-rank{rank}.json"  # the older layouts' positions, one per process
PARTITION_FILE = "stream_state-partition{partition}.json"
# How the stream is spread over the processes (`StreamSettings.layout`, module docstring).
PARTITIONED, GLOBAL, PER_PROCESS = "partitioned", "global", "per_process"
# The most partitions a default offers: more processes than this per run stream by an explicit --stream_partitions.
MAX_DEFAULT_PARTITIONS = 64


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
    window_digest: str | None = None  # PARTITIONED: the window's documents, checked when a resume reads them again


@dataclass(frozen=True)
class StreamSettings:
    """What a saved position is only valid with: a resumed run must stream the same way (`PARTITIONED`: the same
    seed, window, partitions and global batch, on any number of processes that divides the partitions; `GLOBAL`: the
    same seed and window, on any number of processes and per-device batch)."""

    seed: int
    window_documents: int
    world_size: int
    micro_batch: int = 1
    layout: str = GLOBAL
    partitions: int = 0  # PARTITIONED only
    global_batch: int = 0  # PARTITIONED only

    def fixed_keys(self) -> tuple[str, ...]:
        """The settings a resume must keep."""
        by_layout = {PER_PROCESS: ("world_size",), PARTITIONED: ("partitions", "global_batch")}
        return ("seed", "window_documents", "layout") + by_layout.get(self.layout, ())

    def same_stream(self, other: StreamSettings) -> bool:
        return all(getattr(self, key) == getattr(other, key) for key in self.fixed_keys())


def document_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def window_digest(texts: list[str]) -> str:
    """A window's documents, in order, as one hash (saved with a position, checked when a resume reads them again)."""
    digest = hashlib.blake2b(digest_size=16)
    for text in texts:
        digest.update(document_digest(text))
    return digest.hexdigest()


def document_texts(rows: Iterator[dict], text_column: str, held_out: frozenset[bytes] = frozenset()) -> Iterator[str]:
    """The non-empty texts of streamed rows, except held-out documents."""
    for row in rows:
        if text_column not in row:
            raise ValueError(f"Column {text_column!r} not found in the streamed dataset; its columns are "
                             f"{sorted(row)}. Pass --text_column with the column that holds the raw text.")
        text = row[text_column]
        if text and text.strip() and (not held_out or document_digest(text) not in held_out):
            yield text


class ExampleStream(torch.utils.data.IterableDataset):
    """A process's endless stream of packed training examples that saves its own position with each checkpoint
    (`save(checkpoint, consumed)`): Trainer neither shards nor skips it."""

    def save(self, checkpoint: Path, consumed: int | None = None) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop any packer processes."""


class StreamedExamples(ExampleStream):
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


# ---------------------------------------------------------------------------------------------- partitions
def partition_counts(partitions: int) -> list[int]:
    """The numbers of processes a stream of `partitions` partitions serves: those that divide it."""
    return [count for count in range(1, partitions + 1) if partitions % count == 0]


def default_partitions(global_batch: int, shards: int) -> int:
    """K, when --stream_partitions is not given: the largest count (at most `MAX_DEFAULT_PARTITIONS`) that divides
    the global batch and the corpus's shards, so each partition reads whole shards; where that leaves fewer than 8
    (a corpus of, say, 41 files), the largest divisor of the global batch up to 8, each partition then reading every
    K-th document of all shards (`datasets`' split by example)."""
    by_shards = max(d for d in range(1, min(global_batch, MAX_DEFAULT_PARTITIONS) + 1)
                    if global_batch % d == 0 and shards % d == 0)
    if by_shards >= min(8, global_batch):
        return by_shards
    return max(d for d in range(1, 9) if global_batch % d == 0)


def check_partitions(settings: StreamSettings, processes: int, flag: str = "--stream_partitions") -> None:
    """Refuse, in one line, a partition count that the global batch or the number of processes cannot use."""
    partitions, total = settings.partitions, settings.global_batch
    if partitions < 1 or total % partitions:
        raise ValueError(f"{flag} {partitions}: each update takes the same number of examples from every partition, "
                         f"so the count must divide the global batch of {total}; pass one of "
                         f"{', '.join(str(d) for d in partition_counts(total) if d <= MAX_DEFAULT_PARTITIONS)}.")
    if partitions % processes:
        raise ValueError(f"The stream has {partitions} partitions ({flag}), which {processes} processes cannot share: "
                         f"each process reads whole partitions. Run on "
                         f"{', '.join(str(c) for c in partition_counts(partitions))} processes"
                         f"{'' if flag != '--stream_partitions' else ', or start the run with another ' + flag}.")


def _partition_window(settings: StreamSettings) -> int:
    return -(-settings.window_documents // settings.partitions)


class _Partition:
    """One partition's endless sequence of examples (module docstring), from `start`. Its next window is read and
    handed to the packers as soon as this one is being handed out, so a pool packs it meanwhile."""

    def __init__(self, stream: PartitionedExamples, index: int, start: StreamPosition):
        self.stream, self.index, self.position = stream, index, start
        self._target = start.count  # restart at the window's start and skip to the saved example
        self._epoch, self._window, self._window_start = start.epoch, start.window, start.window_start
        self._documents = None
        self._empty_epoch = True

    def _next_window(self) -> tuple[int, int, dict | None, list]:
        """(epoch, window number, documents' state at its start, the chunks' futures) of the next window."""
        stream = self.stream
        while True:
            if self._documents is None:
                self._source = stream.documents_of(self.index, self._epoch, self._window_start)
                self._documents = document_texts(iter(self._source), stream.text_column, stream.held_out)
                self._from_start = self._window_start is None
            start = self._window_start
            texts = [text for _, text in zip(range(_partition_window(stream.settings)), self._documents)]
            if texts:
                self._empty_epoch = False
                window = (self._epoch, self._window, start, window_digest(texts), stream.pool.submit(texts))
                self._window, self._window_start = self._window + 1, self._source.state_dict()
                return window
            if self._from_start and self._empty_epoch:
                raise ValueError(f"Partition {self.index} of the stream's {stream.settings.partitions} got no "
                                 "document: the corpus has fewer non-empty documents (or shards) than partitions. "
                                 "Pass a smaller --stream_partitions, or stream a larger corpus.")
            self._epoch, self._window, self._window_start, self._documents = self._epoch + 1, 0, None, None
            self._empty_epoch = True

    def __iter__(self) -> Iterator[dict[str, Any]]:
        settings = self.stream.settings
        count = self.position.count - self.position.offset  # examples before the saved window
        upcoming = self._next_window()
        saved = self.position.window_digest
        if self._target and saved is not None and upcoming[3] != saved:
            raise ValueError(f"Partition {self.index} of the stream reads other documents at its saved position (epoch "
                             f"{self.position.epoch}, window {self.position.window}) than the run trained on: the "
                             "corpus changed since the checkpoint. Resume with the corpus the run was started on, or "
                             "start a new run (another --output_dir).")
        while True:
            epoch, window, start, digest, chunks = upcoming
            upcoming = self._next_window()  # read, and (in a pool) packed, while this window is handed out
            examples = [example for chunk in chunks for example in chunk.result()]
            order = np.random.default_rng([settings.seed, epoch, self.index, window, settings.partitions])
            for offset, position in enumerate(order.permutation(len(examples))):
                count += 1
                if count <= self._target:
                    continue  # trained before the resume
                self.position = StreamPosition(epoch=epoch, window=window, window_start=start, offset=offset + 1,
                                               count=count, window_digest=digest)
                yield examples[position]


class PartitionedExamples(ExampleStream):
    """Process `rank`'s examples of a partitioned stream (module docstring): the partitions it owns, `g` examples of
    each per update, indexed by their place in the global stream. `packer` turns a batch of documents
    `{"text": [...]}` into a batch of examples; `packers` processes pack in parallel (0: here). `starts` holds the
    saved positions of the partitions this process owns (`load_partition_positions`)."""

    def __init__(self, documents: datasets.IterableDataset, packer: Callable[[dict], dict], *, text_column: str,
                 settings: StreamSettings, rank: int = 0, held_out: frozenset[bytes] = frozenset(),
                 starts: dict[int, StreamPosition] | None = None, packers: int = 0, pack_batch_size: int = 64):
        from encoder_zoo.training.data.packer_pool import PackerPool

        check_partitions(settings, settings.world_size)
        self.documents = documents
        self.text_column = text_column
        self.settings = settings
        self.rank = rank
        self.held_out = held_out
        share = settings.partitions // settings.world_size
        self.owned = list(range(rank * share, (rank + 1) * share))
        self.positions = {j: (starts or {}).get(j) or StreamPosition() for j in self.owned}
        self.pool = PackerPool(packer, packers, pack_batch_size)

    def documents_of(self, partition: int, epoch: int, start: dict | None) -> datasets.IterableDataset:
        """Partition `partition`'s documents in `epoch`'s shard order, from `start` (a `state_dict()`)."""
        stream = split_dataset_by_node(self.documents.shuffle(seed=self.settings.seed, buffer_size=1),
                                       rank=partition, world_size=self.settings.partitions)
        stream.set_epoch(epoch)
        if start is not None:
            stream.load_state_dict(start)
        return stream

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("PartitionedExamples is iterated in the main process; --dataloader_num_workers sets "
                               "its pool of packers.")
        total, partitions = self.settings.global_batch, self.settings.partitions
        share = total // partitions  # examples per partition and update
        sequences = {j: _Partition(self, j, self.positions[j]) for j in self.owned}
        iterators = {j: iter(sequence) for j, sequence in sequences.items()}
        while True:  # updates
            for j in self.owned:
                for _ in range(share):
                    example = next(iterators[j])
                    n = sequences[j].position.count - 1
                    example[INDEX_COLUMN] = n // share * total + j * share + n % share
                    self.positions[j] = sequences[j].position
                    yield example

    def save(self, checkpoint: Path, consumed: int | None = None) -> None:
        """Write the positions of this process's partitions into `checkpoint`, at the `consumed` examples every
        process trained on together (steps x global batch): `consumed / K` of each partition."""
        for j in self.owned:
            position = self.positions[j]
            if consumed is not None:
                count = consumed // self.settings.partitions
                offset = count - (position.count - position.offset)
                if offset < 0 or count > position.count:
                    raise RuntimeError(f"Partition {j}'s position ({position.count} examples handed out) is not that "
                                       f"of the {consumed} examples trained on.")
                position = replace(position, count=count, offset=offset)
            record = {"settings": asdict(self.settings), "position": asdict(position)}
            (Path(checkpoint) / PARTITION_FILE.format(partition=j)).write_text(json.dumps(record))

    def close(self) -> None:
        self.pool.close()


def _read_record(path: Path) -> dict:
    """A stream state file, or one line naming it as damaged."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        StreamSettings(**record["settings"]), StreamPosition(**record["position"])
        return record
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is damaged ({type(error).__name__}: {error}); it holds the stream's position. Resume "
                         "from an earlier checkpoint (--resume_from_checkpoint OUTPUT_DIR/checkpoint-N).") from None


def saved_settings(checkpoint: str | Path) -> StreamSettings | None:
    """The stream settings `checkpoint` was saved with (None: no stream state there). A run from before the global
    stream saved none of `layout`: its processes each read their own part (`PER_PROCESS`), which is the global stream
    for one process."""
    for path in (Path(checkpoint) / PARTITION_FILE.format(partition=0), Path(checkpoint) / STATE_FILE.format(rank=0)):
        if path.is_file():
            saved = dict(_read_record(path)["settings"])
            saved.setdefault("layout", PER_PROCESS if saved.get("world_size", 1) > 1 else GLOBAL)
            return StreamSettings(**saved)
    return None


def _checked_settings(checkpoint: str | Path, settings: StreamSettings) -> StreamSettings:
    """`checkpoint`'s stream settings, refused in one line where they are not those a resume can continue."""
    saved = saved_settings(checkpoint)
    if saved is None:
        # The run's recorded flags say it streamed (a run resumed with another --streaming is refused before this).
        raise FileNotFoundError(f"{checkpoint} holds no stream position ({PARTITION_FILE.format(partition=0)}, or "
                                f"an older run's {STATE_FILE.format(rank=0)}): the checkpoint is incomplete. Resume "
                                "from an earlier checkpoint (--resume_from_checkpoint OUTPUT_DIR/checkpoint-N).")
    if not saved.same_stream(settings):
        changed = ", ".join(f"{key} {getattr(saved, key)} then, {getattr(settings, key)} now"
                            for key in saved.fixed_keys() if getattr(saved, key) != getattr(settings, key))
        each_own = (" and, for a run whose processes each streamed their own part, the same number of processes"
                    if saved.layout == PER_PROCESS else "")
        partitioned = " and --stream_partitions" if saved.layout == PARTITIONED else ""
        raise ValueError(f"{checkpoint} was saved by a stream read another way ({changed}); resume with the same "
                         f"--seed, --shuffle_window_documents{partitioned}{each_own}.")
    return saved


def load_position(checkpoint: str | Path, rank: int, settings: StreamSettings) -> StreamPosition:
    """The position an older layout's streaming run saved in `checkpoint` for process `rank` (any process's, in the
    global stream); refuses a checkpoint of another kind of run."""
    saved = _checked_settings(checkpoint, settings)
    path = Path(checkpoint) / STATE_FILE.format(rank=rank if saved.layout == PER_PROCESS else 0)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the checkpoint holds the stream's position of only some of its "
                                "processes. Resume from an earlier checkpoint.")
    return StreamPosition(**_read_record(path)["position"])


def load_partition_positions(checkpoint: str | Path, partitions: list[int],
                             settings: StreamSettings) -> dict[int, StreamPosition]:
    """The positions of `partitions` that a partitioned run saved in `checkpoint` (module docstring)."""
    _checked_settings(checkpoint, settings)
    positions = {}
    for j in partitions:
        path = Path(checkpoint) / PARTITION_FILE.format(partition=j)
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: the checkpoint holds the stream's position of only some of "
                                    "its partitions. Resume from an earlier checkpoint.")
        positions[j] = StreamPosition(**_read_record(path)["position"])
    return positions


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
