"""The GPU path, executed: one command that trains, compares and fine-tunes every zoo recipe on one GPU and records
each check with its numbers and tolerance.

    make gpu-check                                  # = python bench/gpu_check.py: at most 9 minutes on one GPU
    python bench/gpu_check.py --throughput --max_batch   # and bench_gpu.py at base size, and the largest batches
    python bench/gpu_check.py --smoke               # anywhere, CPU included: the same checks at tiny sizes

Writes bench/results/gpu_check_<gpu>.json and .md (the GPU's name slugified); `--smoke` writes
runs/gpu_check/gpu_check_cpu-smoke.json and .md instead (git-ignored). Exits 1 if any check fails (a skipped check,
with its reason, does not).

Checks (the entry points run as processes of their own: `training/pretrain.py`, `glue/run_glue.py`,
`qa/run_qa.py`, `accelerate launch`):
  train:<model>      every `--model` trains `--steps` steps at `small` in bf16: finite losses, and the mean of the
                     last 10 logged losses below that of the first 10 (bertac_cnn, a GAN: its discriminator's loss).
  attention:<model>  eager, SDPA and flash attention 2 (flex attention without the flash-attn package) give the same
                     logits and loss for the same weights and batch, within bf16 tolerances (eval mode, bf16 autocast).
  packing:<model>    a packed batch (`pack_batch`, varlen kernel on a GPU) gives the padded batch's logits and loss;
  packing:pretrain   and `pretrain.py --packing` the padded run's per-step losses (dropout off in both).
  compile:pretrain   `pretrain.py --torch_compile true` gives the eager run's per-step losses (dropout off).
  levers:<model>     the GPU levers against the eager padded model, same weights and batch: the fixed-size
                     target buffer, the unpadded encoder (`sdpa_varlen`: PyTorch's varlen flash kernel on a GPU) and
                     both (packed on the host), within the bf16 tolerances (TEAMS's samplers without noise, so every
                     layout draws the same tokens); on a GPU, a train step with both levers makes no synchronising
                     call (CUDA's sync debug mode);
  levers:pretrain    and `pretrain.py --unpad --target_buffer` the padded run's per-step losses, eager and
  levers:compile     compiled (dropout off).
  determinism        two `--full_determinism` runs log bitwise-equal losses and export bitwise-equal weights;
  resume             a run killed (SIGKILL) after its first checkpoint and resumed equals them too.
  glue, qa           `run_glue.py` (rotten_tomatoes) and `run_qa.py` (a wiki_cloze_v2 sample) fine-tune one epoch in
                     bf16 on the export of train:spanbert: finite losses and scores.
  fsdp:<n>           an FSDP2 launch (`fsdp_spanbert.yaml`) on 1 process and on every GPU of the machine trains, saves
                     sharded checkpoints and exports a model that reloads, in a process without this repository,
                     with every saved tensor in place.
  budget             (GPU only) the checks together took at most 9 minutes.

`--smoke` runs the same checks on CPU: tiny sizes, fewer steps, bf16 autocast on CPU, eager vs SDPA only (flash
needs CUDA; flex attention on CPU is recorded as skipped), `torch.compile` with the aot_eager backend, FSDP2 on one
CPU process over gloo (through tests/fsdp_on_cpu.py, as tests/test_sharded.py does). To start fast on a couple of
cores, its runs fork from a process that has imported the entry points once (`--launcher forkserver`); on a GPU
every run is a fresh `python script.py ...` process (`--launcher subprocess`), several at a time (`--jobs`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import math
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
PRETRAIN = REPO / "training" / "pretrain.py"
RUN_GLUE = REPO / "glue" / "run_glue.py"
RUN_QA = REPO / "qa" / "run_qa.py"
CONFIGS = REPO / "training" / "accelerate_configs"
FSDP_ON_CPU = REPO / "tests" / "fsdp_on_cpu.py"  # lets accelerate's FSDP path run on CPU processes (gloo)
RESULTS = BENCH / "results"
SMOKE_RESULTS = REPO / "runs" / "gpu_check"  # git-ignored: CPU smoke records are not results

MODELS = ("spanbert", "bert", "bert_2seq_nsp", "teams", "electra", "cloze", "bertac_cnn")
ATTENTION_MODELS = ("spanbert", "bert", "bert_2seq_nsp", "teams", "electra", "cloze")
PACKABLE = ("spanbert", "bert", "teams", "electra")
ONLY_SDPA_AND_EAGER = {"cloze": "the two-tower cloze model attends under arbitrary two-tower masks over a prepended "
                                "zero state: it supports eager and SDPA only"}
# Outputs that depend on TEAMS's sampled replacements and candidates: compared only where both runs sampled the same.
SAMPLED = ("rtd_logits", "rtd_labels", "mws_logits")
GROUPS = ("train", "attention", "packing", "compile", "levers", "determinism", "finetune", "fsdp")
NO_DROPOUT = "hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0"
TIMING_KEYS = ("tokens_per_second", "train_runtime", "train_samples_per_second", "train_steps_per_second",
               "eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "pairs_per_second",
               "words_per_second")
BUDGET_S = 540


@dataclass(frozen=True)
class Tolerance:
    """Elementwise |a - b| <= atol + rtol |b| (b: the reference), as torch.testing.assert_close."""

    atol: float
    rtol: float

    def text(self) -> str:
        return f"|Δ| ≤ {self.atol:g} + {self.rtol:g}·|ref|"


# bf16 keeps 8 significant bits (a relative step of 2^-8 ≈ 0.4% per rounding). Attention kernels differ in where
# they round (eager: scores and probabilities in bf16; SDPA/flash: fused, fp32 accumulation), and an encoder adds
# up such roundings over its layers, so the same weights give logits a few bf16 steps apart.
BF16_LOGITS = Tolerance(atol=0.05, rtol=0.02)
BF16_LOSS = Tolerance(atol=0.01, rtol=0.005)
# Trained runs compared step by step (packed vs padded, compiled vs eager): the same data and updates in bf16, so
# the per-step losses stay within a few roundings of each other over a short run.
BF16_RUN_LOSS = Tolerance(atol=0.0, rtol=0.01)


@dataclass(frozen=True)
class Plan:
    """Sizes and lengths of one mode (the GPU check or its CPU smoke)."""

    smoke: bool
    size: str
    steps: int  # train:<model> steps
    window: int  # logged losses averaged at each end of a train run
    seq_length: int
    batch_size: int
    documents: int
    vocab: int
    bertac_size: str
    bertac_documents: int
    compare_steps: int  # packing/compile/determinism runs
    save_steps: int  # the checkpoint the resume check kills the run after
    fsdp_steps: int
    glue_train: int
    glue_eval: int
    qa_articles: int
    qa_train: int
    qa_eval: int
    batch_for_checks: int  # in-process attention and packing batches
    compile_backend: str
    run_timeout: int

    @staticmethod
    def for_mode(smoke: bool, steps: int | None) -> "Plan":
        if smoke:
            return Plan(smoke=True, size="tiny", steps=steps or 20, window=5, seq_length=64, batch_size=8,
                        documents=200, vocab=1000, bertac_size="w123-f100", bertac_documents=12, compare_steps=6,
                        save_steps=10,
                        fsdp_steps=6, glue_train=64, glue_eval=32, qa_articles=150, qa_train=48, qa_eval=24,
                        batch_for_checks=6, compile_backend="aot_eager", run_timeout=400)
        # bertac_cnn has no `small`: its smallest released CNN (windows 1-3, 100 filters, 300-d fastText words), in
        # both modes (at `tiny`, 32-d words, F's loss barely moves in 20 steps).
        return Plan(smoke=False, size="small", steps=steps or 50, window=10, seq_length=128, batch_size=32,
                    documents=2000, vocab=8000, bertac_size="w123-f100", bertac_documents=30, compare_steps=10,
                    save_steps=10,
                    fsdp_steps=20, glue_train=2000, glue_eval=500, qa_articles=1200, qa_train=1000, qa_eval=200,
                    batch_for_checks=16, compile_backend="inductor", run_timeout=480)


@dataclass
class Check:
    name: str
    group: str
    status: str  # "pass", "fail" or "skip"
    measured: dict = field(default_factory=dict)
    tolerance: str = ""
    reason: str = ""
    seconds: float = 0.0
    summary: str = ""  # one line for the Markdown table


# ---------------------------------------------------------------------------------------------------- processes
def _run_script(script: str, argv: list[str], log_path: str, env: dict) -> None:
    """Forkserver child: `python script argv...` without the interpreter start (the server imported the entry
    points once); stdout and stderr go to `log_path`, the exit status is the script's."""
    import runpy

    descriptor = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.environ.update(env)
    if "OMP_NUM_THREADS" in env:
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


