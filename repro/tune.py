"""Tune a budget on what no claim reads: pretraining on the held-out loss against its unigram floor, and
fine-tuning on the positive control (a pretrained encoder against the same architecture at random initialisation)
and the floors. No paper's claim, no comparison between methods, is read here: the settings cannot be tuned on an
outcome.

    python repro/tune.py pretrain --budget cpu --jobs 2 --output repro/reports/tuning/cpu_pretraining.json \
        --grid bert:1e-3:100:2000 bert:2e-3:200:2000 spanbert:1e-3:100:2000
    python repro/tune.py finetune --budget cpu --export runs/tune/bert-.../export --preset teams_small \
        --grid 1e-4:5 3e-4:5 1e-3:5 --seeds 1 2 3 --output repro/reports/tuning/cpu_finetuning.json

    python repro/tune.py adapt --budget adapt --jobs 2 --output repro/reports/tuning/adapt_control.json \
        --grid 140:1e-4 280:1e-4 140:3e-4

A pretraining entry is MODEL:LEARNING_RATE:WARMUP_STEPS:STEPS (the budget's other flags); a fine-tuning entry is
LEARNING_RATE:EPOCHS (the budget's other fine-tuning flags, on --task); an adaptation entry is
STEPS:LEARNING_RATE[:TEXT] (TEXT: sentence tasks joined by +, whose training text the encoder continues on; default
the budget's). `adapt` reads a continued-pretraining budget's adaptation control alone, at each entry: the budget's
encoder continued with plain MLM (`bert`) against it fine-tuned directly (`minilm`), per unit, with the MLM's held-out
loss against its floors; the sweep is the reproduction's own (repro.jobs.Sweep: its cache, --jobs helpers and the
decision of its reports), with no paper arm and no claim. Runs are cached in --cache (a finished run is read again,
not retrained); the table is written after every run (`adapt`: every entry), so a stopped sweep keeps what it
measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean

from encoder_zoo.repro.budgets import BUDGETS, OneLineParser, refuse_repeats, unit_seed
from encoder_zoo.repro.tasks import scored_tasks, task_facts
from encoder_zoo.training.run.entry import run_cli

REPO = Path(__file__).resolve().parents[1]
PRETRAIN = REPO / "training" / "pretrain.py"
RUN_GLUE = REPO / "glue" / "run_glue.py"
RUN_QA = REPO / "qa" / "run_qa.py"
RANDOM_INIT = REPO / "repro" / "random_init.py"
FLOORS = REPO / "repro" / "floors.py"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
# The held-out token-prediction loss each recipe logs: the MLM loss at [MASK]ed targets only (the headline; the
# generator's for TEAMS/ELECTRA), else the 80/10/10 one of a run made before it, the cloze model's cloze loss.
LOSS_KEYS = ("eval_mlm_masked_loss", "eval_mlm_loss", "eval_loss")


class OutOfRange(ValueError):
    """A number that parses but is not allowed: what the refusal adds after the expected form."""


def whole(text: str, least: int) -> int:
    """`text` as a whole number of at least `least`; OutOfRange naming the bound otherwise."""
    number = int(text)
    if number < least:
        raise OutOfRange(f"{number} is below {least}")
    return number


def rate(text: str) -> float:
    """`text` as a learning rate: a finite number above 0."""
    number = float(text)
    if not math.isfinite(number) or number <= 0:
        raise OutOfRange(f"the learning rate {text} is not a finite number above 0")
    return number


def whole_or_refuse(text: str, least: int, flag: str) -> int:
    try:
        return whole(text, least)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} {text}: give a whole number from {least}") from None


def parse_pretraining_entry(text: str) -> dict:
    try:
        model, learning_rate, warmup, steps, *documents = text.split(":")
        entry = {"model": model, "learning_rate": rate(learning_rate), "warmup_steps": whole(warmup, 0),
                 "steps": whole(steps, 1)}
        if len(documents) > 1 or not model:
            raise ValueError
        return {**entry, "documents": whole(documents[0], 1)} if documents else entry
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--grid entry {text!r}: expected MODEL:LEARNING_RATE:WARMUP:STEPS"
                                         "[:DOCUMENTS] (a rate above 0, WARMUP from 0, STEPS and DOCUMENTS from 1), "
                                         f"for example bert:1e-3:100:2000{reason(error)}") from None


def reason(error: ValueError) -> str:
    """What a range check said, after the expected form (a failed int() or float() says nothing more)."""
    return f" ({error})" if isinstance(error, OutOfRange) else ""


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
        entry = {"learning_rate": rate(learning_rate), "epochs": float(epochs)}
        if not math.isfinite(entry["epochs"]) or entry["epochs"] <= 0:
            raise OutOfRange(f"{epochs} epochs: give a number above 0")
        return {**entry, "rows": whole(rows[0], 1)} if rows else entry
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--grid entry {text!r}: expected LEARNING_RATE:EPOCHS[:ROWS] (a rate and "
                                         "epochs above 0, ROWS from 1), for example 3e-4:5 or 3e-4:5:8000"
                                         f"{reason(error)}") from None


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


def parse_adaptation_entry(text: str) -> dict:
    try:
        steps, learning_rate, *texts = text.split(":")
        if len(texts) > 1 or (texts and not texts[0]):
            raise ValueError
        entry = {"steps": whole(steps, 1), "learning_rate": rate(learning_rate)}
        if texts:
            entry["text"] = tuple(texts[0].split("+"))
            for task in entry["text"]:
                if task not in sentence_tasks():
                    raise OutOfRange(f"{task!r} is no sentence task; TEXT joins some of "
                                     f"{', '.join(sentence_tasks())} with +")
        return entry
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--grid entry {text!r}: expected STEPS:LEARNING_RATE[:TEXT] (STEPS a whole "
                                         "number from 1, a rate above 0), for example 140:1e-4 or 280:1e-4:"
                                         f"rotten_tomatoes+movie_sentiment_regression{reason(error)}") from None


def sentence_tasks() -> list[str]:
    """The tasks whose training sentences an adaptation entry's TEXT may continue on (repro.tasks.pretraining_text)."""
    return [name for name in scored_tasks() if task_facts(name).finetuned_by == "glue"]


