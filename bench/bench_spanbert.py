"""Train-step throughput and peak memory: `SpanBertForPreTraining` (MLM + SBO, logits only at targets) vs
transformers' `BertForMaskedLM` (logits at every position), same encoder size, same span-masked batches, side by
side in one run. A train step is forward + backward + AdamW update.

    python bench/bench_spanbert.py [--size small] [--seq_length 256] [--batch_size 16] [--steps 10]
    python bench/bench_spanbert.py --size base --bf16            # on a GPU: tokens/s and MFU in bf16
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path

import torch
from common import device_and_dtype, timed_train_steps, train_step_parser, write_result

VOCAB = 30522  # the MiniLM tokenizer the batches come from (BERT-uncased WordPiece)
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16


def batches(seq_length, batch_size, count, seed=0, scheme="span"):
    """Masked batches of full-length blocks of real Wikipedia text (MiniLM's BERT WordPiece vocabulary)."""
    import datasets
    from transformers import AutoTokenizer

    from encoder_zoo.training.data.blocks import add_example_index, pack_blocks
    from encoder_zoo.training.data.corpus import load_corpus
    from encoder_zoo.training.data.resources import minilm_path
    from encoder_zoo.training.masking.spans import SpanMaskingCollator

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    texts = list(load_corpus(max_documents=3000)["text"])
    # Lead sections are short: join them so that blocks reach the full length being measured.
    joined = datasets.Dataset.from_dict({"text": [" ".join(texts[i : i + 20]) for i in range(0, len(texts), 20)]})
    blocks = add_example_index(pack_blocks(joined, tokenizer, max_seq_length=seq_length))
    full = [blocks[i] for i in range(len(blocks)) if len(blocks[i]["input_ids"]) >= 0.9 * seq_length]
    collator = SpanMaskingCollator(tokenizer, scheme=scheme, random_token_distribution="uniform",
                                   pad_to_multiple_of=None, span_boundary_targets=scheme != "subword", seed=seed)
    return [collator(full[i * batch_size : (i + 1) * batch_size]) for i in range(count)]


def build(kind, size):
    from transformers import BertConfig, BertForMaskedLM

    from encoder_zoo import models  # noqa: F401
    from encoder_zoo.models.spanbert.configuration_spanbert import SpanBertConfig
    from encoder_zoo.models.spanbert.modeling_spanbert import SpanBertForPreTraining
    from encoder_zoo.training.recipes.spanbert import BERT_SIZES

    dims = dict(BERT_SIZES[size], vocab_size=VOCAB, max_position_embeddings=512)
    torch.manual_seed(0)
    if kind == "spanbert":
        return SpanBertForPreTraining(SpanBertConfig(**dims))
    return BertForMaskedLM(BertConfig(**dims))


def step_inputs(kind, batch):
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "labels")}
    if kind == "spanbert":
        inputs.update(span_left=batch["span_left"], span_right=batch["span_right"])
    return inputs


def measure(kinds, size, data, steps, device, dtype):
    models_ = {kind: build(kind, size).to(device).train() for kind in kinds}
    stats = timed_train_steps(models_, data, steps, device, dtype, step_inputs)
    return ({kind: stats[kind]["tokens"] / stats[kind]["seconds"] for kind in kinds},
            {k: stats[k]["params"] for k in kinds})


def peak_memory(kind, options):
    """Peak memory of a few train steps of one model, in a process of its own (CPU: max RSS growth; GPU: allocator
    peak)."""
    command = [sys.executable, __file__, "--memory_of", kind, "--size", options.size,
               "--seq_length", str(options.seq_length), "--batch_size", str(options.batch_size)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return round(json.loads(out.stdout.strip().splitlines()[-1]), 1)


def report_memory(kind, options, device):
    data = batches(options.seq_length, options.batch_size, 2)
    gc.collect()
    # Reset the kernel's peak-RSS mark after data preparation, so the peak is the training steps'.
    Path("/proc/self/clear_refs").write_text("5")
    before = rss_kib("VmRSS")
    measure([kind], options.size, data, 2, device, torch.float32)
    if device.type == "cuda":
        print(json.dumps(torch.cuda.max_memory_allocated() / 2**20))
    else:
        print(json.dumps((rss_kib("VmHWM") - before) / 1024))


def rss_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def main():
    parser = train_step_parser(__doc__, seq_length=256, batch_size=16, steps=10)
    parser.add_argument("--memory_of", choices=["spanbert", "bert_mlm"], help=argparse.SUPPRESS)
    options = parser.parse_args()
    device, dtype = device_and_dtype(options)
    if options.memory_of:
        return report_memory(options.memory_of, options, device)

    data = batches(options.seq_length, options.batch_size, 4)
    masked = float(sum((b["labels"] != -100).sum() for b in data) / sum(b["attention_mask"].sum() for b in data))
    throughput, params = measure(["spanbert", "bert_mlm"], options.size, data, options.steps, device, dtype)
    result = {
        "size": options.size, "seq_length": options.seq_length, "batch_size": options.batch_size,
        "vocab_size": VOCAB, "masked_fraction": round(masked, 3), "device": str(device), "dtype": str(dtype),
        "spanbert_tokens_per_s": round(throughput["spanbert"], 1),
        "hf_bert_mlm_tokens_per_s": round(throughput["bert_mlm"], 1),
        "speedup": round(throughput["spanbert"] / throughput["bert_mlm"], 2),
        "spanbert_params_M": round(params["spanbert"] / 1e6, 2), "hf_bert_params_M": round(params["bert_mlm"] / 1e6, 2),
        "spanbert_peak_memory_MiB": peak_memory("spanbert", options),
        "hf_bert_peak_memory_MiB": peak_memory("bert_mlm", options),
    }
    if device.type == "cuda":
        # 6 * params * tokens for the dense model (the sparse heads only lower the true count): a conservative MFU.
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
        if peak:
            result["spanbert_mfu"] = round(6 * params["spanbert"] * throughput["spanbert"] / peak, 3)
    write_result(f"spanbert_{options.size}_{device.type}", result)


if __name__ == "__main__":
    main()