class Process:
    """A started entry point: `poll`, `wait`, `kill`, the same whichever launcher started it."""

    def __init__(self, handle, log: Path):
        self.handle, self.log = handle, log

    def poll(self) -> int | None:
        if isinstance(self.handle, subprocess.Popen):
            return self.handle.poll()
        return self.handle.exitcode

    def wait(self, timeout: float) -> int:
        if isinstance(self.handle, subprocess.Popen):
            try:
                return self.handle.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return self.handle.wait()
        self.handle.join(timeout)
        if self.handle.exitcode is None:
            self.kill()
            self.handle.join()
        return self.handle.exitcode

    def kill(self) -> None:
        if self.poll() is None:
            self.handle.kill()


class Launcher:
    """Starts entry points as fresh interpreters (`subprocess`) or forks of a process that imported them once
    (`forkserver`: seconds instead of tens of seconds per run on a loaded 2-core machine). Multi-process launches
    (`accelerate launch`) are always fresh processes."""

    PRELOAD = ["transformers", "transformers.trainer", "datasets", "accelerate", "encoder_zoo.models",
               "encoder_zoo.training.pretrain", "encoder_zoo.training.recipes", "encoder_zoo.training.run.trainer",
               "encoder_zoo.training.run.sharding", "encoder_zoo.training.run.export", "encoder_zoo.glue.run_glue",
               "encoder_zoo.qa.run_qa"]

    def __init__(self, kind: str, env: dict):
        self.kind, self.env = kind, env
        if kind == "forkserver":
            self.context = multiprocessing.get_context("forkserver")
            self.context.set_forkserver_preload(self.PRELOAD)

    def start(self, script: Path, argv: list[str], log: Path, env: dict | None = None) -> Process:
        argv = [str(a) for a in argv]
        env = {**self.env, **(env or {})}
        if self.kind == "forkserver":
            handle = self.context.Process(target=_run_script, args=(str(script), argv, str(log), env), daemon=False)
            handle.start()
            return Process(handle, log)
        return self.start_command([sys.executable, str(script), *argv], log, env)

    def start_command(self, command: list[str], log: Path, env: dict | None = None) -> Process:
        with open(log, "w") as stream:
            handle = subprocess.Popen([str(c) for c in command], stdout=stream, stderr=subprocess.STDOUT,
                                      env={**os.environ, **self.env, **(env or {})}, cwd=REPO)
        return Process(handle, log)


