"""The main job, end to end on the embedded default data (`make demo`):

pretrain a small SpanBERT on the offline Wikipedia text, export it as a Hub-ready folder with its model card,
reload it in a fresh process with `AutoModel.from_pretrained(..., trust_remote_code=True)` (this repository not
importable there), and print a short summary. A few minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from encoder_zoo.training import pretrain

RELOAD = """
import sys
sys.modules["encoder_zoo"] = None  # prove the export needs nothing from this repository
import json, torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer
path = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
model = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
batch = tokenizer(["SpanBERT predicts whole spans from their boundaries."], return_tensors="pt")
with torch.no_grad():
    hidden = model(**batch).last_hidden_state
mlm = AutoModelForMaskedLM.from_pretrained(path, trust_remote_code=True).eval()
masked = tokenizer("Paris is the capital of " + tokenizer.mask_token + ".", return_tensors="pt")
with torch.no_grad():
    logits = mlm(**masked).logits[0, (masked.input_ids[0] == tokenizer.mask_token_id).nonzero()[0, 0]]
print(json.dumps({
    "class": f"{type(model).__module__}.{type(model).__name__}",
    "hidden_shape": list(hidden.shape),
    "hidden_checksum": float(hidden.abs().mean()),
    "fill_mask_top5": tokenizer.convert_ids_to_tokens(logits.topk(5).indices.tolist()),
}))
"""


OPTIONS_FILE = "demo_options.json"
DEFAULT_STEPS = 400
HELD_OUT_KEYS = ("eval_loss", "eval_mlm_loss", "eval_sbo_loss", "eval_mlm_masked_loss", "eval_unigram_floor")


def recorded_options(output_dir: Path) -> dict | None:
    try:
        return json.loads((output_dir / OPTIONS_FILE).read_text())
    except (OSError, ValueError):
        return None


def prune_earlier_copies(output_dir: Path) -> None:
    """Keep the newest earlier demo (`replaced-<time>/`, moved aside by --overwrite_output_dir) and remove older ones:
    reruns of the demo do not pile up copies."""
    import shutil

    earlier = sorted(p for p in output_dir.glob("replaced-*") if p.is_dir())
    if earlier:
        print(f"demo: the previous demo run is kept in {earlier[-1]}.")
    for folder in earlier[:-1]:
        shutil.rmtree(folder)
        print(f"demo: removed the older demo run {folder} (one earlier copy is kept).")


def rerun_command(options) -> str:
    """The command that continues this demo: `make demo` (with its STEPS) where make started it (make sets MAKELEVEL
    for what it runs), else this module's own command line."""
    import os

    if os.environ.get("MAKELEVEL"):
        return "make demo" + (f" STEPS={options.max_steps}" if options.max_steps != DEFAULT_STEPS else "")
    return " ".join([f"{Path(sys.executable).name} -m encoder_zoo.training.demo", *sys.argv[1:]])


def stopped_message(stop, options) -> str:
    """What a stopped demo says: where it stopped and the command that continues it (the demo resumes by itself;
    pretrain.py's own advice, --resume_from_checkpoint, is not a flag of the demo)."""
    import signal

    saved = f" after saving {stop.checkpoint}" if stop.checkpoint else ""
    return (f"stopped by {signal.Signals(stop.signum).name} at step {stop.step}{saved}. Run `{rerun_command(options)}` "
            f"again to continue from there: the demo resumes its run in {options.output_dir}.")


