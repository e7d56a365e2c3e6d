"""Masking throughput (examples/s): our vectorised span / whole-word collator vs transformers'
`DataCollatorForLanguageModeling(whole_word_mask=True)`, same tokenizer, same token sequences, measured side by side.

    python bench/bench_masking.py [--documents 2000] [--batch_size 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

from common import write_result
from transformers import AutoTokenizer, DataCollatorForLanguageModeling

from encoder_zoo.training.data.corpus import load_corpus
from encoder_zoo.training.data.resources import minilm_path
from encoder_zoo.training.masking.spans import SpanMaskingCollator


def throughput(collator, examples, batch_size, repeats):
    batches = [examples[i : i + batch_size] for i in range(0, len(examples), batch_size)]
    collator(batches[0])  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches:
            collator(batch)
        best = min(best, time.perf_counter() - start)
    return len(examples) / best


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    texts = list(load_corpus(max_documents=options.documents)["text"])
    encodings = tokenizer(texts, truncation=True, max_length=options.max_length, return_offsets_mapping=True,
                          return_special_tokens_mask=True)
    # transformers' tokenizer.pad cannot pad offset pairs: pre-pad each batch to its longest example, as ours pads.
    hf_examples = []
    for begin in range(0, len(texts), options.batch_size):
        chunk = range(begin, min(begin + options.batch_size, len(texts)))
        width = max(len(encodings["input_ids"][i]) for i in chunk)
        for i in chunk:
            missing = width - len(encodings["input_ids"][i])
            hf_examples.append({
                "input_ids": encodings["input_ids"][i] + [tokenizer.pad_token_id] * missing,
                "attention_mask": [1] * len(encodings["input_ids"][i]) + [0] * missing,
                "offset_mapping": encodings["offset_mapping"][i] + [(0, 0)] * missing,
                "special_tokens_mask": encodings["special_tokens_mask"][i] + [1] * missing,
            })
    ours_examples = []
    for index, ids in enumerate(encodings["input_ids"]):
        word_ids = encodings.word_ids(index)
        starts = [int(w is not None and (i == 0 or word_ids[i - 1] != w)) for i, w in enumerate(word_ids)]
        ours_examples.append({"input_ids": ids, "word_start": starts, "example_index": index})
    tokens = sum(len(ids) for ids in encodings["input_ids"])

    hf = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, whole_word_mask=True, seed=0)
    results = {"examples": len(texts), "mean_tokens_per_example": round(tokens / len(texts), 1),
               "batch_size": options.batch_size}
    results["hf_whole_word_examples_per_s"] = round(throughput(hf, hf_examples, options.batch_size, options.repeats), 1)
    for scheme in ("whole_word", "span", "subword"):
        ours = SpanMaskingCollator(tokenizer, scheme=scheme, random_token_distribution="uniform", seed=0)
        results[f"ours_{scheme}_examples_per_s"] = round(throughput(ours, ours_examples, options.batch_size,
                                                                    options.repeats), 1)
    for scheme in ("whole_word", "span"):
        results[f"speedup_{scheme}_vs_hf_whole_word"] = round(
            results[f"ours_{scheme}_examples_per_s"] / results["hf_whole_word_examples_per_s"], 2)
    # The HF collator forces 100% [MASK] with whole words; ours keeps 80/10/10 and builds SBO targets too.
    write_result("masking", results)


if __name__ == "__main__":
    main()