def log_tail(path: Path, characters: int = 2500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    # tqdm's carriage-return updates make one endless line: keep the last state of each.
    lines = [line.rsplit("\r", 1)[-1] for line in text.splitlines()]
    return "\n".join(line for line in lines if line.strip())[-characters:]


class RunFailed(Exception):
    pass


# ---------------------------------------------------------------------------------------------------- the checker
class GpuCheck:
    def __init__(self, options):
        import torch

        self.options = options
        self.cuda = torch.cuda.is_available() and not options.smoke
        self.plan = Plan.for_mode(options.smoke, options.steps)
        self.work = Path(options.work_dir or tempfile.mkdtemp(prefix="gpu_check-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "logs").mkdir(exist_ok=True)
        env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PRETRAIN_TRACEBACK": "1",
               "PYTHONWARNINGS": "ignore"}
        if options.smoke:
            # One thread per process: several OpenMP threads on a couple of shared cores spin against each other
            # (a tiny run's step went from 1.4 s to 0.07 s).
            env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            torch.set_num_threads(1)
        os.environ.update(env)
        self.launcher = Launcher(options.launcher or ("forkserver" if options.smoke else "subprocess"), env)
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.checks: list[Check] = []
        self.reference_lock = threading.Lock()
        self.third_attention, self.third_reason = self.pick_third_attention()

    # ------------------------------------------------------------------ helpers
    def pick_third_attention(self) -> tuple[str | None, str]:
        if not self.cuda:
            return None, "no GPU: flash attention needs CUDA, flex attention is left to the GPU run; eager vs SDPA only"
        from transformers.utils import is_flash_attn_2_available

        if is_flash_attn_2_available():
            return "flash_attention_2", ""
        return "flex_attention", "the flash-attn package is not installed: flex attention instead"

    def record(self, check: Check) -> Check:
        self.checks.append(check)
        mark = {"pass": "PASS", "fail": "FAIL", "skip": "skip"}[check.status]
        if check.status == "pass":
            detail = check.summary or json.dumps(check.measured, default=str)[:300]
        else:
            detail = check.reason
        print(f"[gpu_check] {mark} {check.name} ({check.seconds:.0f} s): {detail}", flush=True)
        return check

    def run(self, name: str, script: Path, argv: list[str], env: dict | None = None) -> Path:
        """Run an entry point to its end; raises RunFailed with its log's tail unless it exits 0."""
        log = self.work / "logs" / f"{name}.log"
        status = self.launcher.start(script, argv, log, env).wait(self.plan.run_timeout)
        if status != 0:
            raise RunFailed(f"{script.relative_to(REPO)} exited with {status} (log {log}):\n{log_tail(log)}")
        return log

    def pretrain_size(self, model: str) -> str:
        return self.plan.bertac_size if model == "bertac_cnn" else self.plan.size

    def pretrain_argv(self, model: str, out: Path, steps: int, *extra: str) -> list[str]:
        plan = self.plan
        bertac = model == "bertac_cnn"
        return ["--model", model, "--model_size", self.pretrain_size(model),
                "--max_documents", plan.bertac_documents if bertac else plan.documents,
                *([] if bertac else ["--tokenizer_vocab_size", plan.vocab]),
                "--max_seq_length", plan.seq_length, "--per_device_train_batch_size", plan.batch_size,
                "--gradient_accumulation_steps", "1",  # not the paper's batch: a short run of this batch
                "--validation_documents", "0", "--dataloader_num_workers", "0", "--max_steps", steps,
                "--logging_steps", "1", "--save_steps", steps, "--bf16", "true", "--seed", "0",
                "--output_dir", out, *extra]

    def timed(self, name: str, group: str, function) -> Check:
        """Run `function() -> Check`; an exception becomes a failed check with its message."""
        start = time.perf_counter()
        try:
            check = function()
        except RunFailed as error:
            check = Check(name, group, "fail", reason=str(error))
        except Exception as error:  # noqa: BLE001 - every failure is recorded, the other checks still run
            import traceback

            check = Check(name, group, "fail",
                          reason=f"{type(error).__name__}: {error}\n{traceback.format_exc()[-2500:]}")
        check.seconds = round(time.perf_counter() - start, 1)
        return self.record(check)

    # ------------------------------------------------------------------ train:<model>
    def check_training(self, model: str) -> Check:
        out = self.work / f"train-{model}"
        self.run(f"train-{model}", PRETRAIN, self.pretrain_argv(model, out, self.plan.steps))
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        # bertac_cnn is a GAN: no loss of it must fall. Its logged `loss` is F's, log(1 - D(F(m))), which falls from
        # log(1/2) while F learns to fool a discriminator that starts undecided; D's own loss stays near 2 log 2.
        key = "loss"
        losses = [entry[key] for entry in history if key in entry and "train_runtime" not in entry]
        if len(losses) < 2:
            raise RunFailed(f"{len(losses)} {key} values logged in {out / 'trainer_state.json'}")
        window = min(self.plan.window, len(losses) // 2)
        first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
        finite = all(math.isfinite(x) for x in losses)
        runtime = next((entry.get("train_runtime") for entry in history if "train_runtime" in entry), None)
        measured = {"loss": key, "logged": len(losses), f"first_{window}_mean": round(first, 4),
                    f"last_{window}_mean": round(last, 4), "drop": round(first - last, 4), "finite": finite,
                    "train_runtime_s": runtime, "export": (out / "export" / "model.safetensors").exists()}
        passed = finite and last < first and len(losses) == self.plan.steps and measured["export"]
        return Check(f"train:{model}", "train", "pass" if passed else "fail", measured,
                     f"{self.plan.steps} steps, all finite, mean of the last {window} < mean of the first {window}",
                     "" if passed else f"losses {[round(x, 3) for x in losses]}",
                     summary=f"{len(losses)} steps at {self.pretrain_size(model)}, {key} {first:.3f} → {last:.3f}"
                     + (f", {runtime:.1f} s" if runtime else ""))

    # ------------------------------------------------------------------ in-process model checks
    def recipe_inputs(self, name: str):
        """The recipe's model class and config (tiny/small), and one masked batch of real text made by the recipe's
        own examples and collator, its rows of different lengths (so padded batches have padding)."""
        from encoder_zoo import models
        from encoder_zoo.training import pretrain
        from encoder_zoo.training.data.blocks import add_example_index
        from encoder_zoo.training.data.corpus import load_corpus
        from encoder_zoo.training.data.tokenizer import train_wordpiece_tokenizer

        plan = self.plan
        args, _ = pretrain.parse_args(["--model", name, "--model_size", plan.size,
                                       "--max_seq_length", str(plan.seq_length),
                                       "--tokenizer_vocab_size", str(plan.vocab), "--random_token_distribution",
                                       "uniform", "--output_dir", str(self.work / f"inputs-{name}")])
        recipe, overrides = pretrain.check_recipe_arguments(args)
        documents = load_corpus(max_documents=plan.documents)
        config_kwargs = {**recipe.sizes[plan.size], **recipe.config_overrides, **overrides}
        tokenizer = (recipe.build_tokenizer(documents, args, config_kwargs) if recipe.build_tokenizer
                     else train_wordpiece_tokenizer(documents["text"], vocab_size=plan.vocab))
        config = pretrain.build_config(recipe, args, tokenizer, config_kwargs)
        examples = add_example_index(recipe.build_examples(documents, tokenizer, args))
        by_length = sorted(range(len(examples)), key=lambda i: (len(examples[i]["input_ids"]), i))
        size = plan.batch_for_checks
        picks = [by_length[round(k * (len(by_length) - 1) / (size - 1))] for k in range(size)]
        batch = recipe.build_collator(tokenizer, args)([examples[i] for i in picks])
        return models.get_class(recipe.family, "AutoModelForPreTraining"), config, batch

    def forward(self, model_class, config, state, attention: str, batch: dict) -> dict:
        import torch

        config = copy.deepcopy(config)
        config._attn_implementation = attention
        model = model_class(config)
        model.load_state_dict(state)
        model.to(self.device).eval()
        inputs = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        torch.manual_seed(0)  # TEAMS samples replacements: the same draws for every implementation
        with torch.no_grad(), torch.autocast(self.device.type, dtype=torch.bfloat16):
            output = model(**inputs)
        return {key: value.detach().cpu() for key, value in output.items() if torch.is_tensor(value)}

    @staticmethod
    def compare(reference: dict, other: dict) -> dict:
        """Per output: the worst |Δ| / (atol + rtol |ref|) (≤ 1 passes) under the logits or the loss tolerance, and
        the largest |Δ|. Sampled outputs are compared only if both sides sampled the same tokens."""
        import torch

        same_samples = all(torch.equal(reference[k], other[k]) for k in ("corrupted_input_ids", "candidate_ids")
                           if k in reference)
        result = {}
        for key, value in reference.items():
            if not value.is_floating_point() or key not in other:
                continue
            if key in SAMPLED and not same_samples:
                continue
            tolerance = BF16_LOSS if key.endswith("loss") else BF16_LOGITS if key.endswith("logits") else None
            if tolerance is None:
                continue
            a, b = other[key].float(), value.float()
            if a.shape != b.shape:
                result[key] = {"shape": [list(a.shape), list(b.shape)], "ratio": math.inf}
                continue
            difference = (a - b).abs()
            ratio = (difference / (tolerance.atol + tolerance.rtol * b.abs())).max().item() if b.numel() else 0.0
            result[key] = {"max_abs_diff": float(f"{difference.max().item() if b.numel() else 0.0:.3g}"),
                           "worst_ratio": round(ratio, 3) if math.isfinite(ratio) else ratio,
                           "finite": bool(torch.isfinite(a).all() and torch.isfinite(b).all())}
        if "corrupted_input_ids" in reference:
            differ = reference["corrupted_input_ids"] != other["corrupted_input_ids"]
            result["sampled_tokens_differ"] = int(differ.sum())
        return result

    @staticmethod
    def within(comparison: dict) -> bool:
        entries = [v for v in comparison.values() if isinstance(v, dict)]
        return bool(entries) and all(v.get("worst_ratio", math.inf) <= 1 and v.get("finite", False) for v in entries) \
            and any(k.endswith("loss") for k, v in comparison.items() if isinstance(v, dict))

    def check_attention(self, name: str) -> Check:
        import torch

        model_class, config, batch = self.recipe_inputs(name)
        torch.manual_seed(0)
        state = model_class(config).state_dict()
        eager = self.forward(model_class, config, state, "eager", batch)
        implementations = ["sdpa"]
        notes = []
        if name in ONLY_SDPA_AND_EAGER:
            notes.append(f"flash/flex not compared: {ONLY_SDPA_AND_EAGER[name]}")
        elif self.third_attention:
            implementations.append(self.third_attention)
            if self.third_reason:
                notes.append(self.third_reason)
        else:
            notes.append(f"flash/flex not compared: {self.third_reason}")
        measured = {impl: self.compare(eager, self.forward(model_class, config, state, impl, batch))
                    for impl in implementations}
        passed = all(self.within(comparison) for comparison in measured.values())
        measured["reference"] = "eager"
        if notes:
            measured["note"] = "; ".join(notes)
        return Check(f"attention:{name}", "attention", "pass" if passed else "fail", measured,
                     f"bf16 autocast, eval mode: logits {BF16_LOGITS.text()}, losses {BF16_LOSS.text()}",
                     "" if passed else "an implementation left the tolerance (worst_ratio > 1)",
                     summary="; ".join(f"{impl} vs eager: {brief(measured[impl])}" for impl in implementations)
                     + (f" ({'; '.join(notes)})" if notes else ""))

    def check_packing_model(self, name: str) -> Check:
        import torch

        from encoder_zoo.training.data.packing import pack_batch

        model_class, config, batch = self.recipe_inputs(name)
        torch.manual_seed(0)
        state = model_class(config).state_dict()
        packed_attention = self.third_attention if self.cuda and self.third_attention else "sdpa"
        padded = self.forward(model_class, config, state, "sdpa", batch)
        packed_inputs = pack_batch(batch)
        packed = self.forward(model_class, config, state, packed_attention, packed_inputs)
        real = batch["attention_mask"].bool()
        if "corrupted_input_ids" in padded:  # padded (B, T) vs packed (1, N): the real tokens, in the same order
            padded["corrupted_input_ids"] = padded["corrupted_input_ids"][real]
            packed["corrupted_input_ids"] = packed["corrupted_input_ids"][0]
        for key in ("rtd_logits", "rtd_labels"):  # per token: padded rows' real tokens vs the packed row
            if key in padded and padded[key].shape[:2] == real.shape:
                padded[key] = padded[key][real]
                packed[key] = packed[key][0]
        measured = self.compare(padded, packed)
        measured.update(padded="sdpa, right-padded", packed=f"{packed_attention}, one row",
                        padding_fraction=round(1 - real.float().mean().item(), 3))
        passed = self.within(measured) and measured["padding_fraction"] > 0
        return Check(f"packing:{name}", "packing", "pass" if passed else "fail", measured,
                     f"bf16 autocast, eval mode: logits {BF16_LOGITS.text()}, losses {BF16_LOSS.text()}",
                     "" if passed
                     else "packed outputs left the tolerance (worst_ratio > 1) or the batch had no padding",
                     summary=f"packed ({packed_attention}) vs padded (sdpa, "
                             f"{measured['padding_fraction']:.0%} padding): "
                     + brief(measured))

    # ------------------------------------------------------------------ runs compared step by step
    @staticmethod
    def step_logs(out: Path) -> dict[int, dict]:
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        logs: dict[int, dict] = {}
        for entry in history:
            if "loss" in entry and "train_runtime" not in entry:
                logs[entry["step"]] = {k: v for k, v in entry.items() if k not in TIMING_KEYS}
        return logs

    def reference_run(self) -> Path:
        """spanbert, dropout off, padded, eager (not compiled): what packing:pretrain and compile:pretrain match."""
        out = self.work / "reference"
        with self.reference_lock:  # packing:pretrain and compile:pretrain may ask at once
            if (out / "export").exists():
                return out
            self.run("reference", PRETRAIN, self.pretrain_argv("spanbert", out, self.plan.compare_steps,
                                                               "--config_overrides", NO_DROPOUT))
        return out

    def compare_runs(self, name: str, group: str, argv_extra: list[str], what: str, check: str = "") -> Check:
        out = self.work / name
        self.run(name, PRETRAIN, self.pretrain_argv("spanbert", out, self.plan.compare_steps, "--config_overrides",
                                                    NO_DROPOUT, *argv_extra))
        reference = self.step_logs(self.reference_run())
        actual = self.step_logs(out)
        rows = []
        for step in sorted(reference):
            a, b = actual.get(step, {}).get("loss", math.nan), reference[step]["loss"]
            rows.append({"step": step, "reference": b, name: a, "rel_diff": abs(a - b) / abs(b) if b else math.inf})
        worst = max((row["rel_diff"] for row in rows), default=math.inf)
        passed = sorted(actual) == sorted(reference) and worst <= BF16_RUN_LOSS.rtol
        return Check(check or f"{group}:pretrain", group, "pass" if passed else "fail",
                     {"what": what, "steps": len(rows), "worst_rel_diff": float(f"{worst:.3g}"),
                      "losses": [[row["step"], round(row["reference"], 5), round(row[name], 5)] for row in rows]},
                     f"per-step loss |Δ| ≤ {BF16_RUN_LOSS.rtol:g}·|ref| (bf16), every step logged",
                     "" if passed else "per-step losses differ beyond the tolerance",
                     summary=f"{what}: {len(rows)} steps, largest relative difference {worst:.2g}")

    def check_packing_run(self) -> Check:
        return self.compare_runs("packed", "packing", ["--packing", "true"] + (
            ["--attn_implementation", self.third_attention] if self.cuda and self.third_attention else []),
            "pretrain.py --packing vs the padded run")

    def check_compile_run(self) -> Check:
        return self.compare_runs("compiled", "compile", ["--torch_compile", "true", "--torch_compile_backend",
                                                         self.plan.compile_backend],
                                 f"pretrain.py --torch_compile true (backend {self.plan.compile_backend}) vs eager")

    def check_levers_run(self, compiled: bool) -> Check:
        levers = ["--unpad", "true", "--target_buffer", "true"]
        if compiled:
            backend = ["--torch_compile_backend", self.plan.compile_backend]
            return self.compare_runs("levers-compiled", "levers", [*levers, "--torch_compile", "true", *backend],
                                     "pretrain.py --unpad --target_buffer --torch_compile true "
                                     f"(backend {self.plan.compile_backend}) vs the padded eager run", "levers:compile")
        return self.compare_runs("levers", "levers", levers, "pretrain.py --unpad --target_buffer vs the padded run")

    def check_levers_model(self, name: str) -> Check:
        """Each lever's outputs against the eager padded model's (see the module docstring)."""
        import torch

        from encoder_zoo.training.data.packing import pack_batch
        from encoder_zoo.training.masking.spans import max_targets, target_buffer

        model_class, config, batch = self.recipe_inputs(name)
        torch.manual_seed(0)
        state = model_class(config).state_dict()
        labels, real = batch["labels"], batch["attention_mask"].bool()
        slots = torch.from_numpy(target_buffer((labels != -100).numpy(), max_targets(0.15, labels.shape[1])))
        buffered = {**batch, "target_positions": slots}
        unpadded = copy.deepcopy(config)
        unpadded.unpad = True  # with SDPA, as pretrain.py --unpad builds it: the model makes it sdpa_varlen
        varlen = "sdpa_varlen"
        module = sys.modules[model_class.__module__]
        noise = getattr(module, "gumbel_noise", None)
        if noise is not None:  # the buffer has more sampled rows (its empty slots): without noise, the same picks
            module.gumbel_noise = lambda shape, device, generator=None: torch.zeros(shape, device=device)
        try:
            reference = self.forward(model_class, config, state, "eager", batch)
            outputs = {"buffer": self.forward(model_class, config, state, "sdpa", buffered),
                       "unpad": self.forward(model_class, unpadded, state, "sdpa", batch),
                       "unpad+buffer": self.forward(model_class, unpadded, state, "sdpa", pack_batch(buffered))}
        finally:
            if noise is not None:
                module.gumbel_noise = noise
        measured = {}
        for lever, output in outputs.items():
            expected = dict(reference)
            if "buffer" in lever:  # one row per slot: the filled slots are the gathered rows, in the same order
                filled = slots.flatten() >= 0
                for key in ("mlm_logits", "mws_logits", "candidate_ids"):
                    if key in output:
                        output[key] = output[key][filled]
                output.pop("sbo_logits", None)  # its rows are the slots with an SBO target; its loss is compared
            for key in ("corrupted_input_ids", "rtd_logits", "rtd_labels"):  # per token: the real tokens only
                if key in output:  # (an unpadded model has nothing at the padding; a packed row is one row)
                    packed = output[key].shape[:2] != real.shape
                    expected[key], output[key] = expected[key][real], output[key][0] if packed else output[key][real]
            measured[lever] = self.compare(expected, output)
        passed = all(self.within(comparison) for comparison in measured.values())
        measured.update(reference="eager, padded", attention=f"{varlen} ({'flash' if self.cuda else 'per sequence'})")
        # A train step on the levers' batch (buffer, packed on the host) must not wait on the host: CUDA's sync debug
        # mode raises at the first synchronising call (CPU: tests/test_levers.py traces it as one graph instead).
        measured["host_syncs"] = (self.synchronising_call(model_class, unpadded, state, pack_batch(buffered))
                                  if self.cuda else "not checked: CUDA only")
        passed = passed and measured["host_syncs"] in ("none", "not checked: CUDA only")
        return Check(f"levers:{name}", "levers", "pass" if passed else "fail", measured,
                     f"bf16 autocast, eval mode: logits {BF16_LOGITS.text()}, losses {BF16_LOSS.text()}",
                     "" if passed else "a lever's outputs left the tolerance (worst_ratio > 1)",
                     summary="; ".join(f"{lever} vs eager padded: {brief(measured[lever])}" for lever in outputs))

    def synchronising_call(self, model_class, config, state, batch: dict) -> str:
        """'none' if a bf16 train step (forward and backward) on `batch` makes no synchronising CUDA call, else the
        error CUDA's sync debug mode raised at the first, with where it was made."""
        import traceback

        import torch

        model = model_class(copy.deepcopy(config))
        model.load_state_dict(state)
        model.to(self.device).train()
        inputs = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**inputs).loss
            loss.backward()
            return "none"
        except RuntimeError as error:
            return f"{error} at {traceback.format_exc()[-1200:]}"
        finally:
            torch.cuda.set_sync_debug_mode("default")

    # ------------------------------------------------------------------ determinism and resume
    def deterministic_argv(self, out: Path) -> list[str]:
        return self.pretrain_argv("spanbert", out, 3 * self.plan.save_steps, "--full_determinism", "true",
                                  "--save_steps", self.plan.save_steps, "--save_total_limit", "5")

    @staticmethod
    def same_weights(a: Path, b: Path) -> tuple[bool, int]:
        import torch
        from safetensors.torch import load_file

        left, right = load_file(a), load_file(b)
        return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left), len(left)

    def check_determinism(self) -> Check:
        runs = []
        for name in ("deterministic-1", "deterministic-2"):
            out = self.work / name
            self.run(name, PRETRAIN, self.deterministic_argv(out))
            runs.append(out)
        logs = [self.step_logs(out) for out in runs]
        equal_weights, tensors = self.same_weights(*(out / "export" / "model.safetensors" for out in runs))
        differing = [step for step in logs[0] if logs[0][step] != logs[1].get(step)]
        passed = equal_weights and not differing and len(logs[0]) == 3 * self.plan.save_steps
        return Check("determinism", "determinism", "pass" if passed else "fail",
                     {"steps": len(logs[0]), "steps_differing": differing[:10], "weights_equal": equal_weights,
                      "tensors": tensors, "last_loss": logs[0][max(logs[0])]["loss"] if logs[0] else None},
                     "bitwise: every logged value of every step, every exported tensor",
                     "" if passed else "two --full_determinism runs differ",
                     summary=f"2 runs x {len(logs[0])} steps: {len(logs[0]) - len(differing)} steps' logs equal, "
                     f"{tensors} exported tensors {'equal' if equal_weights else 'NOT equal'}")

    def check_resume(self) -> Check:
        reference = self.work / "deterministic-1"
        out = self.work / "resumed"
        argv = self.deterministic_argv(out)
        log = self.work / "logs" / "resumed-killed.log"
        process = self.launcher.start(PRETRAIN, argv, log)
        marker = out / f"checkpoint-{self.plan.save_steps}"
        deadline = time.time() + self.plan.run_timeout
        while not marker.exists():
            if process.poll() is not None:
                raise RunFailed(f"the run ended ({process.poll()}) before {marker.name}:\n{log_tail(log)}")
            if time.time() > deadline:
                process.kill()
                raise RunFailed(f"{marker.name} did not appear within {self.plan.run_timeout} s")
            time.sleep(0.01)
        process.kill()
        status = process.wait(60)
        killed_at = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
        finished = (out / "export").exists()
        self.run("resumed", PRETRAIN, [*argv, "--resume_from_checkpoint", "true"])
        if not (reference / "export").exists():
            raise RunFailed("the deterministic reference run is missing (the determinism check failed to run)")
        logs, expected = self.step_logs(out), self.step_logs(reference)
        equal_weights, tensors = self.same_weights(reference / "export" / "model.safetensors",
                                                   out / "export" / "model.safetensors")
        differing = [step for step in expected if expected[step] != logs.get(step)]
        passed = equal_weights and not differing and not finished and killed_at < 3 * self.plan.save_steps
        return Check("resume", "determinism", "pass" if passed else "fail",
                     {"killed_status": status, "newest_checkpoint_when_killed": killed_at, "steps": len(logs),
                      "steps_differing": differing[:10], "weights_equal": equal_weights, "tensors": tensors},
                     "bitwise equal to the uninterrupted --full_determinism run",
                     "" if passed else ("the run had finished before the kill" if finished else
                                        "the resumed run differs from the uninterrupted one"),
                     summary=f"killed after checkpoint-{killed_at}, resumed: {len(expected) - len(differing)} of "
                     f"{len(expected)} steps' logs and {tensors} tensors {'equal' if equal_weights else 'NOT equal'}")

    # ------------------------------------------------------------------ fine-tuning
    def spanbert_export(self, future) -> Path:
        if future is not None:
            future.result()
        export = self.work / "train-spanbert" / "export"
        if not (export / "model.safetensors").exists():
            raise RunFailed("no export to fine-tune: train:spanbert did not finish")
        return export

    @staticmethod
    def run_losses(folder: Path) -> list[float]:
        states = sorted(folder.rglob("trainer_state.json"), key=lambda p: p.stat().st_mtime)
        if not states:
            return []
        history = json.loads(states[-1].read_text())["log_history"]
        return [entry["loss"] for entry in history if "loss" in entry]

    def cpu_flags(self) -> list[str]:
        """run_glue.py and run_qa.py take bf16 on CPU only with --use_cpu (pretrain.py adds it itself)."""
        return [] if self.cuda else ["--use_cpu", "true"]

    def check_glue(self, export_future) -> Check:
        export, plan = self.spanbert_export(export_future), self.plan
        out = self.work / "glue"
        self.run("glue", RUN_GLUE, ["--model_name_or_path", export, "--trust_remote_code",
                                    "--task_name", "rotten_tomatoes", "--num_train_epochs", "1", "--bf16", "true",
                                    "--max_train_samples", plan.glue_train, "--max_eval_samples", plan.glue_eval,
                                    "--per_device_train_batch_size", plan.batch_size,
                                    "--max_seq_length", plan.seq_length, "--seeds", "1", "--logging_steps", "1",
                                    "--save_strategy", "epoch", "--report_to", "none", "--output_dir", out,
                                    *self.cpu_flags()])
        result = json.loads((out / "glue_results.json").read_text())["tasks"]["rotten_tomatoes"]
        metrics, losses = result["runs"][0]["metrics"], self.run_losses(out)
        finite = bool(losses) and all(math.isfinite(x) for x in [*losses, *metrics.values()])
        return Check("glue", "finetune", "pass" if finite else "fail",
                     {"metrics": metrics, "train_steps": len(losses), "first_loss": losses[0] if losses else None,
                      "last_loss": losses[-1] if losses else None, "train_examples": plan.glue_train},
                     "one epoch in bf16: every logged loss and the scores finite",
                     "" if finite else "a loss or score is not finite, or nothing was logged",
                     summary=f"rotten_tomatoes, {plan.glue_train} examples, {len(losses)} steps, loss "
                     f"{losses[0] if losses else math.nan:.3f} → {losses[-1] if losses else math.nan:.3f}, "
                     + ", ".join(f"{k} {v:.1f} points" for k, v in metrics.items()))  # glue_results.json: points

    def qa_files(self) -> tuple[Path, Path]:
        from encoder_zoo.qa.data import build_wiki_cloze

        plan, folder = self.plan, self.work / "qa-data"
        data = build_wiki_cloze(with_unanswerable=True, articles=plan.qa_articles, cache_dir=str(folder))
        paths = []
        for split, count in (("train", plan.qa_train), ("validation", plan.qa_eval)):
            rows = data[split].select(range(min(count, len(data[split]))))
            squad = []
            for r in rows:
                answers = [{"text": t, "answer_start": s}
                           for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]
                question = {"id": r["id"], "question": r["question"], "is_impossible": not answers, "answers": answers}
                squad.append({"title": r["title"], "paragraphs": [{"context": r["context"], "qas": [question]}]})
            path = folder / f"{split}.json"
            path.write_text(json.dumps({"version": "v2.0", "data": squad}))
            paths.append(path)
        return paths[0], paths[1]

    def check_qa(self, export_future) -> Check:
        train, validation = self.qa_files()
        export, plan = self.spanbert_export(export_future), self.plan
        out = self.work / "qa"
        self.run("qa", RUN_QA, ["--model_name_or_path", export, "--trust_remote_code", "--train_file", train,
                                "--validation_file", validation, "--num_train_epochs", "1", "--bf16", "true",
                                "--max_seq_length", max(plan.seq_length, 128), "--doc_stride", "32",
                                "--max_question_length", "48", "--per_device_train_batch_size", plan.batch_size,
                                "--logging_steps", "1", "--save_strategy", "epoch", "--report_to", "none",
                                "--output_dir", out, *self.cpu_flags()])
        results = json.loads((out / "qa_results.json").read_text())
        scores = {k: v for k, v in results.get("eval", {}).items() if k in ("exact", "f1", "HasAns_f1", "NoAns_f1")}
        losses = self.run_losses(out)
        finite = bool(losses) and bool(scores) and all(math.isfinite(x) for x in [*losses, *scores.values()])
        return Check("qa", "finetune", "pass" if finite else "fail",
                     {"scores": scores, "train_steps": len(losses), "first_loss": losses[0] if losses else None,
                      "last_loss": losses[-1] if losses else None},
                     "one epoch in bf16: every logged loss and the scores finite",
                     "" if finite else "a loss or score is not finite, or nothing was logged",
                     summary=f"wiki_cloze_v2 sample, {len(losses)} steps, loss {losses[0] if losses else math.nan:.3f} "
                     f"→ {losses[-1] if losses else math.nan:.3f}, "
                     + ", ".join(f"{k} {v:.1f}" for k, v in scores.items()))

    # ------------------------------------------------------------------ FSDP2
    def fsdp_process_counts(self) -> list[int]:
        import torch

        gpus = torch.cuda.device_count() if self.cuda else 0
        return [1] + ([gpus] if gpus > 1 else [])

    def check_fsdp(self, processes: int) -> Check:
        from encoder_zoo.training.data.resources import minilm_path  # noqa: F401  (the package is installed)

        out = self.work / f"fsdp-{processes}"
        argv = self.pretrain_argv("spanbert", out, self.plan.fsdp_steps, "--save_steps", self.plan.fsdp_steps)
        script = [PRETRAIN] if self.cuda else [FSDP_ON_CPU, PRETRAIN]
        log = self.work / "logs" / f"fsdp-{processes}.log"
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", CONFIGS / "fsdp_spanbert.yaml",
                   "--num_processes", processes,
                   "--main_process_port", free_port(), *script, *argv]
        status = self.launcher.start_command(command, log).wait(self.plan.run_timeout)
        if status != 0:
            raise RunFailed(f"accelerate launch exited with {status} (log {log}):\n{log_tail(log)}")
        checkpoint = out / f"checkpoint-{self.plan.fsdp_steps}"
        sharded = (checkpoint / "pytorch_model_fsdp_0").exists() and not (checkpoint / "model.safetensors").exists()
        losses = [entry["loss"] for entry in json.loads((out / "trainer_state.json").read_text())["log_history"]
                  if "loss" in entry and "train_runtime" not in entry]
        reload = reload_in_fresh_process(out / "export")
        passed = (sharded and len(losses) == self.plan.fsdp_steps and all(math.isfinite(x) for x in losses)
                  and reload.get("missing") == [] and reload.get("unexpected") == [] and reload.get("all_equal")
                  and reload.get("finite"))
        return Check(f"fsdp:{processes}", "fsdp", "pass" if passed else "fail",
                     {"processes": processes, "config": "training/accelerate_configs/fsdp_spanbert.yaml",
                      "sharded_checkpoint": sharded, "steps": len(losses),
                      "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
                      "reload": reload},
                     "trains (finite losses), checkpoints shards, exports a folder that reloads with "
                     "trust_remote_code without this repository: no missing/unexpected key, every saved tensor equal",
                     "" if passed else f"see measured; log {log}",
                     summary=f"{processes} process(es), {len(losses)} steps, sharded checkpoint: {sharded}; reload: "
                     + (f"{reload.get('class')}, {reload.get('tensors')} tensors "
                        f"{'equal' if reload.get('all_equal') else 'NOT equal'}, missing "
                        f"{len(reload.get('missing', []))}, unexpected {len(reload.get('unexpected', []))}"
                        if "error" not in reload else "FAILED"))

    # ------------------------------------------------------------------ the whole check
    def selected(self, group: str) -> bool:
        return not self.options.only or group in self.options.only

    def run_all(self) -> dict:
        start = time.perf_counter()
        jobs = self.options.jobs or (4 if self.cuda else 1)
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = []

            def submit(name, group, function):
                futures.append(pool.submit(self.timed, name, group, function))
                return futures[-1]

            # In submission order (a single worker runs them so): what others wait on goes first.
            spanbert = determinism = None
            if self.selected("train") or self.selected("finetune"):
                spanbert = submit("train:spanbert", "train", lambda: self.check_training("spanbert"))
            if self.selected("determinism"):
                determinism = submit("determinism", "determinism", self.check_determinism)
            if self.selected("finetune"):
                submit("glue", "finetune", lambda: self.check_glue(spanbert))
                submit("qa", "finetune", lambda: self.check_qa(spanbert))
            if self.selected("determinism"):
                submit("resume", "determinism", lambda: (determinism.result(), self.check_resume())[1])
            if self.selected("train"):
                for model in MODELS[1:]:
                    submit(f"train:{model}", "train", lambda model=model: self.check_training(model))
            if self.selected("packing"):
                submit("packing:pretrain", "packing", self.check_packing_run)
            if self.selected("compile"):
                submit("compile:pretrain", "compile", self.check_compile_run)
            if self.selected("levers"):
                submit("levers:pretrain", "levers", lambda: self.check_levers_run(compiled=False))
                submit("levers:compile", "levers", lambda: self.check_levers_run(compiled=True))
            if self.selected("fsdp"):
                for processes in self.fsdp_process_counts():
                    submit(f"fsdp:{processes}", "fsdp", lambda processes=processes: self.check_fsdp(processes))

            # Meanwhile, in this process: the model-level comparisons.
            if self.selected("attention"):
                for name in ATTENTION_MODELS:
                    self.timed(f"attention:{name}", "attention", lambda name=name: self.check_attention(name))
                self.record(Check("attention:bertac_cnn", "attention", "skip",
                                  reason="a CNN over word vectors: no attention to compare"))
            if self.selected("packing"):
                for name in PACKABLE:
                    self.timed(f"packing:{name}", "packing", lambda name=name: self.check_packing_model(name))
            if self.selected("levers"):
                for name in PACKABLE:
                    self.timed(f"levers:{name}", "levers", lambda name=name: self.check_levers_model(name))
            concurrent.futures.wait(futures)
        seconds = time.perf_counter() - start
        if self.cuda and not self.options.only:
            self.record(Check("budget", "budget", "pass" if seconds <= BUDGET_S else "fail",
                              {"wall_s": round(seconds, 1)}, f"≤ {BUDGET_S} s on one GPU",
                              "" if seconds <= BUDGET_S else "the checks took longer than 9 minutes", round(seconds, 1),
                              summary=f"{seconds:.0f} s"))
        return {"wall_s": round(seconds, 1), "jobs": jobs}


