"""The data path alone: tokens per second of its own examples that the training DataLoader hands one process, for P
= 1, 2 and 4 processes (rank 0 of P, simulated in this process), with 0, 1 and 2 packer/loader workers, for
`--streaming` (partitioned: each process packs its 1/P of the stream), the global stream it replaced (every process
packed everything: the 1/P fall) and `--pretokenized` (memory-mapped Arrow, each process reading its share).

What a process gets is masked batches, as pretrain.py's loader makes them: SpanBERT's collator (span masking, SBO
targets) over 512-token whole-sentence blocks, MiniLM's tokenizer, per-device batch 8, global batch 32, the stream in
16 shards and 8 partitions (two whole shards each), windows of 500 documents. Two corpora: the embedded Wikipedia
lead sections (about 100 tokens each: reading a document costs about as much as packing it) and articles of 7 of them
joined (about 700 tokens, a Wikipedia article's length). Each figure is the best of --repeats passes of
`--documents` documents' worth of the process's examples; the Rust tokenizer runs on one thread in every process, so
a packer is one core.

    python bench/bench_data.py [--documents 4000] [--repeats 2] [--partitions 8]
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per packer: per-core figures

import argparse
import itertools
import tempfile
import time

import datasets
import torch
from common import write_result
from transformers import AutoTokenizer

from encoder_zoo.training.data.blocks import add_example_index, block_packer, pack_blocks
from encoder_zoo.training.data.corpus import load_corpus
from encoder_zoo.training.data.resources import minilm_path
from encoder_zoo.training.data.streaming import (
    GLOBAL,
    PARTITIONED,
    PartitionedExamples,
    StreamedExamples,
    StreamSettings,
)
from encoder_zoo.training.masking.spans import SpanMaskingCollator

MICRO = 8
WINDOW = 500


def delivered(loader, batches: int) -> tuple[int, float]:
    """(tokens, seconds) of the loader's first `batches` batches (non-padding tokens), the loader's start included."""
    start = time.perf_counter()
    tokens = 0
    for batch in itertools.islice(iter(loader), batches):
        tokens += int(batch["attention_mask"].sum())
    return tokens, time.perf_counter() - start


def streaming_loader(kind: str, processes: int, workers: int, partitions: int, packer, collator, texts):
    documents = datasets.Dataset.from_dict({"text": texts}).to_iterable_dataset(num_shards=16)
    total = MICRO * 4
    if kind == PARTITIONED:
        settings = StreamSettings(seed=0, window_documents=WINDOW, world_size=processes, layout=PARTITIONED,
                                  partitions=partitions, global_batch=total)
        stream = PartitionedExamples(documents, packer, text_column="text", settings=settings, packers=workers)
    else:  # the global stream: every process packs every document and keeps its micro-batches
        settings = StreamSettings(seed=0, window_documents=WINDOW, world_size=processes, micro_batch=MICRO,
                                  layout=GLOBAL)
        stream = StreamedExamples(documents, packer, text_column="text", settings=settings)
    # As PretrainingTrainer.get_train_dataloader: handed out in this process, batch by batch.
    return torch.utils.data.DataLoader(stream, batch_size=MICRO, collate_fn=collator), stream


def pretokenized_loader(data, processes: int, workers: int, collator):
    # As Trainer's loader on rank 0 of P: a distributed sampler over the memory-mapped examples, workers collating.
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=processes, rank=0, shuffle=True, seed=0)
    return torch.utils.data.DataLoader(data, batch_size=MICRO, sampler=sampler, collate_fn=collator,
                                       num_workers=workers, persistent_workers=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=4000,
                        help="Documents' worth of examples each measured process takes (P = 1: all of them).")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=8, help="--stream_partitions (must divide 32).")
    options = parser.parse_args()
    datasets.disable_progress_bars()
    torch.set_num_threads(1)

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    packer = block_packer(tokenizer, 512)
    collator = SpanMaskingCollator(tokenizer, scheme="span", random_token_distribution="uniform", seed=0)
    sections = load_corpus()["text"]
    corpora = {"lead sections (about 100 tokens)": sections,
               "articles (7 lead sections joined, about 700 tokens)":
                   ["\n\n".join(sections[i : i + 7]) for i in range(0, len(sections) - 6, 7)]}
    rows = []
    for corpus_name, texts in corpora.items():
        rows += measure(corpus_name, texts, options, tokenizer, packer, collator)
    write_result("data", {
        "what": "tokens/s of its own masked batches that the training DataLoader hands rank 0 of P (non-padding "
                "tokens), best of repeats",
        "corpora": list(corpora), "tokenizer": "all-MiniLM-L6-v2 (fast, one thread)",
        "max_seq_length": 512, "per_device_batch": MICRO, "global_batch": MICRO * 4,
        "stream_partitions": options.partitions, "window_documents": WINDOW, "documents": options.documents,
        "rows": rows,
    })


def measure(corpus_name: str, texts: list[str], options, tokenizer, packer, collator) -> list[dict]:
    corpus = datasets.Dataset.from_dict({"text": texts})
    sample = min(len(texts), 1000)
    blocks_per_document = len(pack_blocks(corpus.select(range(sample)), tokenizer, 512)) / sample
    documents = min(options.documents, len(texts))
    batches_at_one = int(documents * blocks_per_document / MICRO)
    rows = []
    with tempfile.TemporaryDirectory() as folder:  # what training/pretokenize.py leaves: Arrow on disk
        add_example_index(pack_blocks(corpus, tokenizer, 512)).save_to_disk(folder)
        pretokenized = datasets.load_from_disk(folder).with_format(None)
        for processes in (1, 2, 4):
            batches = max(batches_at_one // processes, 8)
            for kind, workers_list in ((PARTITIONED, (0, 1, 2)), (GLOBAL, (0,)), ("pretokenized", (0, 1, 2))):
                for workers in workers_list:
                    best = None
                    for _ in range(options.repeats):
                        if kind == "pretokenized":
                            loader, stream = pretokenized_loader(pretokenized, processes, workers, collator), None
                        else:
                            loader, stream = streaming_loader(kind, processes, workers, options.partitions, packer,
                                                              collator, texts)
                        tokens, seconds = delivered(loader, batches)
                        if stream is not None:
                            stream.close()
                        rate = tokens / seconds
                        best = max(best or 0, rate)
                    name = {PARTITIONED: "--streaming (partitioned)", GLOBAL: "global stream (before)",
                            "pretokenized": "--pretokenized"}[kind]
                    rows.append({"corpus": corpus_name, "data": name, "processes": processes, "workers": workers,
                                 "batches": batches, "tokens_per_second": round(best)})
                    print(f"{corpus_name[:13]:13s} {name:26s} P={processes} workers={workers}: {best:,.0f} tokens/s "
                          "of its own examples", flush=True)
    return rows


if __name__ == "__main__":
    main()
