"""Shared helpers for the benchmark scripts: machine description and result files."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    import torch

    info = {"cpu": platform.processor() or platform.machine(), **cpu_details(), "cores": os.cpu_count(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "platform": platform.platform(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def cpu_details() -> dict:
    """The CPU as lscpu names it (a VM may report only "AMD EPYC"): model name, vendor, family/model/stepping and
    the vector extensions the kernels use. CPU ratios vary with these, so every result records them."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return {}
    details = {"cpu_vendor": fields.get("vendor_id"),
               "cpu_family_model_stepping": "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping")),
               "cpu_vector_extensions": [flag for flag in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")
                                         if flag in fields.get("flags", "").split()]}
    if "model name" in fields:
        details["cpu"] = fields["model name"]
    return details


def write_result(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **result}, indent=2))
    print(json.dumps(result, indent=2))
    return path


def timed_train_steps(models: dict, data: list, steps: int, device, dtype, inputs_for=None) -> dict:
    """Interleaved train steps (forward + backward + AdamW) of several models on the same batches, after two warm-up
    steps, so load on a shared machine hits them alike. A model returns a ModelOutput with `.loss` or a loss tensor.

    Returns per model: `seconds`, `tokens` (non-padding input tokens), `targets` (labels != -100) and `params`.
    """
    import torch

    inputs_for = inputs_for or (lambda kind, batch: batch)
    # Fused AdamW, as pretrain.py's recipes run it (torch's default on CPU is a per-tensor loop).
    optimizers = {kind: torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True) for kind, model in models.items()}
    stats = {kind: {"seconds": 0.0, "tokens": 0, "targets": 0} for kind in models}
    for index in range(steps + 2):
        for kind, model in models.items():
            batch = {k: v.to(device) for k, v in inputs_for(kind, data[index % len(data)]).items()}
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                output = model(**batch)
            (output if torch.is_tensor(output) else output.loss).backward()
            optimizers[kind].step()
            optimizers[kind].zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if index >= 2:
                stats[kind]["seconds"] += time.perf_counter() - start
                stats[kind]["tokens"] += int(batch["attention_mask"].sum())
                stats[kind]["targets"] += int((batch["labels"] != -100).sum())
    for kind, model in models.items():
        stats[kind]["params"] = sum(p.numel() for p in model.parameters())
    return stats


def train_step_parser(description: str, seq_length: int, batch_size: int, steps: int) -> argparse.ArgumentParser:
    """The options every train-step benchmark shares (callers may add their own before parsing)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small", choices=["tiny", "small", "base", "large"])
    parser.add_argument("--seq_length", type=int, default=seq_length)
    parser.add_argument("--batch_size", type=int, default=batch_size)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    return parser


def device_and_dtype(options):
    """The GPU when there is one, and bf16 autocast when `--bf16` asks for it."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return device, torch.bfloat16 if options.bf16 else torch.float32


def fine_tuned_accuracy(model, encode, train, validation, seed: int, epochs: int, batch_size: int, lr: float,
                        warmup_fraction: float) -> float:
    """Validation accuracy of `model` after `fine_tuned_logits`' fine-tuning."""
    return accuracy(fine_tuned_logits(model, encode, train, validation, seed, epochs, batch_size, lr, warmup_fraction),
                    validation)


def accuracy(logits, rows) -> float:
    """Share of `rows` (with "label") whose label is the argmax of its `(N, labels)` logits."""
    import torch

    return float((logits.argmax(-1) == torch.tensor(rows["label"])).float().mean())


def fine_tuned_logits(model, encode, train, validation, seed: int, epochs: int, batch_size: int, lr: float,
                      warmup_fraction: float):
    """Validation logits `(N, labels)` of `model` (a sequence classifier) after fine-tuning on `train` (rows with
    "label"): AdamW (weight decay 0.01) over its trainable parameters, linear warmup then decay, clipping at 1, seeded
    order; `encode(rows)` turns a slice of rows into model inputs. The same loop for every arm of a comparison."""
    import torch

    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(seed)
    total = epochs * (len(train) // batch_size)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / (warmup_fraction * total)) * max(0.0, (total - s) / total))
    for _ in range(epochs):
        order = torch.randperm(len(train), generator=generator).tolist()
        for begin in range(0, len(order) - batch_size + 1, batch_size):
            rows = train[order[begin : begin + batch_size]]
            model(**encode(rows), labels=torch.tensor(rows["label"])).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        return torch.cat([model(**encode(validation[begin : begin + 64])).logits.float()
                          for begin in range(0, len(validation), 64)])