def brief(comparison: dict) -> str:
    """`worst x` (the largest |Δ| / tolerance, ≤ 1 passes) with the largest |Δ| of the logits and of the losses."""
    entries = {k: v for k, v in comparison.items() if isinstance(v, dict) and "worst_ratio" in v}
    if not entries:
        return "nothing compared"
    worst = max(v["worst_ratio"] for v in entries.values())
    logits = max((v["max_abs_diff"] for k, v in entries.items() if k.endswith("logits")), default=None)
    losses = max((v["max_abs_diff"] for k, v in entries.items() if k.endswith("loss")), default=None)
    text = (f"worst {worst:.3g} of the tolerance, max |Δ| logits {logits:.2g}, losses {losses:.2g}"
            if logits is not None else f"worst {worst:.3g} of the tolerance, max |Δ| losses {losses:.2g}")
    if comparison.get("sampled_tokens_differ"):
        text += f" ({comparison['sampled_tokens_differ']} sampled tokens differ: sampled outputs not compared)"
    return text


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


RELOAD = """
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForPreTraining, AutoTokenizer
path = sys.argv[1]
model, info = AutoModelForPreTraining.from_pretrained(path, trust_remote_code=True, output_loading_info=True)
tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
saved = load_file(path + "/model.safetensors")
state = model.state_dict()
texts = ["A sentence about Wikipedia.", "Another, longer sentence of real words."]
batch = tokenizer(texts, padding=True, return_tensors="pt")
with torch.no_grad():
    output = model.eval()(**batch)
print(json.dumps({"class": type(model).__name__, "missing": sorted(info["missing_keys"]),
                  "unexpected": sorted(info["unexpected_keys"]), "tensors": len(saved),
                  "all_equal": all(name in state and torch.equal(state[name], tensor)
                                   for name, tensor in saved.items()),
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "finite": all(bool(torch.isfinite(v).all()) for v in output.values() if torch.is_tensor(v))}))
"""


