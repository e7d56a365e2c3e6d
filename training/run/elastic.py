"""Elastic runs: the global batch is a run's invariant, and an update can weigh its targets the same however the global
batch is split over processes, micro-batches and accumulation steps.

- `GLOBAL_BATCH_RECORD` (OUTPUT_DIR/global_batch.json) is written when a run starts: the global batch and how it was
  split. A resume on any number of processes keeps the global batch by deriving the accumulation steps,
  `global / (processes x per-device batch)` (`keep_global_batch`), or is refused in one line naming the numbers and
  the flags that would work. A run from before the record resumes as before on the same number of processes only.
- `--loss_normalization update` (`LossTerms`): every loss term's summed loss is divided by its target count over the
  whole update (all micro-batches of all processes), so 1 x 8, 2 x 4, 1 x 4 x 2 and 2 x 2 x 2 give the same update.
  The counts are read from the batches before the update's first forward (Trainer prefetches an update's
  micro-batches) and summed over the processes with one all-reduce, without a host sync.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import TrainerCallback

logger = logging.getLogger(__name__)

GLOBAL_BATCH_RECORD = "global_batch.json"
NORMALIZATIONS = ("recipe", "update")


# ---------------------------------------------------------------------------------------------- the global batch
def checkpoint_world_size(checkpoint: str | Path) -> int:
    """How many processes saved `checkpoint`: Trainer writes one rng_state_<rank>.pth per process (rng_state.pth
    alone for one)."""
    ranks = list(Path(checkpoint).glob("rng_state_*.pth"))
    return len(ranks) if ranks else 1


def global_batch(training_args) -> int:
    """Examples per update: per-device batch x processes x accumulation steps."""
    return (training_args.per_device_train_batch_size * training_args.world_size
            * training_args.gradient_accumulation_steps)


def batch_record(training_args, loss_normalization: str) -> dict:
    micro, processes = training_args.per_device_train_batch_size, training_args.world_size
    accumulation = training_args.gradient_accumulation_steps
    return {"global_batch": global_batch(training_args), "per_device_train_batch_size": micro,
            "processes": processes, "gradient_accumulation_steps": accumulation,
            "loss_normalization": loss_normalization}


def write_batch_record(output_dir: Path, record: dict) -> None:
    """The record, whole or not at all (every process may write the same one)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    staged = output_dir / f".{GLOBAL_BATCH_RECORD}.{os.getpid()}"
    staged.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(staged, output_dir / GLOBAL_BATCH_RECORD)


RECORD_COUNTS = ("global_batch", "per_device_train_batch_size", "processes", "gradient_accumulation_steps")


def positive_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def checked_record(record, path: Path, fix: str) -> dict:
    """`record` if it is a whole, consistent record of a global batch (every count a positive whole number, the
    global batch their product, a known loss normalisation, the same for its `resumed_as`); else one line naming
    `path`, the field and `fix`."""
    def refuse(field: str, problem: str):
        raise ValueError(f"{path}: {field} {problem}; the file records the run's global batch. {fix}")

    if not isinstance(record, dict):
        refuse("the content", "is not a JSON object")
    for part, fields in (("", record), ("resumed_as.", record.get("resumed_as"))):
        if part and fields is None:
            continue
        if not isinstance(fields, dict):
            refuse(part.rstrip("."), "is not a JSON object")
        for key in RECORD_COUNTS:
            if key not in fields:
                refuse(part + key, "is missing")
            if not positive_count(fields[key]):
                refuse(part + key, f"is {fields[key]!r}, not a positive whole number")
        split = (fields["per_device_train_batch_size"], fields["processes"], fields["gradient_accumulation_steps"])
        product = split[0] * split[1] * split[2]
        if fields["global_batch"] != product:
            refuse(part + "global_batch", f"is {fields['global_batch']}, but its split, {_split(*split)}, is {product}")
        if fields.get("loss_normalization", "recipe") not in NORMALIZATIONS:
            refuse(part + "loss_normalization", f"is {fields['loss_normalization']!r}, not one of "
                                                f"{', '.join(NORMALIZATIONS)}")
    if "resumed_as" in record and record["resumed_as"]["global_batch"] != record["global_batch"]:
        refuse("resumed_as.global_batch", f"is {record['resumed_as']['global_batch']}, not the run's "
                                          f"{record['global_batch']}")
    return record