def held_out_lines(evaluation: dict | None, pad: str) -> str:
    """The summary's held-out figures, each named: the headline (MLM at [MASK]ed targets only) beside its unigram
    floor, then the others, continued lines indented by `pad`."""
    if not evaluation:
        return "none (no held-out documents)"
    if "mlm_masked_loss" not in evaluation:
        return "{loss:.3f} (MLM {mlm_loss:.3f} + SBO {sbo_loss:.3f})".format(**evaluation)
    floor = evaluation.get("unigram_floor")
    beside = f", against its unigram floor {floor:.3f} (token frequencies alone)" if floor is not None else ""
    return (f"{evaluation['mlm_masked_loss']:.3f} nats, MLM at [MASK]ed targets only (the headline){beside}\n"
            f"{pad}also: MLM over all 80/10/10 targets {evaluation['mlm_loss']:.3f} (a tenth left unchanged, so "
            f"copied), SBO {evaluation['sbo_loss']:.3f}, their sum {evaluation['loss']:.3f} (eval_loss)")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/demo", help="Where checkpoints and the export go.")
    parser.add_argument("--max_steps", type=int, default=DEFAULT_STEPS,
                        help="Training steps (400 take about 4 minutes on 2 cores; `make demo STEPS=N`).")
    parser.add_argument("--model_size", default="small", help="SpanBERT size preset.")
    options = parser.parse_args(argv)

    from encoder_zoo.training.run.folders import checkpoints
    from encoder_zoo.training.run.trainer import TrainingStopped

    output_dir = Path(options.output_dir)
    # A demo with the same options continues (interrupted) or is reused as it is (finished: pretrain.py has nothing
    # to do); a demo with other options is moved aside, and only the newest earlier copy is kept.
    wanted = {"max_steps": options.max_steps, "model_size": options.model_size}
    same = output_dir.is_dir() and bool(checkpoints(output_dir)) and recorded_options(output_dir) == wanted
    if same and (output_dir / "export").is_dir():
        print(f"demo: reusing the finished demo in {output_dir} (same options); delete it to train again.")
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / OPTIONS_FILE).write_text(json.dumps(wanted) + "\n")
    try:
        export_dir = pretrain.main([
            "--model", "spanbert",
            "--model_size", options.model_size,
            "--output_dir", options.output_dir,
            *(["--resume_from_checkpoint", "true"] if same else ["--overwrite_output_dir"]),
            "--max_steps", str(options.max_steps),
            "--max_seq_length", "128",
            "--tokenizer_vocab_size", "8000",
            "--per_device_train_batch_size", "16",
            "--learning_rate", "5e-4",
            "--warmup_steps", "0.05",
            "--logging_steps", str(max(1, min(25, options.max_steps // 4))),  # short runs still log a curve
            "--save_steps", str(options.max_steps),
            "--eval_steps", str(options.max_steps),
            "--dataloader_num_workers", "0",
        ]).resolve()  # the reload runs in another working directory
    except TrainingStopped as stop:
        print(f"demo: {stopped_message(stop, options)}", file=sys.stderr)
        raise SystemExit(stop.exit_code) from None
    prune_earlier_copies(output_dir)
    log = json.loads((export_dir / "training_log.json").read_text())
    train_logs = [entry for entry in log if "loss" in entry]
    reload = subprocess.run(
        [sys.executable, "-c", RELOAD, str(export_dir)], capture_output=True, text=True, cwd=Path.home(), check=False
    )
    if reload.returncode != 0:
        raise RuntimeError(f"Reloading the export failed:\n{reload.stderr[-3000:]}")
    reloaded = json.loads(reload.stdout.strip().splitlines()[-1])
    summary = {
        "export": str(export_dir),
        "files": sorted(p.name for p in export_dir.iterdir()),
        "steps": max(entry["step"] for entry in log if "step" in entry),  # the last step, logged or not
        "first_logged": {k: train_logs[0][k] for k in ("loss", "mlm_loss", "sbo_loss")},
        "last_logged": {k: train_logs[-1][k] for k in ("loss", "mlm_loss", "sbo_loss", "tokens_per_second")},
        "eval": next(({k.removeprefix("eval_"): e[k] for k in HELD_OUT_KEYS if k in e}
                      for e in reversed(log) if "eval_loss" in e), None),
        "run_mean_loss": next((e["train_loss"] for e in reversed(log) if "train_loss" in e), None),
        "reloaded": reloaded,
    }
    first, last = summary["first_logged"], summary["last_logged"]
    pad = " " * 16
    training = [f"{summary['steps']} steps; loss (MLM + SBO) {first['loss']:.3f} -> {last['loss']:.3f} (MLM "
                f"{first['mlm_loss']:.3f} -> {last['mlm_loss']:.3f}, SBO {first['sbo_loss']:.3f} -> "
                f"{last['sbo_loss']:.3f}); {last['tokens_per_second']:.0f} tokens/s"]
    if summary["run_mean_loss"] is not None:
        training += [f"mean loss {summary['run_mean_loss']:.3f} over every step of the run (its logged intervals; "
                     "the card's);", "Trainer's printed train_loss averages this session's steps only"]
    print("\n".join([
        "", "==== SpanBERT demo summary ====",
        f"export folder : {summary['export']}",
        f"  files       : {', '.join(summary['files'])}",
        f"training      : {training[0]}", *(pad + line for line in training[1:]),
        f"held-out loss : {held_out_lines(summary['eval'], pad)}",
        f"reloaded as   : {reloaded['class']} (fresh process, trust_remote_code=True)",
        f"  output      : {reloaded['hidden_shape']}",
        f"  fill-mask   : \"Paris is the capital of [MASK].\" -> {reloaded['fill_mask_top5']}",
        f"{pad}(a {summary['steps']}-step model predicts frequent words, not yet facts)", ""]))
    return summary


if __name__ == "__main__":
    main()