def reload_in_fresh_process(export: Path) -> dict:
    """Load `export` where this repository cannot be imported (its own code, through trust_remote_code)."""
    blocker = "import sys\nsys.modules['encoder_zoo'] = None\n"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    result = subprocess.run([sys.executable, "-c", blocker + textwrap.dedent(RELOAD), str(export)], capture_output=True,
                            text=True, cwd=tempfile.gettempdir(), env=env, timeout=300)
    if result.returncode != 0:
        return {"error": result.stderr[-2000:]}
    return json.loads(result.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------- throughput
def throughput(options, work: Path) -> dict:
    """bench/bench_gpu.py at base size (its own defaults on a GPU; `--smoke` on CPU): its rows, and the targets of
    docs/scaling.md as met/missed (recorded, not checks: the exit status does not depend on them)."""
    output = work / "bench_gpu.json" if options.smoke else RESULTS / "gpu_base_cuda.json"
    command = [sys.executable, str(BENCH / "bench_gpu.py"), "--output", str(output),
               *(["--smoke"] if options.smoke else [])]
    start = time.perf_counter()
    log = work / "logs" / "bench_gpu.log"
    with open(log, "w") as stream:
        status = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, cwd=REPO).returncode
    if status != 0:
        return {"error": f"bench_gpu.py exited with {status} (log {log}):\n{log_tail(log, 1500)}"}
    record = json.loads(output.read_text())
    rows = {key: value for key, value in record.items() if "@" in key}
    targets = []
    for key, row in rows.items():
        pair, length = key.rsplit("@", 1)
        targets.append({"target": f"{key}: ours ≥ 1.5x the reference's tokens/s", "measured": row["speedup"],
                        "met": row["speedup"] >= 1.5})
        if pair in ("spanbert", "bert") and "ours_mfu" in row:
            targets.append({"target": f"{key}: MFU ≥ 45%", "measured": row["ours_mfu"],
                            "met": row["ours_mfu"] >= 0.45})
    return {"file": str(output), "settings": record.get("settings"), "rows": rows, "targets": targets,
            "seconds": round(time.perf_counter() - start, 1)}


