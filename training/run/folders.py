"""What a pretraining run may find in, and do to, its folders.

- `--resume_from_checkpoint true` resumes from the newest *complete* checkpoint; partial saves are set aside.
- An output folder holding a previous run is never trained over: the run refuses, or with `--overwrite_output_dir`
  moves the old run's files to `OUTPUT_DIR/replaced-<time>/` (nothing is deleted, nothing is mixed).
- An export never lands on a folder that is not an encoder-zoo export, and an older export is moved aside.
- A tokenizer left in `OUTPUT_DIR/tokenizer` is reused only if it was made from the same inputs (a given tokenizer's
  by the content of its files, not their path), and the log says so.
- A resumed run has the data settings it started with (`run_inputs.json`), or is refused, naming each change.
- An export is written into a hidden staging folder next to its place and renamed there once complete; a leftover
  staging folder (a run killed while exporting) is deleted at the next start.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

from encoder_zoo.training.data.records import read_json_record
from encoder_zoo.training.run.locks import LOCK_FILES, hold
from encoder_zoo.training.run.trainer import STAGING_DIR, checkpoint_problem, engine_mismatch

logger = logging.getLogger("pretrain")

CHECKPOINT_PREFIX = "checkpoint-"
INCOMPLETE_PREFIX = "incomplete-"
EXPORT_MARKER = "training_log.json"  # written into every export by training/run/export.py
TOKENIZER_INPUTS = "training_inputs.json"
# The record's key for a given tokenizer (--tokenizer_name, or the --init_from checkpoint's own): the hash of its
# files, so that a tokenizer whose files changed at the same path is not reused. Older records named the path instead.
TOKENIZER_SOURCE = "tokenizer_files"
SOURCE_KEYS = (TOKENIZER_SOURCE, "init_from", "tokenizer_name")
# What shaped a run's training examples (sequence length, masking, data, tokenizer, ...), recorded at its start: a
# resumed run must have the same, or its checkpoints would continue on other data.
RUN_INPUTS = "run_inputs.json"
# Tests only: a complete export waits 10 minutes in its staging folder before it is published (to be killed there).
EXPORT_PAUSE_ENV = "ENCODER_ZOO_TEST_PAUSE_EXPORT"
# Tests only: a run waits 10 minutes once training ended (its last checkpoint saved), before its export.
TRAINED_PAUSE_ENV = "ENCODER_ZOO_TEST_PAUSE_AFTER_TRAINING"
RESUME_VALUES = ("True", "true", "auto", "last")


def fsdp_launch() -> bool:
    """Whether this run was launched with an FSDP accelerate config (`accelerate launch` sets ACCELERATE_USE_FSDP)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def resumes(resume: str | None) -> bool:
    """Whether a --resume_from_checkpoint value asks to resume (a checkpoint path, or one of `RESUME_VALUES`)."""
    return resume not in (None, "", "False", "false")


def timestamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def check_writable_dir(path: Path, flag: str) -> None:
    """Fail at parse time, before any corpus is read, if `path` cannot become a folder we write into. Nothing is
    created: a folder that does not exist yet is judged by its nearest existing parent, so a run refused later leaves
    no folder behind."""
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{flag} {path} is a file, not a folder; pass a folder path.")
    existing = next(folder for folder in (path.absolute(), *path.absolute().parents) if folder.exists())
    if not existing.is_dir():
        raise FileExistsError(f"{flag} {path}: {existing} is a file, not a folder; pass a folder path.")
    try:
        probe = existing / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise PermissionError(f"{flag} {path} is not writable ({error.strerror or error}); "
                              "pass a folder you can write to.") from None


def checkpoints(output_dir: Path) -> list[Path]:
    """checkpoint-N folders, oldest step first."""
    found = [p for p in output_dir.glob(f"{CHECKPOINT_PREFIX}*")
             if p.is_dir() and p.name[len(CHECKPOINT_PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX):]))


