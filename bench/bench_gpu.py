"""GPU throughput of pretraining train steps (forward + backward + optimizer update): every zoo recipe next to its
transformers reference, in one run, on the same batches of real Wikipedia text. Reports tokens/s, MFU and peak memory.

    python bench/bench_gpu.py                      # on a GPU: base size, sequence lengths 512 and 128, bf16
    python bench/bench_gpu.py --pairs spanbert bert --seq_lengths 512 --compile both
    python bench/bench_gpu.py --smoke              # anywhere, CPU included: tiny sizes, 2 steps, writes nothing
    python bench/bench_gpu.py --variants base unpad+buffer   # our side with and without the GPU levers

Pairs (ours | reference):
  spanbert  SpanBertForPreTraining, MLM + SBO on span masking  | transformers' BertForMaskedLM (SDPA)
  bert      the same model without SBO, subword masking        | BertForMaskedLM
  teams     TeamsForPreTraining (MLM + RTD + MWS)              | ElectraForMaskedLM + ElectraForPreTraining
                                                                 at TEAMS's sizes
  electra   TeamsForPreTraining as `--model electra`           | the same transformers pair with ELECTRA's narrow
                                                                 generator
  cloze     TwoTowerCloze (two towers, every token a target)   | BertForMaskedLM of the same depth and width per tower
(the pairs of bench_spanbert.py, bench_teams.py and bench_cloze.py, at GPU sizes).

Our side uses the levers pretrain.py offers: `--attn_implementation` (default flash_attention_2 when the flash-attn
package is installed, else sdpa), `--packing` (padding-free rows; default on with a varlen attention kernel),
torch.compile (`--compile ours`, the default on a GPU), fused AdamW and bf16 autocast. The reference runs as
transformers ships it: SDPA on padded batches, with the same optimizer and autocast (`--compile both` compiles it too).

`--variants` times our side once per set of GPU levers (--unpad, --target_buffer), each next to the same reference:
  base         our side as above
  buffer       the fixed-size target buffer (`pretrain.py --target_buffer`): no data-dependent shape, no host sync
  unpad        the unpadded encoder (`pretrain.py --unpad`): rows packed on the host, attention through `sdpa_varlen`
               (PyTorch's varlen flash kernel in bf16 on a GPU)
  unpad+buffer both
  buffer+cudagraphs  the buffer with every batch padded to the full length (one shape), compiled whole with
               mode="reduce-overhead" (CUDA graphs)
A variant's columns are `ours[<variant>]_*` (base: `ours_*`).

Each model is timed on its own (build, warm-up steps that include compilation, then `--steps` timed steps), one after
the other in this process. Peak memory is the allocator's peak during the timed steps (GPU only: weights, gradients,
optimizer state and activations; the other model of the pair is freed before).

MFU = model FLOPs per second / the GPU's peak. Model FLOPs are counted as a pretraining run counts them for its
trainer_state.json's `total_flos` (`training/run/flops.py`, whose docstring states the count: PaLM appendix B, as
nanoGPT's `estimate_mfu`, for the work each model really does: real tokens only, each sequence attending over its own
length, vocabulary logits only where a model computes them, feed-forward blocks only where they run), with the same
formulas for the references: BertForMaskedLM and ElectraForMaskedLM compute vocabulary logits at every token.
`tests/test_bench_gpu.py` checks the count against torch's FlopCounterMode.
The peak is `--peak_tflops`, by default the GPU's dense bf16 peak (H100/H200 SXM: 989 TFLOP/s).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import time
from pathlib import Path

import torch
from common import RESULTS, machine

from encoder_zoo.training.recipes import train_step_flops as zoo_train_step_flops
from encoder_zoo.training.run.flops import dense, layer, sequence_lengths

VOCAB = 30522  # the MiniLM tokenizer the batches come from (BERT-uncased WordPiece)
# Dense bf16 peaks (no sparsity) per device name fragment, TFLOP/s.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
PAIRS = {  # pair -> (ours, reference, masking scheme)
    "spanbert": ("spanbert", "hf_bert_mlm", "span"),
    "bert": ("bert", "hf_bert_mlm", "subword"),
    "teams": ("teams", "hf_electra", "subword"),
    "electra": ("electra", "hf_electra_narrow", "subword"),
    "cloze": ("cloze", "hf_bert_mlm_cloze", "subword"),
}
PACKABLE = ("spanbert", "bert", "teams", "electra")
VARIANTS = ("base", "buffer", "unpad", "unpad+buffer", "buffer+cudagraphs")


# ---------------------------------------------------------------------------------------------------- data
@functools.lru_cache(maxsize=None)
def blocks(seq_length: int, documents: int, seed: int = 0):
    """Real Wikipedia blocks as pretrain.py builds them: one document per block, so a document's last block is shorter
    (the padding that packing removes). Lead sections are joined 20 at a time into documents of a few thousand
    tokens. Returns the tokenizer and the shuffled blocks."""
    import datasets
    from transformers import AutoTokenizer

    from encoder_zoo.training.data.blocks import add_example_index, pack_blocks
    from encoder_zoo.training.data.corpus import load_corpus
    from encoder_zoo.training.data.resources import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    texts = list(load_corpus(max_documents=documents)["text"])
    joined = datasets.Dataset.from_dict({"text": [" ".join(texts[i : i + 20]) for i in range(0, len(texts), 20)]})
    return tokenizer, add_example_index(pack_blocks(joined, tokenizer, max_seq_length=seq_length)).shuffle(seed=seed)


def batches(seq_length: int, batch_size: int, count: int, scheme: str, documents: int, seed: int = 0,
            full_width: bool = False) -> list[dict]:
    """`count` masked, right-padded batches of `batch_size` blocks (see `blocks`), with their target buffers
    (`target_positions`); `full_width`: every batch padded to `seq_length` (one shape for CUDA graphs)."""
    from encoder_zoo.training.masking.spans import SpanMaskingCollator

    tokenizer, examples = blocks(seq_length, documents, seed)
    collator = SpanMaskingCollator(tokenizer, scheme=scheme, random_token_distribution="uniform", seed=seed,
                                   span_boundary_targets=scheme == "span", target_buffer=True,
                                   pad_to_multiple_of=seq_length if full_width else 8)
    count = min(count, len(examples) // batch_size)
    if count == 0:
        raise ValueError(f"{len(examples)} blocks fill no batch of {batch_size}: raise --documents.")
    return [collator([examples[i] for i in range(k * batch_size, (k + 1) * batch_size)]) for k in range(count)]


def step_inputs(kind: str, batch: dict, packing: bool, buffer: bool = False) -> dict:
    """What `kind`'s forward reads from a masked batch (packed into one row for our packable models; with the target
    buffer for them when `buffer`)."""
    from encoder_zoo.training.data.packing import pack_batch

    if kind == "cloze":  # reads the text unmasked and predicts every real token but the leading marker
        original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
        labels = original.masked_fill(batch["attention_mask"] == 0, -100)
        labels[:, 0] = -100
        return {"input_ids": original, "attention_mask": batch["attention_mask"], "labels": labels}
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "labels")}
    if kind == "spanbert":
        inputs.update(span_left=batch["span_left"], span_right=batch["span_right"])
    if buffer and kind in PACKABLE:
        inputs["target_positions"] = batch["target_positions"]
    return pack_batch(inputs) if packing and kind in PACKABLE else inputs


# ---------------------------------------------------------------------------------------------------- models
def build(kind: str, size: str, attn: str | None, unpad: bool = False):
    """A freshly initialised model of `kind` at `size` (`attn`: our models' attention implementation; `unpad`: our
    packable models' config.unpad, which makes SDPA its varlen form)."""
    from bench_teams import HfElectraStep
    from transformers import BertConfig, BertForMaskedLM, ElectraConfig

    from encoder_zoo import models  # noqa: F401
    from encoder_zoo.models.cloze.configuration_cloze import TwoTowerClozeConfig
    from encoder_zoo.models.cloze.modeling_cloze import TwoTowerCloze
    from encoder_zoo.models.spanbert.configuration_spanbert import SpanBertConfig
    from encoder_zoo.models.spanbert.modeling_spanbert import SpanBertForPreTraining
    from encoder_zoo.models.teams.configuration_teams import TeamsConfig
    from encoder_zoo.models.teams.modeling_teams import TeamsForPreTraining
    from encoder_zoo.training.recipes.cloze import CLOZE_SIZES
    from encoder_zoo.training.recipes.spanbert import BERT_SIZES
    from encoder_zoo.training.recipes.spanbert import RECIPES as SPANBERT_RECIPES
    from encoder_zoo.training.recipes.teams import RECIPES as TEAMS_RECIPES

    torch.manual_seed(0)
    shared = dict(vocab_size=VOCAB, max_position_embeddings=512, **({"unpad": True} if unpad else {}))
    if kind in ("hf_bert_mlm", "hf_bert_mlm_cloze", "cloze", "hf_electra", "hf_electra_narrow"):
        shared.pop("unpad", None)
    if kind in ("spanbert", "bert"):
        config = SpanBertConfig(**BERT_SIZES[size], **shared, **SPANBERT_RECIPES[kind].config_overrides)
        config._attn_implementation = attn
        return SpanBertForPreTraining(config)
    if kind == "hf_bert_mlm":
        return BertForMaskedLM(BertConfig(**BERT_SIZES[size], **shared))
    if kind == "cloze":
        return TwoTowerCloze(TwoTowerClozeConfig(**CLOZE_SIZES[size], **shared))
    if kind == "hf_bert_mlm_cloze":
        dims = CLOZE_SIZES[size]
        return BertForMaskedLM(BertConfig(**shared, **{k: dims[k] for k in ("hidden_size", "num_hidden_layers",
                                                                          "num_attention_heads", "intermediate_size")}))
    recipe = TEAMS_RECIPES["electra" if kind in ("electra", "hf_electra_narrow") else "teams"]
    config = TeamsConfig(**recipe.sizes[size], **shared, **recipe.config_overrides)
    if kind in ("teams", "electra"):
        config._attn_implementation = attn
        return TeamsForPreTraining(config)
    generator = ElectraConfig(**shared, embedding_size=config.embedding_size, hidden_size=config.generator_hidden_size,
                              num_hidden_layers=config.generator_num_hidden_layers,
                              num_attention_heads=config.generator_num_attention_heads,
                              intermediate_size=config.generator_intermediate_size)
    discriminator = ElectraConfig(**shared, embedding_size=config.embedding_size, hidden_size=config.hidden_size,
                                  num_hidden_layers=config.num_hidden_layers,
                                  num_attention_heads=config.num_attention_heads,
                                  intermediate_size=config.intermediate_size)
    return HfElectraStep(generator, discriminator)


# ---------------------------------------------------------------------------------------------------- FLOPs
def train_step_flops(kind: str, model, inputs: dict) -> int:
    """Model FLOPs of one train step of `model` (of `kind`) on `inputs`: our kinds as a pretraining run counts them
    (each family's formula, `encoder_zoo.training.recipes.train_step_flops`), the transformers references with the
    same formulas (`encoder_zoo.training.run.flops`), their vocabulary logits at every token (see the module
    docstring)."""
    if kind not in ("hf_bert_mlm", "hf_bert_mlm_cloze", "hf_electra", "hf_electra_narrow"):
        return zoo_train_step_flops(kind, model, inputs)
    lengths = sequence_lengths(inputs)
    tokens, squared = int(lengths.sum()), int((lengths * lengths).sum())
    if kind in ("hf_bert_mlm", "hf_bert_mlm_cloze"):
        config = model.config
        d, ff, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
        return config.num_hidden_layers * layer(tokens, squared, d, ff) + dense(tokens, d, d) + dense(tokens, d, vocab)
    generator, discriminator = model.generator.config, model.discriminator.config
    e, vocab = generator.embedding_size, generator.vocab_size
    flops = 0
    for part in (generator, discriminator):
        flops += dense(tokens, e, part.hidden_size) if e != part.hidden_size else 0
        flops += part.num_hidden_layers * layer(tokens, squared, part.hidden_size, part.intermediate_size)
    d = discriminator.hidden_size
    return (flops + dense(tokens, generator.hidden_size, e) + dense(tokens, e, vocab) + dense(tokens, d, d)
            + dense(tokens, d, 1))


# ---------------------------------------------------------------------------------------------------- timing
def measure(kind: str, options, data: list[dict], device: torch.device, variant: str = "base") -> dict:
    """Tokens/s, model TFLOP/s, MFU and peak memory of `kind`'s train steps on `data` (cycled), our side with the
    levers of `variant` (see the module docstring)."""
    ours = kind in PAIRS
    levers = set(variant.split("+")) if ours and kind in PACKABLE else set()
    model = build(kind, options.size, options.attn_implementation, unpad="unpad" in levers).to(device).train()
    packing = (options.packing or "unpad" in levers) and kind in PACKABLE
    inputs = [step_inputs(kind, batch, packing, buffer="buffer" in levers) for batch in data]
    flops = [train_step_flops(kind, model, batch) for batch in inputs]  # real targets only, not empty buffer slots
    compiled = options.compile == "both" or (options.compile == "ours" and ours) or "cudagraphs" in levers
    if compiled:
        # Fresh dynamo caches per cell: every model's layers share one code object (transformers'
        # GradientCheckpointingLayer.__call__), so without a reset the 9th cell hit dynamo's recompile limit and ran
        # its layers eager (electra@128 on the H200, 2026-11-28).
        torch._dynamo.reset()
    if "cudagraphs" in levers:  # one graph for the whole step's forward, replayed: needs one shape (full_width)
        # (CPU, --smoke: dynamo's trace alone; inductor's CPU compile of a whole model takes minutes)
        run = torch.compile(model, mode="reduce-overhead") if device.type == "cuda" else torch.compile(model,
                                                                                                   backend="eager")
    elif compiled:
        run = compile_layers(model) if options.compile_scope == "layers" else torch.compile(model)
    else:
        run = model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=options.optim == "fused")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[options.dtype]

    def step(batch):
        batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            output = run(**batch)
        (output if torch.is_tensor(output) else output.loss).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    for index in range(options.warmup):
        step(inputs[index % len(inputs)])
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    warmup_seconds = time.perf_counter() - started  # compilation included: what --compile_scope shortens
    seconds, tokens, total_flops = 0.0, 0, 0
    for index in range(options.steps):
        batch = inputs[(options.warmup + index) % len(inputs)]
        start = time.perf_counter()
        step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - start
        tokens += int(sequence_lengths(batch).sum())
        total_flops += flops[(options.warmup + index) % len(inputs)]
    result = {
        "model": type(model).__name__,
        "tokens_per_s": round(tokens / seconds, 1),
        "model_tflops_per_s": float(f"{total_flops / seconds / 1e12:.4g}"),
        "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        "warmup_seconds": round(warmup_seconds, 1),
    }
    if options.peak_tflops:
        result["mfu"] = float(f"{total_flops / seconds / (options.peak_tflops * 1e12):.4g}")
    result["peak_memory_MiB"] = round(torch.cuda.max_memory_allocated() / 2**20) if device.type == "cuda" else None
    if options.profile:
        result["profile"] = kernel_profile(step, inputs, device)
    if ours:
        result.update(attention=model.config._attn_implementation, packed=packing,
                      **({"variant": variant} if variant != "base" else {}))
    run = model = optimizer = None  # free the GPU memory before the next kind (step's closure keeps the names)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def compile_layers(model: torch.nn.Module) -> torch.nn.Module:
    """Regional compilation: compile each block of every stack of identical blocks (an encoder's layers) in place,
    the rest eager. The blocks share one compiled graph, so compiling takes about one block's time instead of the
    whole model's (PyTorch's "regional compilation" recipe); the heads' data-dependent indexing stays eager."""
    for stack in [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]:
        if len({type(block) for block in stack}) == 1:
            for block in stack:
                block.compile()
    return model