# The adaptation control's arms: an experiment whose plain-MLM arm is `bert`, kept alone (`Experiment.adapted` adds
# the encoder fine-tuned directly and its random initialisation); no paper arm, so no claim is read.
ADAPTATION_ONLY = {"experiment": "spanbert", "arms": ("bert",)}


def adaptation_setting(budget, entry: dict, units: tuple[int, ...]):
    """The adaptation control alone at `budget` with `entry`'s steps, rate and text: its fine-tuned task (the first
    text task) and the MLM's held-out loss."""
    from encoder_zoo.repro.experiments import EXPERIMENTS

    text = entry.get("text", budget.pretrain_text)
    tuned = dataclasses.replace(budget, pretrain_steps=entry["steps"], pretrain_learning_rate=entry["learning_rate"],
                                pretrain_text=text)
    experiment = EXPERIMENTS[ADAPTATION_ONLY["experiment"]]
    experiment = dataclasses.replace(experiment, budget_arms={**experiment.budget_arms,
                                                              budget.name: ADAPTATION_ONLY["arms"]})
    return experiment.at(tuned, tasks=[budget.pretrain_text[0], "heldout_mlm_masked"], units=units)


def adaptation_row(entry: dict, results: dict) -> dict:
    """An entry's row: the control's decision (adapted > not adapted) on its task, each arm's per-unit scores, and
    the continued MLM's held-out [MASK] loss against the unigram and bigram floors."""
    (task, control), = results["adaptation_control"].items()
    decision = control.get("decision") or {}
    arms = results["arms"]
    scores = {name: [run["value"] for run in arms[name]["tasks"].get(task, {}).get("runs", [])]
              for name in ("bert", "minilm", "minilm_random")}
    heldout = arms["bert"]["tasks"].get("heldout_mlm_masked", {})
    floors = {f["kind"]: f["value"] for f in results["floors"].get("heldout_mlm_masked", []) if f["value"] is not None}
    return {**entry, "text": "+".join(entry.get("text", ())) or results["budget"]["pretrain_text"][0], "task": task,
            "units": results["units"], "adapted": scores["bert"], "not_adapted": scores["minilm"],
            "random_init": scores["minilm_random"], "difference": decision.get("estimate"),
            "low": decision.get("low"), "high": decision.get("high"), "p_value": decision.get("p_value"),
            "mdd": decision.get("mdd"), "verdict": control.get("verdict"),
            "positive_control": results["control"].get(task, {}).get("verdict"),
            "heldout_mlm_masked": heldout.get("mean"), "unigram_floor": floors.get("unigram"),
            "bigram_floor": floors.get("bigram"), "scale": task_facts(task).display_scale}


def run_adaptation(budget, options) -> list[dict]:
    """The adaptation control at every grid entry, one reproduction sweep each on one cache (the directly fine-tuned
    MiniLM and its random copy are shared by every entry); --jobs helpers of this command share its runs."""
    from encoder_zoo.repro.jobs import Sweep, start_helpers, stop_helpers
    from encoder_zoo.repro.results import analyse

    if not budget.init_from:
        raise SystemExit(f"tune.py adapt: budget {budget.name!r} continues no encoder (Budget.init_from); use "
                         "--budget adapt")
    helpers = (start_helpers(Path(__file__).resolve(), options.argv, options.jobs, options.cache)
               if options.jobs > 1 else [])
    rows, finished = [], False
    try:
        for entry in options.grid:
            sweep = Sweep(adaptation_setting(budget, entry, tuple(options.units)), options.cache)
            sweep.run(options.cache / "cache" / "runs.jsonl")
            if sweep.failed_jobs():
                print(sweep.failure_advice(), file=sys.stderr)
                raise SystemExit(1)
            if options.sweep_only:
                continue
            rows.append(adaptation_row(entry, analyse(sweep)))
            print(json.dumps(rows[-1]), flush=True)
            options.output.parent.mkdir(parents=True, exist_ok=True)
            options.output.write_text(json.dumps({"budget": budget.name, "rows": rows}, indent=2))
            options.output.with_suffix(".md").write_text(adaptation_markdown(rows) + "\n")
        finished = True
    finally:
        stop_helpers(helpers, finished)
    return rows