def largest_batches(options, check: GpuCheck) -> dict:
    """Per bench_gpu.py recipe at base size, 512 tokens a sequence: the largest per-device batch whose train step
    (bf16 autocast, fused AdamW, bench_gpu.py's attention and packing, not compiled) fits in GPU memory, and that
    step's peak memory. Doubling from 8, then halving the gap to 8 sequences. On CPU (`--smoke`, tiny) nothing runs
    out of memory: the search stops at 16 sequences."""
    import gc

    import torch

    sys.path.insert(0, str(BENCH))
    import bench_gpu

    device = check.device
    size, length, cap = ("tiny", 32, 16) if options.smoke else ("base", 512, 4096)
    attention = check.third_attention if check.cuda and check.third_attention == "flash_attention_2" else "sdpa"
    packing = attention == "flash_attention_2"
    documents = 300 if options.smoke else 20000
    results = {}
    for pair, (kind, _, scheme) in bench_gpu.PAIRS.items():
        start = time.perf_counter()
        model = bench_gpu.build(kind, size, attention).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        available = len(bench_gpu.blocks(length, documents)[1])

        def fits(batch_size: int) -> tuple[bool, int | None]:
            """Whether one train step of `batch_size` sequences fits, and its peak MiB (GPU only)."""
            batch = bench_gpu.batches(length, batch_size, 1, scheme, documents)[0]
            inputs = {k: v.to(device) if torch.is_tensor(v) else v
                      for k, v in bench_gpu.step_inputs(kind, batch, packing).items()}
            try:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    output = model(**inputs)
                (output if torch.is_tensor(output) else output.loss).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    return True, round(torch.cuda.max_memory_allocated() / 2**20)
                return True, None
            except torch.OutOfMemoryError:
                return False, None
            finally:
                optimizer.zero_grad(set_to_none=True)
                del inputs
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()

        limit = min(cap, available)
        good, bad, peak = None, None, None
        batch_size = min(8, limit)
        while batch_size <= limit:
            ok, memory = fits(batch_size)
            if not ok:
                bad = batch_size
                break
            good, peak = batch_size, memory
            if batch_size == limit:
                break
            batch_size = min(2 * batch_size, limit)
        while good is not None and bad is not None and bad - good > 8:
            middle = (good + bad) // 2
            ok, memory = fits(middle)
            if not ok:
                bad = middle
            else:
                good, peak = middle, memory
        results[pair] = {"model": kind, "size": size, "seq_length": length, "attention": attention, "packed": packing,
                         "largest_batch": good, "tokens": good * length if good else None, "peak_memory_MiB": peak,
                         "stopped_by": "out of memory" if bad else ("the cap" if good == cap else "the data"),
                         "seconds": round(time.perf_counter() - start, 1)}
        print(f"[gpu_check] max batch {pair}: {json.dumps(results[pair])}", flush=True)
        model = optimizer = None  # freed before the next recipe's model is built
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