# ---------------------------------------------------------------------------------------------------- profile
KERNEL_KINDS = (  # kernel name fragment -> kind, first match wins (cuBLAS/CUTLASS GEMMs, attention, optimizer...)
    (("fmha", "flash", "attention", "attn", "cudnn"), "attention"),
    (("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul", "addmm", "mm_"), "matmul"),
    (("multi_tensor", "adam", "foreach"), "optimizer"),
    (("triton",), "fused (triton)"),
    (("memcpy", "memset"), "copies"),
)


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for fragments, kind in KERNEL_KINDS if any(f in lowered for f in fragments)), "other")


def kernel_profile(step, inputs: list[dict], device: torch.device, steps: int = 3, top: int = 12) -> dict:
    """Where `steps` train steps spend device time (CPU time on CPU): the share per kernel kind and the top kernels,
    and how busy the device was over the steps' wall time (low: launch or host-sync bound)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for index in range(steps):
            step(inputs[index % len(inputs)])
        if cuda:
            torch.cuda.synchronize()
    wall_us = (time.perf_counter() - start) * 1e6
    events = [e for e in prof.key_averages() if (e.device_type.name == "CUDA") == cuda]
    timed = [(e.key, (e.self_device_time_total if cuda else e.self_cpu_time_total), e.count) for e in events]
    timed = [row for row in timed if row[1] > 0]
    total = sum(t for _, t, _ in timed) or 1.0
    kinds: dict[str, float] = {}
    for name, t, _ in timed:
        kinds[kernel_kind(name)] = kinds.get(kernel_kind(name), 0.0) + t
    timed.sort(key=lambda row: -row[1])
    return {
        "steps": steps,
        "device_busy": round(total / wall_us, 3) if cuda else None,
        "ms_per_step": round(total / steps / 1e3, 3),
        "kinds": {kind: round(t / total, 3) for kind, t in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "top": [{"kernel": name[:120], "share": round(t / total, 4), "calls_per_step": count // steps}
                for name, t, count in timed[:top]],
    }


# ---------------------------------------------------------------------------------------------------- main
def varlen_attention_available() -> bool:
    from transformers.utils import is_flash_attn_2_available

    return torch.cuda.is_available() and is_flash_attn_2_available()


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=list(PAIRS))
    parser.add_argument("--size", choices=["tiny", "small", "base", "large"], default="base")
    parser.add_argument("--seq_lengths", type=int, nargs="+", default=[512, 128])
    parser.add_argument("--tokens_per_batch", type=int, default=65536,
                        help="Batch size in tokens: the batch holds tokens_per_batch / seq_length sequences. 65,536 "
                             "(half the papers' 256 x 512) keeps an H200 busy: at 16,384 it idled 70%% of a BERT-base "
                             "step, launch- and sync-bound (bench/results/gpu_2026-11-27_nvidia-h200/).")
    parser.add_argument("--steps", type=int, default=20, help="Timed steps per model.")
    parser.add_argument("--warmup", type=int, default=5, help="Untimed steps first (compilation, recompilation).")
    parser.add_argument("--documents", type=int, default=10000, help="Wikipedia lead sections the batches come from.")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="Autocast (default: bf16 on a GPU).")
    parser.add_argument("--optim", choices=["fused", "foreach"], default="fused", help="torch AdamW implementation.")
    parser.add_argument("--attn_implementation", default=None,
                        help="Our models' attention (default: flash_attention_2 if installed, else sdpa).")
    parser.add_argument("--packing", action=argparse.BooleanOptionalAction, default=None,
                        help="Padding-free packed rows for our models (default: on with a varlen attention kernel).")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=["base"],
                        help="Our side once per set of levers, each next to the reference (see above).")
    parser.add_argument("--keep_going", action="store_true",
                        help="A variant other than base that fails records its error in the row and the sweep goes on.")
    parser.add_argument("--compile", choices=["none", "ours", "both"], default=None,
                        help="torch.compile our models, or both sides (default: ours on a GPU, none on CPU).")
    parser.add_argument("--compile_scope", choices=["model", "layers"], default="model",
                        help="What --compile compiles: the whole model, or each encoder layer (regional compilation: "
                             "one layer's compile time, so 10 cells fit one lent device call; results record "
                             "warmup_seconds either way).")
    parser.add_argument("--peak_tflops", type=float, default=None,
                        help="The device's peak for MFU, TFLOP/s (default: the GPU's dense bf16 peak: H100/H200 989).")
    parser.add_argument("--output", type=Path, default=None,
                        help="Result file (default bench/results/gpu_<size>_<device>.json).")
    parser.add_argument("--smoke", action="store_true",
                        help="A quick check that runs anywhere: tiny sizes, 32-token blocks, 2 steps; writes only "
                             "--output.")
    parser.add_argument("--allow_cpu", action="store_true", help="Run the full settings on CPU (slow).")
    parser.add_argument("--profile", action="store_true",
                        help="Also profile 3 steps of each model: device time per kernel kind (matmul, attention, "
                             "fused, optimizer...), the top kernels and how busy the device was.")
    parser.add_argument("--time_limit", type=float, default=None,
                        help="Seconds: start no new cell after this (the results file holds the cells done).")
    options = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if options.smoke:
        options.size, options.seq_lengths, options.tokens_per_batch = "tiny", [32], 128
        options.steps, options.warmup, options.documents = 2, 1, 300
    elif not cuda and not options.allow_cpu:
        parser.error("no CUDA device: this benchmark is for GPUs. Run with --smoke for a quick CPU check.")
    if options.attn_implementation is None:
        options.attn_implementation = "flash_attention_2" if varlen_attention_available() else "sdpa"
    if options.packing is None:
        from encoder_zoo.training.data.packing import VARLEN_ATTENTION

        options.packing = options.attn_implementation in VARLEN_ATTENTION or options.smoke
    options.compile = options.compile or ("ours" if cuda and not options.smoke else "none")
    options.dtype = options.dtype or ("bf16" if cuda else "fp32")
    if options.peak_tflops is None and cuda:
        name = torch.cuda.get_device_name()
        options.peak_tflops = next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)
    return options


def side(variant: str) -> str:
    """The column prefix of our side under `variant`."""
    return "ours" if variant == "base" else f"ours[{variant}]"


def markdown(results: dict) -> str:
    lines = ["| pair | length | ours (levers) | ours tokens/s | reference tokens/s | speedup | ours MFU "
             "| reference MFU | ours / reference peak memory (MiB) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, row in results.items():
        pair, length = name.rsplit("@", 1)
        for variant in row.get("variants", ["base"]):
            ours = side(variant)
            if f"{ours}_error" in row:
                lines.append(f"| {pair} | {length} | {variant} | failed: {row[f'{ours}_error'][:80]} | | | | | |")
                continue
            lines.append(f"| {pair} | {length} | {variant} | {row[f'{ours}_tokens_per_s']:,.0f} | "
                         f"{row['reference_tokens_per_s']:,.0f} | {row[f'{ours}_speedup']}x | "
                         f"{row.get(f'{ours}_mfu', '-')} | {row.get('reference_mfu', '-')} | "
                         f"{row[f'{ours}_peak_memory_MiB']} / {row['reference_peak_memory_MiB']} |")
    return "\n".join(lines)


def write(record: dict, output: Path | None) -> None:
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(record, indent=2))


def main(argv=None) -> dict:
    options = parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    settings = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(options).items()
                if key not in ("output", "allow_cpu")}
    settings["flops"] = ("PaLM appendix B / nanoGPT estimate_mfu, counting only the work each model does "
                         "(bench/bench_gpu.py)")
    output = options.output or (None if options.smoke else RESULTS / f"gpu_{options.size}_{device.type}.json")
    record = {"machine": machine(), "device": str(device), "settings": settings}
    if device.type == "cuda":
        record["gpu"] = torch.cuda.get_device_name()
    results, started = {}, time.perf_counter()
    cells = [(seq_length, pair) for seq_length in options.seq_lengths for pair in options.pairs]
    for seq_length, pair in cells:
        if options.time_limit is not None and time.perf_counter() - started > options.time_limit:
            record["stopped_early"] = f"--time_limit {options.time_limit:g} s reached before {pair}@{seq_length}"
            print(record["stopped_early"], flush=True)
            break
        batch_size = max(1, options.tokens_per_batch // seq_length)
        ours, reference, scheme = PAIRS[pair]
        count = max(4, min(options.steps, 16))
        data = batches(seq_length, batch_size, count, scheme, options.documents)
        real = sum(int(b["attention_mask"].sum()) for b in data) / sum(b["attention_mask"].numel() for b in data)
        row = {"batch_size": batch_size, "real_token_fraction": round(real, 3)}
        row.update({f"reference_{key}": value for key, value in measure(reference, options, data, device).items()})
        variants = [v for v in options.variants if ours in PACKABLE or v == "base"] or ["base"]  # (cloze: no levers)
        for variant in variants:
            try:
                cell = measure(ours, options, batches(seq_length, batch_size, count, scheme, options.documents,
                                                      full_width=True) if "cudagraphs" in variant else data,
                               device, variant)
            except Exception as error:  # noqa: BLE001 - a lever that fails on this machine: recorded, the rest runs
                if variant == "base" or not options.keep_going:
                    raise
                row[f"{side(variant)}_error"] = f"{type(error).__name__}: {str(error)[:2000]}"
                print(f"{pair}@{seq_length} {variant}: {row[f'{side(variant)}_error']}", flush=True)
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            row.update({f"{side(variant)}_{key}": value for key, value in cell.items()})
            row[f"{side(variant)}_speedup"] = round(row[f"{side(variant)}_tokens_per_s"]
                                                    / row["reference_tokens_per_s"], 2)
        if variants != ["base"]:
            row["variants"] = variants
        row["speedup"] = row.get("ours_speedup", row.get(f"{side(variants[0])}_speedup"))
        results[f"{pair}@{seq_length}"] = row
        print(json.dumps({f"{pair}@{seq_length}": row}), flush=True)
        record[f"{pair}@{seq_length}"] = row
        record["seconds"] = round(time.perf_counter() - started, 1)
        write(record, output)  # after every cell: a run stopped early keeps what it measured
    write(record, output)
    print(markdown(results))
    return record


if __name__ == "__main__":
    main()
