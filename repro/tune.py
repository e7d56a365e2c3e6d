"""Tune a budget on what no claim reads (issue 37): pretraining on the held-out loss against its unigram floor, and
fine-tuning on the positive control (a pretrained encoder against the same architecture at random initialisation)
and the floors. No paper's claim, no comparison between methods, is read here: the settings cannot be tuned on an
outcome.

    python repro/tune.py pretrain --budget cpu --jobs 2 --output repro/reports/tuning/cpu_pretraining.json \
        --grid bert:1e-3:100:2000 bert:2e-3:200:2000 spanbert:1e-3:100:2000
    python repro/tune.py finetune --budget cpu --export runs/tune/bert-.../export --preset teams_small \
        --grid 1e-4:5 3e-4:5 1e-3:5 --seeds 1 2 3 --output repro/reports/tuning/cpu_finetuning.json

A pretraining entry is MODEL:LEARNING_RATE:WARMUP_STEPS:STEPS (the budget's other flags); a fine-tuning entry is
LEARNING_RATE:EPOCHS (the budget's other fine-tuning flags, on --task). Runs are cached in --cache (a
finished run is read again, not retrained); the table is written after every run, so a stopped sweep keeps what it
measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean

from encoder_zoo.repro.budgets import BUDGETS
from encoder_zoo.repro.tasks import task_facts
from encoder_zoo.training.run.entry import run_cli

REPO = Path(__file__).resolve().parents[1]
PRETRAIN = REPO / "training" / "pretrain.py"
RUN_GLUE = REPO / "glue" / "run_glue.py"
RUN_QA = REPO / "qa" / "run_qa.py"
RANDOM_INIT = REPO / "repro" / "random_init.py"
FLOORS = REPO / "repro" / "floors.py"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
# The held-out token-prediction loss each recipe logs: the MLM loss at [MASK]ed targets only (issue 51; the
# generator's for TEAMS/ELECTRA), else the 80/10/10 one of a run made before it, the cloze model's cloze loss.
LOSS_KEYS = ("eval_mlm_masked_loss", "eval_mlm_loss", "eval_loss")


def parse_pretraining_entry(text: str) -> dict:
    try:
        model, learning_rate, warmup, steps, *documents = text.split(":")
        entry = {"model": model, "learning_rate": float(learning_rate), "warmup_steps": int(warmup),
                 "steps": int(steps)}
        if len(documents) > 1:
            raise ValueError
        return {**entry, "documents": int(documents[0])} if documents else entry
    except ValueError:
        raise argparse.ArgumentTypeError(f"--grid entry {text!r}: expected MODEL:LEARNING_RATE:WARMUP:STEPS"
                                         "[:DOCUMENTS], for example bert:1e-3:100:2000") from None


def command(budget, entry: dict, folder: Path, seed: int) -> list[str]:
    flags = budget.pretrain_flags()
    steps_at = flags.index("--max_steps") + 1
    flags[steps_at] = str(entry["steps"])
    if "documents" in entry:  # the corpus size: the budget's --max_documents, or added
        if "--max_documents" in flags:
            flags[flags.index("--max_documents") + 1] = str(entry["documents"])
        else:
            flags += ["--max_documents", str(entry["documents"])]
    return [sys.executable, str(PRETRAIN), "--model", entry["model"], *flags, "--learning_rate",
            str(entry["learning_rate"]), "--warmup_steps", str(entry["warmup_steps"]), "--seed", str(seed),
            "--output_dir", str(folder), "--dataloader_num_workers", "0"]


def heldout_loss(folder: Path) -> tuple[float | None, str | None]:
    state = folder / "trainer_state.json"  # the finished run's, as repro reads it
    if not state.exists():
        return None, None
    history = json.loads(state.read_text())["log_history"]
    for key in LOSS_KEYS:
        values = [entry[key] for entry in history if key in entry]
        if values:
            return float(values[-1]), key
    return None, None


def run_one(budget, entry: dict, cache: Path, seed: int) -> dict:
    documents = f"-d{entry['documents']}" if "documents" in entry else ""
    name = (f"{entry['model']}-lr{entry['learning_rate']:g}-wu{entry['warmup_steps']}-s{entry['steps']}{documents}"
            f"-seed{seed}")
    folder = cache / name
    pretrain = command(budget, entry, folder, seed)
    env = {**os.environ, **ONE_THREAD}
    timing = folder / "tune_seconds.json"  # a cached run keeps the time it took
    if not timing.exists():
        started = time.time()
        with (cache / f"{name}.log").open("w") as log:
            subprocess.run(pretrain, stdout=log, stderr=subprocess.STDOUT, env=env, check=True)
        timing.write_text(json.dumps(round(time.time() - started, 1)))
    seconds = json.loads(timing.read_text())
    floor_file = folder / "unigram_floor.json"
    if not floor_file.exists():
        subprocess.run([sys.executable, str(FLOORS), "unigram", "--export", str(folder / "export"), "--output",
                        str(floor_file), "--", *pretrain[2:]], env=env, check=True, capture_output=True)
    loss, key = heldout_loss(folder)
    floors = json.loads(floor_file.read_text())
    floor, bigram = floors["value"], (floors.get("bigram") or {}).get("value")
    return {**entry, "seed": seed, "heldout_loss": loss, "loss_key": key, "unigram_floor": round(floor, 4),
            "below_floor": round(floor - loss, 4) if loss is not None else None,
            "bigram_floor": None if bigram is None else round(bigram, 4), "seconds": seconds,
            "command": " ".join(Path(part).name if part.startswith("/") else part for part in pretrain[1:])}


def markdown(rows: list[dict]) -> str:
    lines = ["| model | lr | warmup | steps | documents | seed | held-out loss (key) | unigram floor | below the floor "
             "| bigram floor | seconds |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        bigram = "—" if row.get("bigram_floor") is None else f"{row['bigram_floor']:.3f}"
        lines.append(f"| {row['model']} | {row['learning_rate']:g} | {row['warmup_steps']} | {row['steps']} | "
                     f"{row.get('documents', 'budget')} | {row['seed']} | {row['heldout_loss']:.3f} "
                     f"({row['loss_key']}) | {row['unigram_floor']:.3f} | "
                     f"{row['below_floor']:.3f} | {bigram} | {row['seconds']:.0f} |")
    return "\n".join(lines)


def parse_finetuning_entry(text: str) -> dict:
    try:
        learning_rate, epochs, *rows = text.split(":")
        if len(rows) > 1:
            raise ValueError
        entry = {"learning_rate": float(learning_rate), "epochs": float(epochs)}
        return {**entry, "rows": int(rows[0])} if rows else entry
    except ValueError:
        raise argparse.ArgumentTypeError(f"--grid entry {text!r}: expected LEARNING_RATE:EPOCHS[:ROWS], for example "
                                         "3e-4:5 or 3e-4:5:8000") from None


def finetune_scores(budget, model: str, task: str, preset: str, entry: dict, seeds: list[int],
                    folder: Path) -> list[float]:
    """`task`'s score of `model` fine-tuned at `entry`'s rate and epochs, one per seed, as repro runs it (the
    budget's flags; run_glue.py with --preset for a sentence task, run_qa.py at repro's lengths for a QA set)."""
    facts = task_facts(task)
    common = ["--learning_rate", str(entry["learning_rate"]), "--num_train_epochs", str(entry["epochs"]),
              "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true", "--trust_remote_code",
              *(["--max_train_samples", str(entry["rows"])] if "rows" in entry else [])]  # the last flag wins
    flags = [*budget.finetune_flags(), *common]
    if facts.finetuned_by == "glue":
        commands = {None: [sys.executable, str(RUN_GLUE), "--model_name_or_path", model, "--preset", preset,
                           "--task_name", task, *flags, "--seeds", *map(str, seeds), "--output_dir", str(folder)]}
    else:
        length = max(budget.finetune_max_seq_length, 96)
        flags = [*flags, "--dataset", task, "--max_seq_length", str(length), "--doc_stride", str(length // 4),
                 "--max_question_length", str(length // 3)]
        commands = {seed: [sys.executable, str(RUN_QA), "--model_name_or_path", model, *flags, "--seed", str(seed),
                           "--output_dir", str(folder / f"seed-{seed}")] for seed in seeds}
    if not (folder / "done").exists():
        folder.mkdir(parents=True, exist_ok=True)
        with (folder.parent / f"{folder.name}.log").open("w") as log:
            for command in commands.values():
                subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ONE_THREAD},
                               check=True)
        (folder / "done").write_text("")
    if facts.finetuned_by == "glue":
        from encoder_zoo.repro.jobs import glue_run_scores

        runs = glue_run_scores(json.loads((folder / "glue_results.json").read_text()), task)
        by_seed = {seed: float(metrics[facts.metric]) for seed, metrics in runs.items()}
    else:
        by_seed = {seed: float(json.loads((folder / f"seed-{seed}" / "qa_results.json").read_text())["eval"]
                               [facts.metric]) for seed in seeds}
    return [by_seed[seed] for seed in seeds]


def run_finetuning(budget, options) -> list[dict]:
    options.cache.mkdir(parents=True, exist_ok=True)
    random_model = options.cache / "random-init"
    if not (random_model / "random_init.json").exists():
        subprocess.run([sys.executable, str(RANDOM_INIT), "--model", str(options.export), "--seed", "1",
                        "--output_dir", str(random_model)], env={**os.environ, **ONE_THREAD}, check=True)
    facts = task_facts(options.task)

    def rows_suffix(rows: int) -> str:
        """Names of runs and floors over other rows than the budget's carry their count (the budget's keep theirs)."""
        return "" if rows == budget.max_train_samples else f"-rows{rows}"

    def floor_of(rows: int) -> float:
        """The task's floor fitted on the same `rows` training rows as the fine-tunings."""
        floor_file = options.cache / f"{facts.floor}-{options.task}{rows_suffix(rows)}.json"
        if not floor_file.exists():
            subprocess.run([sys.executable, str(FLOORS), facts.floor, "--task", options.task,
                            "--max_train_samples", str(rows), "--max_eval_samples",
                            str(budget.max_eval_samples), "--seed", "0", "--output", str(floor_file)], check=True,
                           capture_output=True)
        return json.loads(floor_file.read_text())["value"]

    def one(entry: dict) -> dict:
        rows = entry.get("rows", budget.max_train_samples)
        name = f"{options.task}-lr{entry['learning_rate']:g}-ep{entry['epochs']:g}{rows_suffix(rows)}"
        pretrained = finetune_scores(budget, str(options.export), options.task, options.preset, entry, options.seeds,
                                     options.cache / f"pretrained-{name}")
        random = finetune_scores(budget, str(random_model), options.task, options.preset, entry, options.seeds,
                                 options.cache / f"random-{name}")
        return {**entry, "seeds": options.seeds, "pretrained": pretrained, "random_init": random,
                "pretrained_mean": round(mean(pretrained), 4), "random_init_mean": round(mean(random), 4),
                "difference": round(mean(pretrained) - mean(random), 4), "task": options.task,
                "floor": facts.floor, "floor_value": floor_of(rows), "scale": facts.display_scale, "rows": rows}

    return sweep(options, budget, one, options.grid, finetuning_markdown)