def set_aside_partial_saves(output_dir: Path, resuming: bool = False) -> None:
    """Saves killed half-way: a staging folder is deleted (it is never a checkpoint), an incomplete checkpoint-N
    (from an older version or another tool) is renamed incomplete-checkpoint-N, out of resume's and rotation's way;
    so is, when `resuming`, one whose files were damaged since (`checkpoint_problem`)."""
    staging = output_dir / STAGING_DIR
    if staging.is_dir():
        partial = sorted(p.name for p in staging.iterdir())
        logger.warning("Deleting %s: partial checkpoint save(s) %s of a run killed while saving.", staging, partial)
        shutil.rmtree(staging)
    for folder in checkpoints(output_dir):
        problem = checkpoint_problem(folder, deep=resuming)
        if problem:
            target = folder.with_name(INCOMPLETE_PREFIX + folder.name)
            if target.exists():
                target = folder.with_name(f"{INCOMPLETE_PREFIX}{folder.name}-{timestamp()}")
            logger.warning("Skipping %s (%s); moved to %s%s.", folder, problem, target.name,
                           ", resuming from an earlier complete checkpoint if any" if resuming else "")
            folder.rename(target)


def is_export(folder: Path) -> bool:
    return (folder / EXPORT_MARKER).is_file()


def checkpoint_state(checkpoint: str | Path) -> dict:
    """A checkpoint's trainer_state.json (complete checkpoints always have one)."""
    return json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8"))


def check_resume_end(checkpoint: str | Path, training_args) -> tuple[int, int | None]:
    """(steps the checkpoint trained, the step the resumed run ends at; None when unknown: a run counted in epochs
    whose --num_train_epochs changed). A checkpoint past the end is refused: resuming cannot train backwards."""
    state = checkpoint_state(checkpoint)
    step = int(state.get("global_step") or 0)
    if training_args.max_steps > 0:
        end = training_args.max_steps
    elif state.get("num_train_epochs") == training_args.num_train_epochs and state.get("max_steps"):
        end = int(state["max_steps"])
    else:
        return step, None
    if step > end:
        earlier = [p.name for p in checkpoints(Path(checkpoint).parent)
                   if int(p.name[len(CHECKPOINT_PREFIX):]) <= end]
        epochs = f"--num_train_epochs {training_args.num_train_epochs:g}"
        counted = "--max_steps" if training_args.max_steps > 0 else epochs
        raise ValueError(f"--resume_from_checkpoint {checkpoint} has trained {step} steps, more than this run's "
                         f"{end} ({counted}); pass --max_steps {step} or more to continue it"
                         + (f", or resume from an earlier checkpoint ({', '.join(earlier[-3:])})" if earlier else "")
                         + ", or start afresh with --overwrite_output_dir.")
    return step, end


