"""Where a train step spends its time: torch.profiler over forward + backward + AdamW of one of our models and its
reference, built and fed exactly as bench_teams.py / bench_spanbert.py do. Prints, per model, the share of the
step taken by each top-level module's forward, the samplers, backward and the optimizer, and the top operators.

Shares within one profile hold on a loaded machine; absolute times do not (compare models by share, or use the
bench scripts for throughput).

    python bench/profile_step.py --pair teams [--size small] [--seq_length 128] [--batch_size 32] [--steps 2]
    python bench/profile_step.py --pair spanbert [--size small] [--seq_length 256] [--batch_size 16]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re

import torch
from torch.profiler import ProfilerActivity, profile, record_function

PAIRS = {"teams": ("teams", "hf_electra"), "electra": ("electra", "hf_electra_narrow"),
         "spanbert": ("spanbert", "bert_mlm")}


def label_modules(model: torch.nn.Module, depth: int = 3) -> None:
    """Wrap the forward of every module down to `depth` in a profiler range named by its path (layer indices as *,
    so the layers of a stack add up in one row)."""
    for name, module in model.named_modules():
        if not name or name.count(".") >= depth:
            continue
        label = "fwd:" + re.sub(r"\.\d+", ".*", name)
        ranges = []
        module.register_forward_pre_hook(lambda m, a, n=label, r=ranges: r.append(record_function(n).__enter__()))
        module.register_forward_hook(lambda m, a, o, r=ranges: r.pop().__exit__(None, None, None))


def label_samplers() -> None:
    """Profiler ranges around TEAMS's candidate and replacement sampling."""
    from encoder_zoo.models.teams import modeling_teams

    for name in ("sample_replacements", "sample_candidates"):
        original = getattr(modeling_teams, name)

        def wrapped(*args, _original=original, _name=name, **kwargs):
            with record_function(f"fwd:{_name}"):
                return _original(*args, **kwargs)

        setattr(modeling_teams, name, wrapped)


def profile_steps(model, batches, step_inputs, steps: int):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch, ranges: bool):
        region = record_function if ranges else (lambda name: contextlib.nullcontext())
        with region("step:forward"):
            output = model(**step_inputs(batch))
        loss = output if torch.is_tensor(output) else output.loss
        with region("step:backward"):
            loss.backward()
        with region("step:optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for batch in batches[:2]:  # warm-up
        step(batch, False)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for index in range(steps):
            step(batches[index % len(batches)], True)
    return prof.key_averages()


def shares(events, top: int) -> dict:
    step_total = sum(e.cpu_time_total for e in events if e.key.startswith("step:"))
    regions = {e.key: round(100 * e.cpu_time_total / step_total, 1) for e in events
               if e.key.startswith(("step:", "fwd:"))}
    operators = sorted((e for e in events if not e.key.startswith(("step:", "fwd:"))),
                       key=lambda e: -e.self_cpu_time_total)
    return {
        "step_ms": round(step_total / 1000, 1),
        "regions_percent": dict(sorted(regions.items(), key=lambda kv: -kv[1])),
        "top_ops_self_percent": {e.key: round(100 * e.self_cpu_time_total / step_total, 1) for e in operators[:top]},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=sorted(PAIRS), default="teams")
    parser.add_argument("--size", default="small", choices=["tiny", "small", "base", "large"])
    parser.add_argument("--seq_length", type=int, default=None, help="Default: the pair's bench script's (128 / 256).")
    parser.add_argument("--batch_size", type=int, default=None, help="Default: the pair's bench script's (32 / 16).")
    parser.add_argument("--steps", type=int, default=2, help="Profiled steps per model (after 2 warm-up steps).")
    parser.add_argument("--top", type=int, default=12, help="Operators listed per model.")
    options = parser.parse_args()

    if options.pair == "spanbert":
        import bench_spanbert as bench

        seq_length, batch_size, scheme = options.seq_length or 256, options.batch_size or 16, "span"
        step_inputs = {kind: (lambda batch, k=kind: bench.step_inputs(k, batch)) for kind in PAIRS["spanbert"]}
    else:
        import bench_teams as bench

        seq_length, batch_size, scheme = options.seq_length or 128, options.batch_size or 32, "subword"
        keys = ("input_ids", "attention_mask", "labels")
        step_inputs = {kind: (lambda batch: {k: batch[k] for k in keys}) for kind in PAIRS[options.pair]}
    from bench_spanbert import batches

    data = batches(seq_length, batch_size, 4, scheme=scheme)
    label_samplers()
    report = {"pair": options.pair, "size": options.size, "seq_length": seq_length, "batch_size": batch_size}
    for kind in PAIRS[options.pair]:
        model = bench.build(kind, options.size).train()
        label_modules(model)
        report[kind] = shares(profile_steps(model, data, step_inputs[kind], options.steps), options.top)
        del model
    from common import machine

    print(json.dumps({"machine": machine(), **report}, indent=2))


if __name__ == "__main__":
    main()