def finetuning_markdown(rows: list[dict]) -> str:
    lines = ["| task | lr | epochs | rows | pretrained (per seed) | random init (per seed) | difference | floor |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        scale = row["scale"]
        per_seed = lambda values: " / ".join(f"{scale * v:.1f}" for v in values)  # noqa: E731
        lines.append(f"| {row['task']} | {row['learning_rate']:g} | {row['epochs']:g} | {row.get('rows', '')} | "
                     f"{per_seed(row['pretrained'])} "
                     f"| {per_seed(row['random_init'])} | {scale * row['difference']:+.1f} | "
                     f"{scale * row['floor_value']:.1f} ({row['floor']}) |")
    return "\n".join(lines)


def sweep(options, budget, one, entries: list, table) -> list[dict]:
    """Run `one(entry)` for every entry, --jobs at a time, writing the table after each (in the entries' order)."""
    rows: list[dict] = []
    options.output.parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(options.jobs) as pool:
        for future in [pool.submit(one, entry) for entry in entries]:
            rows.append(future.result())
            print(json.dumps(rows[-1]), flush=True)
            options.output.write_text(json.dumps({"budget": budget.name, "rows": rows}, indent=2))
            options.output.with_suffix(".md").write_text(table(rows) + "\n")
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    pretraining = modes.add_parser("pretrain", help="held-out loss against the unigram floor")
    pretraining.add_argument("--grid", type=parse_pretraining_entry, nargs="+", required=True)
    finetuning = modes.add_parser("finetune", help="the positive control on rotten_tomatoes")
    finetuning.add_argument("--grid", type=parse_finetuning_entry, nargs="+", required=True)
    finetuning.add_argument("--export", type=Path, required=True, help="A pretraining's export folder.")
    finetuning.add_argument("--task", default="rotten_tomatoes", help="A sentence task or a QA set repro scores.")
    finetuning.add_argument("--preset", default="teams_small", help="run_glue.py's --preset under the grid's flags.")
    for mode in (pretraining, finetuning):
        mode.add_argument("--budget", choices=sorted(BUDGETS), default="cpu")
        mode.add_argument("--seeds", type=int, nargs="+", default=[1])
        mode.add_argument("--jobs", type=int, default=2, help="Runs at a time, one thread each.")
        mode.add_argument("--cache", type=Path, default=REPO / "runs" / "tune")
        mode.add_argument("--output", type=Path, required=True, help="The sweep table (JSON; a .md beside it).")
    options = parser.parse_args(argv)
    budget = BUDGETS[options.budget]
    if options.mode == "finetune":
        return run_finetuning(budget, options)
    options.cache.mkdir(parents=True, exist_ok=True)
    entries = [(entry, seed) for entry in options.grid for seed in options.seeds]
    return sweep(options, budget, lambda item: run_one(budget, item[0], options.cache, item[1]), entries, markdown)


def cli() -> None:
    run_cli(main, "tune.py")


if __name__ == "__main__":
    cli()