# ---------------------------------------------------------------------------------------------------- reports
def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def markdown(record: dict) -> str:
    counts = record["counts"]
    lines = [f"# GPU check: {record['gpu']}", "",
             f"{record['mode']}, {record['machine'].get('date')}, torch {record['machine'].get('torch')}: "
             f"**{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped** in "
             f"{record['wall_s']:.0f} s ({record['jobs']} at a time). Command: `{record['command']}`.", "",
             "| check | result | measured | tolerance |", "| --- | --- | --- | --- |"]
    for check in record["checks"]:
        reason = [line for line in check["reason"].strip().splitlines() if line.strip()] or [""]
        why = reason[0][:200] + (f" … {reason[-1].strip()[:200]}" if len(reason) > 1 else "")
        if check["status"] == "pass":
            text = check["summary"]
        else:
            text = (check["summary"] + ": " if check["summary"] else "") + why
        tolerance = check["tolerance"].replace("|", "\\|")  # escaped, so the table reads right in a terminal too
        lines.append(f"| {check['name']} | {check['status']} | {text.replace('|', '/')} | {tolerance} |")
    lines += ["", "Tolerances (bf16 autocast): logits " + BF16_LOGITS.text() + ", losses " + BF16_LOSS.text()
              + " per element against eager attention (or the padded batch); trained runs per step "
              + f"|Δ| ≤ {BF16_RUN_LOSS.rtol:g}·|ref|; determinism and resume bitwise."]
    if record.get("throughput"):
        bench = record["throughput"]
        lines += ["", "## Throughput (bench/bench_gpu.py)", ""]
        if "error" in bench:
            lines += ["```", *bench["error"].splitlines()[:1], *bench["error"].splitlines()[-6:], "```"]
        else:
            lines += ["| pair | ours tokens/s | reference tokens/s | speedup | ours MFU | reference MFU | "
                      "peak memory ours / reference (MiB) |", "| --- | --- | --- | --- | --- | --- | --- |"]
            for key, row in bench["rows"].items():
                lines.append(f"| {key} | {row['ours_tokens_per_s']:,.0f} | {row['reference_tokens_per_s']:,.0f} | "
                             f"{row['speedup']}x | {row.get('ours_mfu', '-')} | {row.get('reference_mfu', '-')} | "
                             f"{row['ours_peak_memory_MiB']} / {row['reference_peak_memory_MiB']} |")
            lines += ["", "Targets (recorded, not checks): " + "; ".join(
                f"{t['target']}: {t['measured']} ({'met' if t['met'] else 'missed'})" for t in bench["targets"])]
    if record.get("max_batch"):
        lines += ["", "## Largest batch per recipe", "",
                  "| recipe | size | length | attention, packed | largest batch | tokens "
                  "| peak memory (MiB) | stopped by |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for pair, row in record["max_batch"].items():
            lines.append(f"| {pair} | {row['size']} | {row['seq_length']} | {row['attention']}, {row['packed']} | "
                         f"{row['largest_batch']} | {row['tokens']} | {row['peak_memory_MiB']} | {row['stopped_by']} |")
    return "\n".join(lines) + "\n"


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="The same checks on CPU at tiny sizes (a few minutes).")
    parser.add_argument("--throughput", action="store_true",
                        help="Also run bench/bench_gpu.py (base size on a GPU; its --smoke on CPU), beyond the 9 "
                        "minutes.")
    parser.add_argument("--max_batch", action="store_true",
                        help="Also find each recipe's largest batch that fits at base size, 512 tokens, and its peak "
                        "memory.")
    parser.add_argument("--only", nargs="+", choices=GROUPS, help="Run only these groups of checks.")
    parser.add_argument("--steps", type=int, default=None, help="train:<model> steps (default 50; --smoke 20).")
    parser.add_argument("--jobs", type=int, default=None, help="Runs at a time (default 4 on a GPU, 1 with --smoke).")
    parser.add_argument("--launcher", choices=["subprocess", "forkserver"], default=None,
                        help="How entry points start (default: subprocess on a GPU, forkserver with --smoke).")
    parser.add_argument("--work_dir", default=None, help="Where the runs go (default: a new temporary folder, removed "
                        "at the end unless a check failed or --keep_work_dir).")
    parser.add_argument("--keep_work_dir", action="store_true")
    parser.add_argument("--results_dir", type=Path, default=None,
                        help="Where gpu_check_<gpu>.json/.md go (default bench/results; --smoke: runs/gpu_check).")
    options = parser.parse_args(argv)
    import torch

    if not options.smoke and not torch.cuda.is_available():
        parser.error("no CUDA device: this check is for GPUs. Run with --smoke for the same checks on CPU.")
    return options