def read_batch_record(run_dir: Path, fix: str | None = None) -> dict | None:
    """The run's record of its global batch (None: a run from before the record), checked whole."""
    path = run_dir / GLOBAL_BATCH_RECORD
    if not path.is_file():
        return None
    fix = fix or "Restore it, or start a new run (--overwrite_output_dir or another --output_dir)."
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{path} is damaged ({error}); it records the run's global batch. {fix}") from None
    return checked_record(record, path, fix)


def check_against_checkpoint(record: dict, run_dir: Path, checkpoint: Path) -> None:
    """The run's record must be that of `checkpoint`: its own copy (saved with it since the record's checks), or, for
    an older checkpoint, the per-device batch and processes that saved it must divide the global batch."""
    copy = checkpoint / GLOBAL_BATCH_RECORD
    restore = (f"Restore {run_dir / GLOBAL_BATCH_RECORD} from {copy}" if copy.is_file() else "Restore the record")
    if copy.is_file():
        try:
            own = checked_record(json.loads(copy.read_text(encoding="utf-8")), copy, "Resume from another checkpoint.")
        except (UnicodeDecodeError, ValueError) as error:
            raise ValueError(f"{copy} is damaged ({error}): resume from another checkpoint.") from None
        if own["global_batch"] != record["global_batch"]:
            raise ValueError(f"{run_dir / GLOBAL_BATCH_RECORD}: global_batch is {record['global_batch']}, but "
                             f"{checkpoint.name} was trained with {own['global_batch']} ({copy}). {restore} (the run's "
                             "global batch cannot change), or start a new run.")
        return
    state = checkpoint / "trainer_state.json"
    try:
        micro = int(json.loads(state.read_text(encoding="utf-8")).get("train_batch_size") or 0)
    except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError):
        return  # the checkpoint's own checks name a damaged trainer_state.json
    saved_by = checkpoint_world_size(checkpoint)
    if micro and record["global_batch"] % (micro * saved_by):
        raise ValueError(f"{run_dir / GLOBAL_BATCH_RECORD}: global_batch is {record['global_batch']}, which "
                         f"{checkpoint.name}'s {_processes(saved_by)} x {micro} per device (its trainer_state.json) "
                         f"cannot have trained. {restore}, or start a new run.")


def _divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


def _listed(numbers: list[int], bound: int = 64) -> str:
    """The counts a message offers, the small ones: a large global batch has more divisors than anyone reads."""
    return ", ".join(str(n) for n in numbers if n <= bound)


def _processes(count: int) -> str:
    return f"{count} process{'es' if count > 1 else ''}"


def _split(micro: int, processes: int, accumulation: int) -> str:
    return (f"{_processes(processes)} x {micro} per device x {accumulation} accumulation "
            f"step{'s' if accumulation > 1 else ''}")