def adaptation_markdown(rows: list[dict]) -> str:
    lines = ["| steps | lr | text | adapted (per unit) | not adapted (per unit) | difference, points [90% CI] | p | "
             "MDD | control | pretrained > random | held-out [MASK] loss | unigram / bigram floor |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        def points(value, scale=row["scale"]):
            return "—" if value is None else f"{scale * value:.1f}"

        per_unit = " / ".join(map(points, row["adapted"])), " / ".join(map(points, row["not_adapted"]))
        p_value = "—" if row["p_value"] is None else f"{row['p_value']:.3f}"
        loss = "—" if row["heldout_mlm_masked"] is None else f"{row['heldout_mlm_masked']:.3f}"
        floors = " / ".join("—" if row[k] is None else f"{row[k]:.2f}" for k in ("unigram_floor", "bigram_floor"))
        lines.append(f"| {row['steps']} | {row['learning_rate']:g} | {row['text']} | {per_unit[0]} | {per_unit[1]} | "
                     f"{points(row['difference'])} [{points(row['low'])}, {points(row['high'])}] | {p_value} | "
                     f"{points(row['mdd'])} | {row['verdict']} | {row['positive_control']} | {loss} | {floors} |")
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
    parser = OneLineParser(prog="tune.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    pretraining = modes.add_parser("pretrain", help="held-out loss against the unigram floor")
    pretraining.add_argument("--grid", type=parse_pretraining_entry, nargs="+", required=True)
    finetuning = modes.add_parser("finetune", help="the positive control on rotten_tomatoes")
    finetuning.add_argument("--grid", type=parse_finetuning_entry, nargs="+", required=True)
    finetuning.add_argument("--export", type=Path, required=True, help="A pretraining's export folder.")
    finetuning.add_argument("--task", default="rotten_tomatoes", help="A sentence task or a QA set repro scores.")
    finetuning.add_argument("--preset", default="teams_small", help="run_glue.py's --preset under the grid's flags.")
    adaptation = modes.add_parser("adapt", help="the adaptation control of a continued-pretraining budget")
    adaptation.add_argument("--grid", type=parse_adaptation_entry, nargs="+", required=True)
    adaptation.add_argument("--units", type=unit_seed, nargs="+", default=[1, 2, 3, 4, 5],
                            help="Continued-pretraining seeds: one adapted model per unit and entry (default: 5, "
                            "as the budget's reports read the control).")
    adaptation.add_argument("--sweep_only", action="store_true", help="Run the jobs and write no table (what a "
                            "--jobs helper does).")
    for mode in (pretraining, finetuning, adaptation):
        # A grid entry may start with a minus (`--grid -5:1e-4`): read it as the entry it is, which its type then
        # judges, not as an unknown flag (argparse takes only plain negative numbers, -5 or -0.5, as values).
        mode._negative_number_matcher = re.compile(r"^-\.?\d")
        mode.add_argument("--budget", choices=sorted(BUDGETS), default="cpu")
        mode.add_argument("--seeds", type=unit_seed, nargs="+", default=[1])
        mode.add_argument("--jobs", type=lambda text: whole_or_refuse(text, 1, "--jobs"), default=2,
                          help="Runs at a time, one thread each.")
        mode.add_argument("--cache", type=Path, default=REPO / "runs" / "tune")
        mode.add_argument("--output", type=Path, required=True, help="The sweep table (JSON; a .md beside it).")
    options = parser.parse_args(argv)
    refuse_repeats(modes.choices[options.mode], options, ("units", "seeds"))
    options.argv = list(sys.argv[1:] if argv is None else argv)
    budget = BUDGETS[options.budget]
    if options.mode == "finetune":
        return run_finetuning(budget, options)
    if options.mode == "adapt":
        return run_adaptation(budget, options)
    options.cache.mkdir(parents=True, exist_ok=True)
    entries = [(entry, seed) for entry in options.grid for seed in options.seeds]
    return sweep(options, budget, lambda item: run_one(budget, item[0], options.cache, item[1]), entries, markdown)


def cli() -> None:
    run_cli(main, "tune.py")


if __name__ == "__main__":
    cli()