def main(argv=None) -> dict:
    options = parse(argv)
    sys.path.insert(0, str(BENCH))
    from common import machine

    checker = GpuCheck(options)
    import torch

    gpu = torch.cuda.get_device_name() if checker.cuda else "cpu-smoke"
    print(f"[gpu_check] {gpu}: work folder {checker.work}", flush=True)
    summary = checker.run_all()
    record = {"gpu": gpu, "mode": "smoke (CPU, tiny sizes)" if options.smoke else "GPU",
              "command": "python bench/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(), "plan": asdict(checker.plan),
              "attention_compared": ["eager", "sdpa", *([checker.third_attention] if checker.third_attention else [])],
              "tolerances": {"logits": asdict(BF16_LOGITS), "loss": asdict(BF16_LOSS),
                             "run_loss": asdict(BF16_RUN_LOSS)},
              **summary}
    if options.throughput:
        record["throughput"] = throughput(options, checker.work)
    if options.max_batch:
        record["max_batch"] = largest_batches(options, checker)
    groups = [*GROUPS, "budget"]
    names = [*MODELS, "pretrain", "determinism", "resume", "glue", "qa"]
    checks = sorted(checker.checks, key=lambda c: (groups.index(c.group), names.index(c.name.split(":")[-1])
                                                    if c.name.split(":")[-1] in names else 99, c.name))
    record["checks"] = [asdict(c) for c in checks]
    record["counts"] = {status: sum(c.status == status for c in checks) for status in ("pass", "fail", "skip")}
    results_dir = options.results_dir or (SMOKE_RESULTS if options.smoke else RESULTS)
    results_dir.mkdir(parents=True, exist_ok=True)
    name = f"gpu_check_{slug(gpu)}"
    (results_dir / f"{name}.json").write_text(json.dumps(record, indent=2, default=str))
    (results_dir / f"{name}.md").write_text(markdown(record))
    record["files"] = [str(results_dir / f"{name}.json"), str(results_dir / f"{name}.md")]
    print(markdown(record))
    print(f"[gpu_check] wrote {record['files'][0]} and .md", flush=True)
    failed = record["counts"]["fail"] > 0
    inside = results_dir.resolve().is_relative_to(checker.work)
    if not options.work_dir and not options.keep_work_dir and not failed and not inside:
        shutil.rmtree(checker.work, ignore_errors=True)
    elif failed:
        print(f"[gpu_check] logs kept in {checker.work / 'logs'}", flush=True)
    return record


if __name__ == "__main__":
    raise SystemExit(1 if main()["counts"]["fail"] else 0)