def keep_global_batch(output_dir: Path, checkpoint: str | None, training_args, *, loss_normalization: str,
                      accumulates: bool, set_by_user: Callable[[str], bool],
                      per_micro_batch: bool = True) -> dict | None:
    """Record the global batch of a new run, or keep the recorded one on resume: sets
    `training_args.gradient_accumulation_steps` (or, for a trainer that cannot accumulate, the per-device batch) so
    that processes x per-device batch x accumulation = the recorded global batch, and says so in one line. Refuses
    in one line what cannot keep it. Returns the record (None for an older run without one)."""
    processes, micro = training_args.world_size, training_args.per_device_train_batch_size
    if checkpoint is None:
        record = batch_record(training_args, loss_normalization)
        if training_args.process_index == 0:
            write_batch_record(output_dir, record)
        logger.info("Global batch %d (%s), recorded in %s: a resume on any number of processes keeps it.",
                    record["global_batch"], _split(micro, processes, training_args.gradient_accumulation_steps),
                    GLOBAL_BATCH_RECORD)
        return record
    run_dir = Path(checkpoint).parent
    record = read_batch_record(run_dir)
    if record is not None:
        check_against_checkpoint(record, run_dir, Path(checkpoint))
        trained_with = (record.get("resumed_as") or record).get("loss_normalization", "recipe")
        if trained_with != loss_normalization:
            raise ValueError(f"--loss_normalization {loss_normalization}: the run was trained with "
                             f"--loss_normalization {trained_with} ({run_dir / GLOBAL_BATCH_RECORD}), and its updates "
                             f"would compute another loss from this step on. Resume with --loss_normalization "
                             f"{trained_with}, or start a new run.")
    if record is None:
        saved_by = checkpoint_world_size(checkpoint)
        if saved_by != processes:
            raise ValueError(
                f"--resume_from_checkpoint {checkpoint}: its run recorded no global batch (a run from before "
                f"{GLOBAL_BATCH_RECORD}) and was saved by {_processes(saved_by)}, this one "
                f"has {processes}: resume it on {_processes(saved_by)} with its own "
                "--per_device_train_batch_size and --gradient_accumulation_steps.")
        logger.info("%s recorded no global batch (an older run): resuming on the same %d process(es) with the flags as "
                    "given.", run_dir, processes)
        return None
    total = int(record["global_batch"])
    before = _split(record["per_device_train_batch_size"], record["processes"], record["gradient_accumulation_steps"])
    replaced = ""
    if not accumulates:  # the trainer takes no accumulation: the per-device batch carries the whole global batch
        if total % processes:
            working = _listed(_divisors(total), max(64, processes))
            raise ValueError(f"--resume_from_checkpoint {checkpoint}: the run's global batch of {total} ({before}) "
                             f"does not split over {processes} processes without accumulation, which this trainer "
                             f"cannot do: resume on a number of processes that divides {total} ({working}).")
        needed = total // processes
        if set_by_user("--per_device_train_batch_size") and micro != needed:
            replaced = f" (--per_device_train_batch_size {micro} replaced: this trainer takes no accumulation)"
        training_args.per_device_train_batch_size = needed
        training_args.gradient_accumulation_steps = 1
        accumulation = 1
        micro = needed
    else:
        per_step = micro * processes
        if total % per_step:
            fits = _divisors(total // processes) if total % processes == 0 else []
            options = ", ".join(f"--per_device_train_batch_size {m} (--gradient_accumulation_steps "
                                f"{total // processes // m})" for m in fits[-3:])
            where = (f"with {processes} processes and {options}" if options else
                     f"on a number of processes that divides {total} "
                     f"({_listed(_divisors(total))})")
            raise ValueError(f"--resume_from_checkpoint {checkpoint}: the run's global batch of {total} ({before}) is "
                             f"not a multiple of {_processes(processes)} x "
                             f"--per_device_train_batch_size {micro} = {per_step}; resume {where}.")
        accumulation = total // per_step
        given = training_args.gradient_accumulation_steps
        if set_by_user("--gradient_accumulation_steps") and given != accumulation:
            replaced = f" (--gradient_accumulation_steps {given} replaced)"
        training_args.gradient_accumulation_steps = accumulation
    now = _split(micro, processes, accumulation)
    logger.info("Global batch %d, recorded at the run's start (%s): resuming as %s%s.", total, before, now, replaced)
    if (micro != record["per_device_train_batch_size"] and per_micro_batch and loss_normalization == "recipe"
            and accumulates):
        logger.warning("The per-device batch changed from %d to %d under a recipe that weighs each micro-batch's mean "
                       "equally: every update sees the same examples, and is equal in expectation, not bitwise "
                       "(--loss_normalization update makes any split give the same update).",
                       record["per_device_train_batch_size"], micro)
    # Written once the resumed run trains (`ResumedSplit`): a resume refused after this point leaves the record as is.
    return {**record, "resumed_as": batch_record(training_args, loss_normalization)}


class ResumedSplit(TrainerCallback):
    """Writes a resumed run's split into its record (`resumed_as`) once it has trained a step: a resume refused before
    then leaves the record as it was."""

    def __init__(self, output_dir: Path, record: dict):
        self.output_dir, self.record, self.written = output_dir, record, False

    def on_step_end(self, args, state, control, **kwargs):
        if not self.written and state.is_world_process_zero:
            write_batch_record(self.output_dir, self.record)
        self.written = True


def node_count_refusal(run_dir: Path, nodes: int, processes_per_node: int) -> str | None:
    """Why a requeue of the run in `run_dir` onto `nodes` x `processes_per_node` processes cannot keep its global batch
    whatever the per-device batch (the processes do not divide it), naming the node counts that can; None when they
    can, or when the run recorded no global batch (pretrain.py decides then)."""
    record = read_batch_record(run_dir)
    if record is None:
        return None
    total = int(record["global_batch"])
    if total % (nodes * processes_per_node) == 0:
        return None
    before = _split(record["per_device_train_batch_size"], record["processes"], record["gradient_accumulation_steps"])
    per_node = _processes(processes_per_node)
    working = _divisors(total // processes_per_node) if total % processes_per_node == 0 else []
    fix = (f"requeue it with --nodes {_listed(working)}" if working else
           f"no number of nodes of {per_node} can: set GPUS_PER_NODE to a divisor of {total}")
    return (f"the run in {run_dir} trains a global batch of {total} ({before}), which {nodes} node"
            f"{'s' if nodes > 1 else ''} x {per_node} = {nodes * processes_per_node} cannot split: {fix}.")


def main(argv: list[str] | None = None) -> int:
    """`python -m encoder_zoo.training.run.elastic OUTPUT_DIR NODES PROCESSES_PER_NODE`: pretrain.sbatch's check,
    before it starts any node, that a requeue's node count can keep the run's global batch (exit 2 and one line if
    not)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m encoder_zoo.training.run.elastic", description=main.__doc__)
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("nodes")
    parser.add_argument("processes_per_node")
    args = parser.parse_args(argv)
    refusal = None
    for name, value in (("the node count (SLURM_NNODES)", args.nodes),
                        ("the processes per node (GPUS_PER_NODE)", args.processes_per_node)):
        if not (value.isdigit() and int(value) >= 1):
            refusal = f"{name} is {value!r}, not a positive whole number."
    if refusal is None and not args.output_dir.is_dir():
        refusal = (f"{args.output_dir} is not a folder: pass the run's OUTPUT_DIR (the folder that holds its "
                   "checkpoint-* and global_batch.json).")
    if refusal is None:
        try:
            refusal = node_count_refusal(args.output_dir, int(args.nodes), int(args.processes_per_node))
        except ValueError as error:  # a damaged record, named with its fix
            refusal = str(error)
    if refusal:
        print(f"pretrain.sbatch: {refusal}", file=sys.stderr)
        return 2
    return 0


# ---------------------------------------------------------------------------------------------- loss terms
def _targets(inputs: Mapping, config) -> torch.Tensor:
    return (inputs["labels"] != -100).sum()


def _rows(inputs: Mapping, config) -> torch.Tensor:
    return torch.as_tensor(inputs["next_sentence_label"].numel(), device=inputs["labels"].device)


def _sbo_targets(inputs: Mapping, config) -> torch.Tensor:
    """The SBO targets SpanBERT's head trains on: positions with an outside left boundary, at most
    `max_span_targets` into their span (`SpanBertForPreTraining.sbo_targets`), that carry a label."""
    left = inputs["span_left"]
    relative = torch.arange(left.shape[1], device=left.device) - left - 1
    return ((left >= 0) & (relative < config.max_span_targets) & (inputs["labels"] != -100)).sum()


def _real_tokens(inputs: Mapping, config) -> torch.Tensor:
    mask = inputs.get("attention_mask")
    if mask is None:  # a packed batch: every token is real
        return torch.as_tensor(inputs["input_ids"].numel(), device=inputs["input_ids"].device)
    return mask.sum()


@dataclass(frozen=True)
class LossTerm:
    """One term of a model's loss: the `output` its forward returns (a mean over `count` targets of a micro-batch),
    its weight in the loss (`weight`: a config attribute), and how the model divided its sum (`divisor`: the count,
    or SpanBERT's count + 1)."""

    output: str
    count: Callable[[Mapping, object], torch.Tensor]
    weight: str | None = None
    divisor: Callable[[torch.Tensor, object], torch.Tensor] | None = None

    def weight_of(self, config) -> float:
        return float(getattr(config, self.weight)) if self.weight else 1.0

    def divided_by(self, count: torch.Tensor, config) -> torch.Tensor:
        return self.divisor(count, config) if self.divisor else count.clamp(min=1)


def _sbo_divisor(count: torch.Tensor, config) -> torch.Tensor:
    extra = 1 if getattr(config, "sbo_loss_normalization", "authors") == "authors" else 0
    return (count + extra).clamp(min=1)


def family_loss_terms(config) -> tuple[LossTerm, ...] | None:
    """The loss terms a pretraining model of `config` returns, or None where update normalisation is not available
    (a GAN, the two-tower bilm losses whose directions the model averages)."""
    model_type = getattr(config, "model_type", None)
    if model_type == "spanbert":
        return (LossTerm("mlm_loss", _targets, "mlm_loss_weight"),
                LossTerm("sbo_loss", _sbo_targets, "sbo_loss_weight", _sbo_divisor),
                LossTerm("nsp_loss", _rows, "nsp_loss_weight"))
    if model_type == "teams":
        return (LossTerm("mlm_loss", _targets, "mlm_loss_weight"),
                LossTerm("rtd_loss", _real_tokens, "rtd_loss_weight"),
                LossTerm("mws_loss", _targets, "mws_loss_weight"))
    if model_type == "cloze" and getattr(config, "loss_type", "cloze") == "cloze":
        return (LossTerm("cloze_loss", _targets),)
    return None


def terms_present(terms: tuple[LossTerm, ...], inputs: Mapping) -> tuple[LossTerm, ...]:
    needs = {"sbo_loss": "span_left", "nsp_loss": "next_sentence_label"}
    return tuple(term for term in terms if needs.get(term.output, "labels") in inputs)


class UpdateNormalization:
    """`--loss_normalization update` inside a trainer: `count` the targets of an update's micro-batches (summed over
    the processes), then `loss` turns each micro-batch's term means back into sums divided by those counts."""

    def __init__(self, terms: tuple[LossTerm, ...], config, processes: int):
        self.terms, self.config, self.processes = terms, config, processes
        self.totals: dict[str, torch.Tensor] = {}

    def count(self, batches: list[Mapping], device, reduce=None) -> None:
        if not batches:
            return
        present = terms_present(self.terms, batches[0])
        counts = torch.stack([torch.stack([term.count(batch, self.config).to(device=device, dtype=torch.float64)
                                           for term in present]) for batch in batches]).sum(0)
        if reduce is not None and self.processes > 1:
            counts = reduce(counts)
        self.totals = {term.output: counts[index] for index, term in enumerate(present)}

    def loss(self, outputs: Mapping, inputs: Mapping) -> torch.Tensor:
        """This micro-batch's share of the update's loss: sum over terms of weight x (its summed loss) / (its count
        over the update), times the processes (DDP and FSDP average the processes' gradients)."""
        undeclared = [name for name, value in outputs.items() if name.endswith("_loss") and value is not None
                      and name not in self.totals and torch.is_tensor(value) and value.dim() == 0]
        if undeclared:
            raise ValueError(f"--loss_normalization update: the model returned {', '.join(undeclared)}, which has no "
                             "target count here; train with --loss_normalization recipe.")
        loss = None
        for term in terms_present(self.terms, inputs):
            mean = outputs.get(term.output)
            if mean is None:
                continue
            local = term.count(inputs, self.config)
            summed = mean.float() * term.divided_by(local, self.config).to(torch.float32)
            part = term.weight_of(self.config) * summed / self.totals[term.output].clamp(min=1).to(torch.float32)
            loss = part if loss is None else loss + part
        if loss is None:
            raise ValueError("--loss_normalization update: the model returned none of its loss terms.")
        return loss * self.processes


if __name__ == "__main__":
    raise SystemExit(main())