def export_of_checkpoint(export_dir: Path, checkpoint: str | Path) -> bool:
    """Whether `export_dir` is a complete export made from `checkpoint`: its marker (the training log) continues the
    checkpoint's log exactly and ends at the checkpoint's step, and its config and weights are there (exports are
    published whole, by one rename)."""
    if not is_export(export_dir) or not (export_dir / "config.json").is_file():
        return False
    if not any((export_dir / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
        return False
    try:
        exported = json.loads((export_dir / EXPORT_MARKER).read_text(encoding="utf-8"))
        state = checkpoint_state(checkpoint)
    except (OSError, ValueError):
        return False
    logged = state.get("log_history") or []
    if not isinstance(exported, list) or exported[:len(logged)] != logged:
        return False
    steps = [entry.get("step") for entry in exported if isinstance(entry, dict) and "step" in entry]
    return bool(steps) and max(steps) == state.get("global_step")


def summary_after(output_dir: Path, state: dict) -> list[dict] | None:
    """What a finished attempt of this run logged after the checkpoint `state` (Trainer's summary of the run), from
    OUTPUT_DIR/trainer_state.json when that continues the checkpoint's log at the same step; else None."""
    try:
        saved = json.loads((output_dir / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    logged, history = state.get("log_history") or [], saved.get("log_history") or []
    if saved.get("global_step") != state.get("global_step") or history[:len(logged)] != logged:
        return None
    return history[len(logged):] or None


def check_new_output_dir(output: Path, overwrite: bool) -> None:
    """A script that writes a whole model folder (weights, tokenizer, card) refuses one that already holds files, and
    then holds the folder until it ends (`locks.hold`): another run that checked it meanwhile is refused, not mixed in.
    """
    def refuse_if_taken() -> None:
        if output.is_file():
            raise ValueError(f"--output_dir {output} is a file, not a folder.")
        present = sorted(p.name for p in output.iterdir() if p.name not in LOCK_FILES) if output.is_dir() else []
        if present and not overwrite:
            raise ValueError(f"{output} already holds files ({', '.join(present[:4])}); pass --overwrite_output_dir or "
                             "another --output_dir.")

    refuse_if_taken()  # before the lock, which creates the folder: a refused run leaves nothing behind
    hold(output)
    refuse_if_taken()  # under the lock: no other run can have written since


def check_export_dir(export_dir: Path, output_dir: Path | None = None) -> None:
    """An export is written only into a new or empty folder, or over an earlier export (which is moved aside)."""
    if output_dir is not None and output_dir.resolve().is_relative_to(export_dir.resolve()):
        raise ValueError(f"--export_dir {export_dir} would hold the run's own checkpoints ({output_dir}); pass a "
                         "folder of its own, e.g. OUTPUT_DIR/export (the default).")
    if export_dir.exists() and not export_dir.is_dir():
        raise FileExistsError(f"--export_dir {export_dir} is a file, not a folder.")
    if export_dir.is_dir() and any(export_dir.iterdir()) and not is_export(export_dir):
        names = sorted(p.name for p in export_dir.iterdir())
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise FileExistsError(f"--export_dir {export_dir} holds files that are not an encoder-zoo export ({shown}); "
                              "pass a new or empty folder. Nothing was written.")


def export_staging_dir(export_dir: Path) -> Path:
    """Where an export is written before it is renamed to `export_dir`: a hidden sibling, on the same filesystem."""
    return export_dir.with_name(f".{export_dir.name}.staging")


def discard_partial_export(export_dir: Path) -> None:
    """Delete the staging folder of an export that never finished (its run was killed or failed while exporting)."""
    staging = export_staging_dir(export_dir)
    if staging.is_dir():
        logger.warning("Deleting %s: the partial export of a run killed or failed while exporting (%s).", staging,
                       ", ".join(sorted(p.name for p in staging.iterdir())[:6]) or "empty")
        shutil.rmtree(staging)


def publish_export(staging: Path, export_dir: Path) -> None:
    """Rename a complete export from `staging` to `export_dir`, an earlier export there moved aside first."""
    if os.environ.get(EXPORT_PAUSE_ENV):
        time.sleep(600)
    move_aside(export_dir)  # an earlier export (of this run, resumed since) is kept, never mixed with this one
    if export_dir.is_dir():  # an empty folder: nothing to keep
        export_dir.rmdir()
    os.replace(staging, export_dir)


def move_aside(folder: Path) -> Path | None:
    """Rename an existing export to a timestamped sibling before a new export takes its name."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    check_export_dir(folder)
    target = folder.with_name(f"{folder.name}.replaced-{timestamp()}")
    folder.rename(target)
    logger.warning("Moved the earlier export %s to %s.", folder, target)
    return target


def previous_run(output_dir: Path) -> list[str]:
    """Names of a previous run's files in `output_dir` (a lone tokenizer is judged by its fingerprint instead)."""
    if not output_dir.is_dir():
        return []
    names = [p.name for p in checkpoints(output_dir)]
    names += sorted(p.name for p in output_dir.glob(f"{INCOMPLETE_PREFIX}{CHECKPOINT_PREFIX}*"))
    names += [name for name in ("export", "trainer_state.json") if (output_dir / name).exists()]
    return names


def prepare_output_dir(output_dir: Path, export_dir: Path, resume: str | None, overwrite: bool,
                       inputs: dict[str, str | None], data_inputs: dict | None = None,
                       main_process: bool = True) -> str | None:
    """Apply the resume / overwrite policy and return the checkpoint to resume from (None: a fresh run).

    `inputs` maps flags to paths the run reads (--dataset, --tokenizer_name): an overwrite must not move them away.
    `data_inputs` maps flags to the values that shape the training examples: recorded in OUTPUT_DIR/run_inputs.json by
    a fresh run, and checked against that record by a resumed one. Every process calls it after the main one did;
    only the main one (`main_process`) moves an overwritten run aside (the others would move what it just wrote).
    """
    given = resumes(resume) and resume not in RESUME_VALUES
    if given:  # a named checkpoint is judged before anything is set aside: refused, it is left where it is
        check_resume_path(Path(resume))
    if output_dir.is_dir():
        set_aside_partial_saves(output_dir, resuming=resumes(resume))
    discard_partial_export(export_dir)
    if resumes(resume):
        check_export_dir(export_dir)
        if given:
            checkpoint = resume
        else:
            complete = checkpoints(output_dir) if output_dir.is_dir() else []  # partial ones were set aside
            if not complete:
                aside = sorted(p.name for p in output_dir.glob(f"{INCOMPLETE_PREFIX}{CHECKPOINT_PREFIX}*")
                               ) if output_dir.is_dir() else []
                raise FileNotFoundError(f"--resume_from_checkpoint {resume}: no complete checkpoint-* folder in "
                                        f"{output_dir}" + (f" (set aside as incomplete or damaged: {', '.join(aside)})"
                                                           if aside else "")
                                        + "; drop the flag to start a new run.")
            checkpoint = str(complete[-1])
            mismatch = engine_mismatch(Path(checkpoint), fsdp_launch())
            if mismatch:
                raise ValueError(f"--resume_from_checkpoint {resume}: {checkpoint} {mismatch}.")
        if data_inputs is not None:
            check_run_inputs(Path(checkpoint).parent, data_inputs, checkpoint)
            record_run_inputs(output_dir, data_inputs)
        if resume in RESUME_VALUES:
            logger.info("Resuming from %s, the newest complete checkpoint.", checkpoint)
        return checkpoint

    found = previous_run(output_dir)
    outside_export = export_dir.resolve().parent != output_dir.resolve() and is_export(export_dir)
    if (found or outside_export) and not overwrite:
        what = ", ".join(found[:4] + (["..."] if len(found) > 4 else [])) or f"an export in {export_dir}"
        raise FileExistsError(
            f"{output_dir} holds a previous run ({what}). Pass --resume_from_checkpoint true to continue it, "
            "--overwrite_output_dir to start afresh (the old run is moved to OUTPUT_DIR/replaced-<time>/, nothing is "
            "deleted), or another --output_dir.")
    check_export_dir(export_dir)
    if overwrite and main_process:
        for flag, path in inputs.items():
            if path and Path(path).exists() and Path(path).resolve().is_relative_to(output_dir.resolve()):
                raise ValueError(f"{flag} {path} lies inside --output_dir {output_dir}, which --overwrite_output_dir "
                                 "would move aside; keep the run's inputs outside its output folder.")
        entries = previous_run(output_dir) + [n for n in ("tokenizer", "runs", RUN_INPUTS, "global_batch.json")
                                           if (output_dir / n).exists()]
        if entries:
            target = output_dir / f"replaced-{timestamp()}"
            target.mkdir()
            for name in entries:
                (output_dir / name).rename(target / name)
            logger.warning("--overwrite_output_dir: moved the previous run (%s) to %s.", ", ".join(entries), target)
        if outside_export:
            move_aside(export_dir)
    if data_inputs is not None:
        record_run_inputs(output_dir, data_inputs)
    return None


def check_resume_path(checkpoint: Path) -> None:
    """A checkpoint named by --resume_from_checkpoint: a folder, complete (`checkpoint_problem`: its state, its
    weights, its sharded parts whole) and saved by the engine this run uses; refused in one line otherwise."""
    flag = f"--resume_from_checkpoint {checkpoint}"
    if not checkpoint.is_dir():
        raise FileNotFoundError(f"{flag}: no such checkpoint folder.")
    problem = checkpoint_problem(checkpoint)
    if problem:
        raise FileNotFoundError(f"{flag} cannot be resumed ({problem}): a save that did not finish, or damaged "
                                "since; pass a complete one, or --resume_from_checkpoint true for the newest complete "
                                "one. Nothing was written.")
    mismatch = engine_mismatch(checkpoint, fsdp_launch())
    if mismatch:
        raise ValueError(f"{flag} {mismatch}.")


def record_run_inputs(output_dir: Path, data_inputs: dict) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    staged = output_dir / f".{RUN_INPUTS}.{os.getpid()}"
    staged.write_text(json.dumps(data_inputs, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(staged, output_dir / RUN_INPUTS)  # whole or not at all: every process may write it


# Flags of `check_run_inputs`'s record that name the weights a run started from, not its data.
STARTING_FLAGS = ("--init_from", "--init_generator_from")


def check_run_inputs(run_dir: Path, data_inputs: dict, checkpoint: str) -> None:
    """Refuse to resume `checkpoint` with data settings or starting weights (`STARTING_FLAGS`) other than those its
    run started with, naming each change as what it is."""
    record = run_dir / RUN_INPUTS
    if not record.is_file():
        logger.warning("%s has no record of the data settings it was trained with (an older run); resuming with "
                       "today's flags unchecked.", run_dir)
        return
    try:
        recorded = json.loads(record.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{record} is damaged ({error}); it records the data settings of the run to resume. Restore "
                         "it, or start a new run (--overwrite_output_dir or another --output_dir).") from None
    # Only the flags this run's examples depend on: one the record holds that plays no part now (the vocabulary size
    # of a run that trains no tokenizer) is not a change.
    changed = [key for key in sorted(data_inputs) if recorded.get(key) != data_inputs.get(key)]
    if changed:
        def listed(keys):
            return "; ".join(f"{key} {recorded.get(key)!r} then, {data_inputs.get(key)!r} now" for key in keys)

        data = [key for key in changed if key not in STARTING_FLAGS]
        start = [key for key in changed if key in STARTING_FLAGS]
        faults, reasons = [], []
        if data:
            faults.append(f"was trained with other data settings ({listed(data)})")
            reasons.append("on the examples its checkpoints were trained on")
        if start:
            faults.append(f"started from other weights ({listed(start)})")
            reasons.append("from the weights, architecture and tokenizer it started from")
        raise ValueError(
            f"--resume_from_checkpoint {checkpoint}: the run {' and '.join(faults)}. Resume with the same flags, or "
            "start a new run (--overwrite_output_dir or another --output_dir): a resumed run must continue "
            f"{' and '.join(reasons)}.")


def reusable_tokenizer(tokenizer_dir: Path, inputs: dict, resuming: bool) -> bool:
    """Whether `tokenizer_dir` (if any) may be reused for a run with these inputs; raises if it must not be."""
    if not tokenizer_dir.is_dir():
        return False
    record = tokenizer_dir / TOKENIZER_INPUTS
    if not record.is_file():
        if resuming:  # the checkpoints were trained with it: it is the only vocabulary that fits them
            logger.warning("%s has no record of its inputs (an older run); reusing it for the resumed run.",
                           tokenizer_dir)
            return True
        raise FileExistsError(
            f"{tokenizer_dir} holds a tokenizer with no record of the data it was trained on. Pass --tokenizer_name "
            f"{tokenizer_dir} to use it anyway, --overwrite_output_dir to start afresh, or another --output_dir.")
    recorded = read_json_record(record, "it records what the run's tokenizer was made from: restore it, or start "
                                "afresh (--overwrite_output_dir or another --output_dir).")
    changed = sorted(key for key in set(recorded) | set(inputs) if recorded.get(key) != inputs.get(key))
    if changed and resuming and set(changed) <= set(SOURCE_KEYS):  # the flags themselves are checked by run_inputs
        logger.warning("%s: the tokenizer this run was given differs from when it started, or cannot be read now (%s); "
                       "the resumed run keeps this one, which its checkpoints were trained with.", tokenizer_dir,
                       ", ".join(changed))
        return True
    if changed:
        details = "; ".join(f"{key}: {recorded.get(key)!r} then, {inputs.get(key)!r} now" for key in changed)
        raise FileExistsError(
            f"{tokenizer_dir} was made from other inputs ({details}). Run with the same options, "
            "--overwrite_output_dir to start afresh (the old run is moved aside), or another --output_dir.")
    source = recorded.get(TOKENIZER_SOURCE)
    logger.info("Reusing the tokenizer in %s: made from the same inputs (%s).", tokenizer_dir,
                f"a given tokenizer whose files hash to {source}" if source else "the same corpus and settings")
    return True


def save_tokenizer(tokenizer, tokenizer_dir: Path, inputs: dict) -> None:
    tokenizer.save_pretrained(tokenizer_dir)
    (tokenizer_dir / TOKENIZER_INPUTS).write_text(json.dumps(inputs, indent=1, sort_keys=True))
