"""Preprocessing throughput in tokens per second per core: our block packing (SpanBERT's single-document blocks of
whole sentences, with word starts: `training.data.pack_blocks`, what `training/pretokenize.py` runs, and the same
packer fed by `--streaming`) vs transformers' `run_mlm.py` way (`tokenize` with `Dataset.map`, then `group_texts`
into fixed blocks across documents), on the same text with the same fast tokenizer, side by side in one run.

Each process is one core: `TOKENIZERS_PARALLELISM=false` keeps the Rust tokenizer on one thread, `--num_proc`
(default 1) runs that many `datasets` processes, and the figures are divided by it. Tokens are the word pieces of
the examples produced (special tokens included), measured over the best of `--repeats` interleaved passes.

    python bench/bench_preprocessing.py [--documents 3000] [--max_seq_length 512] [--num_proc 1] [--repeats 3]
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process: per-core figures

import argparse
import itertools
import time
from itertools import chain

import datasets
from common import write_result
from transformers import AutoTokenizer

from encoder_zoo.training.data.blocks import block_packer, pack_blocks
from encoder_zoo.training.data.corpus import load_corpus, stream_corpus
from encoder_zoo.training.data.resources import minilm_path
from encoder_zoo.training.data.streaming import StreamedExamples, StreamSettings


def run_mlm_way(corpus, tokenizer, block_size: int, num_proc: int | None):
    """transformers/examples/pytorch/language-modeling/run_mlm.py without --line_by_line."""

    def tokenize_function(examples):
        return tokenizer(examples["text"], return_special_tokens_mask=True)

    tokenized = corpus.map(tokenize_function, batched=True, num_proc=num_proc, remove_columns=corpus.column_names,
                           load_from_cache_file=False, desc="run_mlm.py: tokenize")

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated[list(examples.keys())[0]])
        total_length = (total_length // block_size) * block_size
        return {k: [t[i : i + block_size] for i in range(0, total_length, block_size)] for k, t in concatenated.items()}

    return tokenized.map(group_texts, batched=True, num_proc=num_proc, load_from_cache_file=False,
                         desc=f"run_mlm.py: group_texts ({block_size})")


def ours(corpus, tokenizer, block_size: int, num_proc: int | None):
    return pack_blocks(corpus, tokenizer, block_size, num_proc=num_proc)


def streamed(documents, tokenizer, block_size: int, examples: int):
    """The first `examples` blocks of `--streaming`'s stream (packing, window shuffle, example numbering)."""
    stream = StreamedExamples(documents, block_packer(tokenizer, block_size), text_column="text",
                              settings=StreamSettings(seed=0, window_documents=1000, world_size=1))
    return [example["input_ids"] for example in itertools.islice(iter(stream), examples)]


def tokens(blocks) -> int:
    return sum(len(ids) for ids in blocks)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=3000)
    parser.add_argument("--max_seq_length", type=int, default=512)
    parser.add_argument("--num_proc", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    datasets.disable_caching()
    datasets.disable_progress_bars()

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    tokenizer.model_max_length = 10**9  # run_mlm.py tokenizes whole documents, then groups
    corpus = load_corpus(max_documents=options.documents).select_columns(["text"])
    documents = stream_corpus(max_documents=options.documents)
    num_proc = options.num_proc if options.num_proc > 1 else None
    ours_blocks = ours(corpus, tokenizer, options.max_seq_length, num_proc)
    counts = {"ours (pack_blocks)": tokens(ours_blocks["input_ids"]),
              "run_mlm.py (map + group_texts)":
                  tokens(run_mlm_way(corpus, tokenizer, options.max_seq_length, num_proc)["input_ids"]),
              "ours (--streaming)": tokens(ours_blocks["input_ids"])}
    best = {name: float("inf") for name in counts}
    for _ in range(options.repeats):  # interleaved, so load on a shared machine hits all alike
        for name, run in (("ours (pack_blocks)", lambda: ours(corpus, tokenizer, options.max_seq_length, num_proc)),
                          ("run_mlm.py (map + group_texts)",
                           lambda: run_mlm_way(corpus, tokenizer, options.max_seq_length, num_proc)),
                          ("ours (--streaming)",
                           lambda: streamed(documents, tokenizer, options.max_seq_length, len(ours_blocks)))):
            if name == "ours (--streaming)" and num_proc:
                continue  # one stream per training process
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    cores = options.num_proc
    rates = {}
    for name, seconds in best.items():
        if seconds < float("inf"):
            per_core = counts[name] / seconds / (1 if name == "ours (--streaming)" else cores)
            rates[name] = {"tokens": counts[name], "seconds": round(seconds, 3),
                           "tokens_per_second_per_core": round(per_core)}
    reference = rates["run_mlm.py (map + group_texts)"]["tokens_per_second_per_core"]
    result = {
        "documents": options.documents, "max_seq_length": options.max_seq_length, "num_proc": options.num_proc,
        "tokenizer": "all-MiniLM-L6-v2 (BERT WordPiece, fast)", **rates,
        "ours_vs_run_mlm": round(rates["ours (pack_blocks)"]["tokens_per_second_per_core"] / reference, 2),
    }
    write_result("preprocessing", result)


if __name__ == "__main__":
    main()
