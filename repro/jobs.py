"""The job graph of one experiment at one budget (`Sweep`): one job per subprocess of the project's own entry points
(and of repro's own small scripts: the floors, the positive control's random initialisation, the fine-tuned models'
predictions), cached by a hash of its flags and data, locked per cache entry, run in order. A cached job is reused
only as far as it was checked: its outputs parse, an export carries the export's own completeness marker, the models
it read still have the content it recorded, and (with `--rerun_stale`) it ran this checkout's code."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from encoder_zoo.repro.experiments import Arm, Setting
from encoder_zoo.repro.provenance import REFUSED, REPO, code_hash, model_files, model_hash, torch_threads
from encoder_zoo.repro.tasks import task_facts

PRETRAIN = REPO / "training" / "pretrain.py"
RUN_GLUE = REPO / "glue" / "run_glue.py"
RUN_QA = REPO / "qa" / "run_qa.py"
INIT = {"hire": REPO / "glue" / "init_hire.py", "bertac": REPO / "glue" / "init_bertac.py"}
FLOORS = REPO / "repro" / "floors.py"
RANDOM_INIT = REPO / "repro" / "random_init.py"
PREDICT = REPO / "repro" / "predict.py"
FLOOR_ARM = "floors"  # the `arm` of the floor jobs, which belong to no arm
# Each cache entry (a job's folder) is locked while a sweep checks or runs it: two sweeps sharing a cache never run one
# job twice, and never read or set aside the half-written outputs of a job the other is running.
ENTRY_LOCK = ".repro-entry.lock"
# What a finished job recorded in its folder: the code it ran and the content of the models it read.
RECORD = "repro-record.json"


def digest(payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def portable(payload, places: dict[str, str]):
    """`payload` with every path under one of `places` (a folder -> its name) written from that name: a key that names
    the cache's own folders and the installed MiniLM so is the same wherever they lie."""
    if isinstance(payload, str):
        for folder, name in places.items():
            if payload == folder or payload.startswith(folder.rstrip("/") + "/"):
                return name + payload[len(folder.rstrip("/")):]
        return payload
    if isinstance(payload, (list, tuple)):
        return [portable(item, places) for item in payload]
    if isinstance(payload, dict):
        return {key: portable(value, places) for key, value in payload.items()}
    return payload


def dataset_fingerprint(dataset: str | None):
    """A local dataset is keyed by its files' names, sizes and modification times; a Hub id by its name."""
    if not dataset:
        return None
    path = Path(dataset)
    if not path.exists():
        return dataset
    files = sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())
    return [dataset, [(str(p.relative_to(path) if path.is_dir() else p.name), p.stat().st_size, p.stat().st_mtime_ns)
                      for p in files]]


def cached_output(path: Path, folder: Path) -> bool:
    """Whether a job's output is in the cache. A JSON output that does not parse (a sweep killed while writing it, a
    damaged disk) is named, moved aside (the file, or the folder under the job's folder that holds it, renamed to
    `NAME.corrupt-TIME`; nothing is deleted) and reported missing, so its job runs again."""
    if not path.exists():
        return False
    if path.suffix != ".json":
        return True
    try:
        json.loads(path.read_text(encoding="utf-8"))
        return True
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        entry = folder / path.relative_to(folder).parts[0]
        aside = entry.with_name(f"{entry.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        entry.rename(aside)
        print(f"repro cache: {path} is not valid JSON ({error}); moved it aside to {aside} and running its job again.",
              file=sys.stderr)
        return False


def glue_run_scores(result: dict, task: str | None = None) -> dict[int, dict]:
    """{seed: metrics} of a glue_results.json's `task` (default: its first), on the scale the cache and the reports
    read (the metrics' own 0-1, `glue.tasks.Scoring.display_scale` turns it into points): the file holds points
    since it says so (`scale`), 0-1 before."""
    runs = (result["tasks"][task] if task else next(iter(result["tasks"].values())))["runs"]
    divisor = 100.0 if str(result.get("scale", "")).startswith("points") else 1.0
    return {run["seed"]: {key: value / divisor for key, value in run["metrics"].items()} for run in runs}


def flag_value(flags: list[str], name: str) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else None


def write_whole(path: Path, text: str) -> None:
    """Write `path` whole or not at all (a staged file renamed into place): a reader never sees half of it."""
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(text, encoding="utf-8")
    os.replace(staged, path)


@dataclass
class Job:
    """One subprocess of the sweep. `done` tells whether its outputs are already cached, `reusable` whether they may
    stand for it."""

    kind: str  # pretrain, init, random_init, finetune, predict, floor
    arm: str
    name: str
    folder: Path
    command: list[str]
    outputs: list[Path]
    needs: list["Job"] = field(default_factory=list)
    seeds: tuple[int, ...] = ()  # fine-tuning seeds this job produces (run_glue takes several)
    status: str = "pending"
    inputs: list[Path] = field(default_factory=list)  # model folders it reads: their content is recorded and checked
    exit_code: int | None = None  # the entry point's exit status when it failed (REFUSED: it refused its input)

    @property
    def failed(self) -> bool:
        """Whether it failed, or was skipped for a failure upstream: its outputs in the cache, if any, are not this
        sweep's (they were made before, on other inputs), and nothing reads them."""
        return self.status == "failed" or self.status.startswith("skipped")

    def done(self) -> bool:
        """Whether its outputs are in the cache: every one checked, and set aside if corrupted (`cached_output`)."""
        return all([cached_output(p, self.folder) for p in self.outputs])

    @property
    def log(self) -> Path:
        return self.folder / "log.txt"

    def record(self) -> dict:
        """What the job recorded when it finished ({} for an entry cached before records were kept)."""
        try:
            record = json.loads((self.folder / RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def input_name(self, path: Path) -> str:
        """How the record names a model it read: relative to the job's folder, so that a moved cache keeps it."""
        return os.path.relpath(path, self.folder)

    def write_record(self, code: str | None) -> None:
        write_whole(self.folder / RECORD, json.dumps({"code": code, "inputs": {
            self.input_name(path): model_hash(path) for path in self.inputs}}, indent=1))

    def ran_code(self) -> str | None:
        """The code hash (`provenance.code_hash`) of the run behind the cached outputs; None where it is unknown."""
        return self.record().get("code")

    def changed_input(self) -> str | None:
        """Why a model this job read is not the one its outputs came from, or None: its content hash differs from the
        one recorded (an export retrained since); in an entry that recorded none, its files are newer than the
        outputs."""
        recorded = self.record().get("inputs") or {}
        for path in self.inputs:
            name = self.input_name(path)
            if name in recorded:
                now = model_hash(path)
                if recorded[name] != now:
                    return f"the model it read, {path}, has changed since (content {recorded[name]} -> {now})"
            elif any(p.stat().st_mtime_ns > min(o.stat().st_mtime_ns for o in self.outputs) for p in model_files(path)):
                return f"the model it read, {path}, was written after its results (no content recorded)"
        return None

    def reusable(self, rerun_stale: bool = False) -> bool:
        """Whether the cached outputs stand for this job: they are there and valid (`done`), the models it read have
        the content they had, and, with `rerun_stale`, it ran this checkout's code. Outputs that fail the last two
        are moved aside (`set_aside`), so that the job runs again. An entry that recorded no content for its inputs
        gets the content they have now."""
        if not self.done():
            return False
        why = self.changed_input()
        if why is None and rerun_stale and self.ran_code() != code_hash():
            code = self.ran_code()
            why = f"it ran other code ({code})" if code else "it did not record its code (cached before runs did)"
        if why is not None:
            set_aside(self, why)
            return False
        record = self.record()
        if self.inputs and set(record.get("inputs") or {}) != {self.input_name(p) for p in self.inputs}:
            self.write_record(record.get("code"))
        return True


def set_aside(job: Job, why: str) -> Path:
    """Move a stale entry's files to a sibling `FOLDER.stale-TIME` (nothing is deleted); the folder keeps its key and
    its hidden lock files."""
    aside = job.folder.with_name(f"{job.folder.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
    while aside.exists():
        aside = aside.with_name(aside.name + "-1")
    aside.mkdir()
    for entry in job.folder.iterdir():
        if entry.name != "key.json" and not entry.name.startswith("."):
            entry.rename(aside / entry.name)
    print(f"repro cache: {job.folder}: {why}; moved its files aside to {aside} and running it again.", file=sys.stderr)
    return aside


def set_aside_damaged_export(export: Path) -> None:
    """An export folder without its completeness marker was damaged after it was written (an export is published
    whole): moved aside to a sibling `export.damaged-TIME` (nothing is deleted), so the pretraining can export
    again; pretrain.py itself refuses to write over files that are not an export."""
    from encoder_zoo.training.run.folders import EXPORT_MARKER, is_export

    if export.is_dir() and any(export.iterdir()) and not is_export(export):
        aside = export.with_name(f"{export.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        export.rename(aside)
        print(f"repro cache: {export} is not a complete export (no {EXPORT_MARKER}); moved it aside to {aside} "
              "and exporting again.", file=sys.stderr)


class Sweep:
    """The jobs of one experiment at one budget (a `Setting`, `Experiment.at`), in order, with where each score is
    read from (`sources`), each fine-tuned model's predictions (`predictions`), each arm's floor on each task
    (`floors`), and the pretraining behind each arm's unit (`pretraining`)."""

    def __init__(self, setting: Setting, output_dir: Path):
        if setting.budget.pretrain_text and not setting.dataset:  # the tasks' own text (`Budget.pretrain_text`)
            from encoder_zoo.repro.tasks import pretraining_text

            setting = setting.with_dataset(str(pretraining_text(setting.budget.pretrain_text, output_dir / "cache"
                                                                / "text")))
        self.setting, self.experiment, self.budget = setting, setting.experiment, setting.budget
        self.dataset, self.tasks, self.arms = setting.dataset, setting.tasks, setting.arms
        self.warmup_steps, self.schedules = setting.shared_warmup_steps, setting.schedules
        self.units = setting.unit_seeds or self.budget.unit_seeds
        self.cache = output_dir / "cache"
        from encoder_zoo.training.run import minilm_path

        # A job's key names the cache's folders and the installed MiniLM by name (`portable`), not by where they lie:
        # a cache moved, copied to another machine or shared by sweeps with other output folders keeps its keys.
        self.places = {str(self.cache): "OUTPUT_DIR/cache", minilm_path(): "MINILM"}
        self.jobs: list[Job] = []
        # (arm, task, unit, finetune_seed or None) -> (job producing the number, the file it is read from)
        self.sources: dict = {}
        # (arm, task, unit, finetune_seed) -> (job producing them, the file of the evaluation rows' predictions)
        self.predictions: dict = {}
        # (arm, task) -> the floor job whose output is the arm's floor on the task (repro/floors.py)
        self.floors: dict[tuple[str, str], Job] = {}
        # (arm, unit) -> the pretrainings behind it: its own or its backbone's, and its CNN's
        self.pretraining: dict[tuple[str, int], list[Job]] = {}
        for arm in self.arms:
            for unit in self.units:
                self.add_arm(arm, unit)
        self.add_predictions()
        self.add_floors()

    # --------------------------------------------------------------------------------------------- building jobs
    def dataset_key(self):
        """The pretraining corpus in a key: a file the sweep wrote into its cache (the tasks' text, named by its
        content's hash) by its name; any other by `dataset_fingerprint`."""
        named = portable(self.dataset, self.places)
        return named if named != self.dataset else dataset_fingerprint(self.dataset)

    def digest(self, key: dict) -> str:
        """The hash that names a job's folder: of its key with its paths made portable."""
        return digest(portable(key, self.places))

    def pretrain_job(self, arm: Arm, flags: list[str], seed: int, label: str) -> Job:
        key = {"flags": flags, "seed": seed, "data": self.dataset_key() if label == "pretrain" else None}
        model = flag_value(flags, "--model")
        folder = self.cache / "pretrain" / f"{model}-{self.digest(key)}"
        for job in self.jobs:  # the same recipe and data in another arm: one run
            if job.folder == folder:
                return job
        command = [sys.executable, str(PRETRAIN), *flags, "--seed", str(seed), "--output_dir", str(folder),
                   "--save_steps", str(self.save_steps(flags)), "--dataloader_num_workers", "0",
                   "--logging_steps", str(max(1, self.steps(flags) // 20)), "--disable_tqdm", "true"]
        from encoder_zoo.training.run.folders import EXPORT_MARKER

        # An export is complete when it carries the marker its export writes (a folder holding weights may not be).
        job = Job("pretrain", arm.name, f"{label} {arm.name} ({model}) seed {seed}", folder, command,
                  [folder / "export" / "model.safetensors", folder / "export" / EXPORT_MARKER])
        (folder / "key.json").parent.mkdir(parents=True, exist_ok=True)
        (folder / "key.json").write_text(json.dumps(portable(key, self.places), indent=1))
        self.jobs.append(job)
        return job

    @staticmethod
    def steps(flags: list[str]) -> int:
        return int(flags[flags.index("--max_steps") + 1])

    def save_steps(self, flags: list[str]) -> int:
        """Four checkpoints a run, so a killed sweep loses at most a quarter of a pretraining; short runs save once."""
        steps = self.steps(flags)
        return steps // 4 if steps >= 200 else steps

    def add_arm(self, arm: Arm, unit: int) -> None:
        """The jobs of `arm`'s unit `unit`: its pretraining (seed `unit`), or its CNN pretraining and new layers
        (seed `unit`), or (the positive control) the random initialisation of another arm's model (seed `unit`),
        then its fine-tuning runs."""
        encoder_job = self.encoder_job(arm, unit) if arm.pretrain else None
        for task in self.tasks:  # a pretraining metric: the last evaluation its pretraining logged
            if encoder_job and task_facts(task).pretraining_metric:
                self.sources[(arm.name, task, unit, None)] = (encoder_job, encoder_job.folder / "trainer_state.json")
        backbone_job = self.backbone_job(arm, unit)
        cnn_job = self.cnn_job(arm, unit)
        self.pretraining[(arm.name, unit)] = [j for j in (encoder_job or backbone_job, cnn_job) if j]
        for task in self.tasks:
            made = None if task_facts(task).pretraining_metric else self.model_of(arm, task, unit)
            if made:
                self.finetune_jobs(arm, task, *made, unit)

    def backbone_job(self, arm: Arm, unit: int) -> Job | None:
        backbone = self.setting.arms_by_name[arm.backbone_from] if arm.backbone_from else None
        return self.encoder_job(backbone, unit) if backbone else None

    def cnn_job(self, arm: Arm, unit: int) -> Job | None:
        return self.pretrain_job(arm, [*self.setting.cnn_flags, *arm.cnn], unit, "cnn") if arm.cnn is not None else None

    def model_of(self, arm: Arm, task: str, unit: int) -> tuple[str, list[Job]] | None:
        """The model `arm`'s unit `unit` fine-tunes on `task`, with the jobs that make it (their jobs are made here
        once); None where the arm has no run for the task (HIRE on QA)."""
        if arm.random_init_of:
            source = self.model_of(self.setting.arms_by_name[arm.random_init_of], task, unit)
            if source is None:
                return None
            job = self.random_init_job(arm, *source, unit)
            return str(job.folder / "model"), [job]
        needs: list[Job] = []
        if arm.pretrain:
            job = self.encoder_job(arm, unit)
            needs, model = [job], str(job.folder / "export")
        backbone_job, cnn_job = self.backbone_job(arm, unit), self.cnn_job(arm, unit)
        if cnn_job is not None:
            needs = [cnn_job]
        if backbone_job is not None:
            needs = [*needs, backbone_job]
        if arm.init:
            if task_facts(task).finetuned_by == "qa" and arm.init != "bertac":
                return None
            model_job = self.init_job(arm, task, cnn_job, unit, backbone_job)
            return str(model_job.folder / "model"), [*needs, model_job]
        if arm.pretrain:
            return model, needs
        from encoder_zoo.training.run import minilm_path

        return minilm_path(), needs

    def random_init_job(self, arm: Arm, model: str, needs: list[Job], unit: int) -> Job:
        """The positive control's model: `model` (another arm's) re-created from its config at random
        initialisation, seed `unit` (repro/random_init.py)."""
        key = {"random_init": model, "seed": unit}
        folder = self.cache / "random" / f"{arm.random_init_of}-{self.digest(key)}"
        for job in self.jobs:
            if job.folder == folder:
                return job
        command = [sys.executable, str(RANDOM_INIT), "--model", model, "--seed", str(unit), "--output_dir",
                   str(folder / "model")]
        from encoder_zoo.repro.random_init import MARKER

        job = Job("random_init", arm.name, f"random init of {arm.random_init_of}'s model seed {unit}", folder, command,
                  [folder / "model" / MARKER], needs=list(needs), inputs=[Path(model)])
        self.jobs.append(job)
        return job

    def encoder_job(self, arm: Arm, unit: int) -> Job:
        """The pretraining of a pretrained arm's unit (one job, however many arms build on it)."""
        warmup = self.setting.warmup_steps[arm.name]
        flags = [*arm.pretrain, *self.setting.pretrain_flags, "--warmup_steps", str(warmup)]
        return self.pretrain_job(arm, flags, unit, "pretrain")

    def init_job(self, arm: Arm, task: str, cnn_job: Job | None, unit: int, backbone_job: Job | None = None) -> Job:
        qa = task_facts(task).finetuned_by == "qa"
        head = ["--head", "question_answering"] if qa else ["--num_labels", str(self.setting.num_labels[task])]
        backbone = ["--backbone", str(backbone_job.folder / "export"), "--trust_remote_code"] if backbone_job else []
        flags = [*arm.init_flags, *backbone, *(head if arm.init == "bertac" else head[-2:] if not qa else []),
                 "--seed", str(unit)]
        key = {"init": arm.init, "flags": flags, "cnn": str(cnn_job.folder) if cnn_job else None}
        folder = self.cache / "init" / f"{arm.init}-{self.digest(key)}"
        for job in self.jobs:
            if job.folder == folder:
                return job
        command = [sys.executable, str(INIT[arm.init]), *flags, "--output_dir", str(folder / "model")]
        if cnn_job is not None:
            command += ["--cnn", str(cnn_job.folder / "export")]
        needs = [j for j in (cnn_job, backbone_job) if j]
        job = Job("init", arm.name, f"{arm.init} init {' '.join(flags)}", folder, command,
                  [folder / "model" / "config.json"], needs=needs, inputs=[j.folder / "export" for j in needs])
        self.jobs.append(job)
        return job

    def finetune_folder(self, arm: Arm, task: str, key: dict) -> Path:
        """A fine-tuning's cache folder, named by its arm, task and a hash of its model, flags and seeds. The same run
        made by another experiment under its own arm's name (the zoo's hire+minilm is hire's `hire`) is reused: the
        hash names the run, the arm only labels the folder."""
        run = f"{task}-{self.digest(key)}"
        own = self.cache / "finetune" / f"{arm.name}-{run}"
        return own if own.exists() else next(iter(sorted(own.parent.glob(f"*-{run}"))), own)

    def finetune_jobs(self, arm: Arm, task: str, model: str, needs: list[Job], unit: int) -> None:
        seeds = self.setting.finetune_seeds[unit]
        # Over the MiniLM the budget's MiniLM epochs; an encoder of ours, or a fusion over one, fine-tunes alike; the
        # positive control as the arm whose model it re-creates.
        budget_flags = self.setting.finetune_flags[self.setting.over_minilm(arm)]
        like = self.setting.arms_by_name[arm.random_init_of] if arm.random_init_of else arm
        jobs = []
        if task_facts(task).finetuned_by == "glue":
            # A fusion init's classifier is new for the task's labels; a QA init already carries its QA head.
            remote = ["--trust_remote_code", *(["--ignore_mismatched_sizes"] if like.init else [])]
            preset_name = like.glue_preset or self.experiment.glue_preset
            preset = ["--preset", preset_name] if preset_name else []
            flags = [*remote, *preset, "--task_name", task, *budget_flags, "--report_to", "none",
                     "--save_strategy", "no", "--disable_tqdm", "true"]
            folder = self.finetune_folder(arm, task, {"model": model, "flags": flags, "seeds": seeds})
            command = [sys.executable, str(RUN_GLUE), "--model_name_or_path", model, *flags, "--seeds",
                       *map(str, seeds), "--output_dir", str(folder / "run")]
            jobs.append(Job("finetune", arm.name, f"{task} {arm.name} unit {unit} seeds {list(seeds)}", folder,
                            command, [folder / f"seed-{s}.json" for s in seeds], needs=needs, seeds=seeds,
                            inputs=[Path(model)]))
        else:
            length = max(self.budget.finetune_max_seq_length, 96)
            flags = ["--trust_remote_code", "--dataset", task, *budget_flags, "--max_seq_length", str(length),
                     "--doc_stride", str(length // 4), "--max_question_length", str(length // 3),
                     "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true"]
            for seed in seeds:
                folder = self.finetune_folder(arm, task, {"model": model, "flags": flags, "seed": seed})
                command = [sys.executable, str(RUN_QA), "--model_name_or_path", model, *flags, "--seed", str(seed),
                           "--output_dir", str(folder / "run")]
                jobs.append(Job("finetune", arm.name, f"{task} {arm.name} unit {unit} seed {seed}", folder, command,
                                [folder / f"seed-{seed}.json"], needs=needs, seeds=(seed,), inputs=[Path(model)]))
        self.jobs += jobs
        for job in jobs:
            for seed in job.seeds:
                self.sources[(arm.name, task, unit, seed)] = (job, job.folder / f"seed-{seed}.json")
                if task_facts(task).finetuned_by == "qa":  # run_qa.py writes its predictions itself
                    self.predictions[(arm.name, task, unit, seed)] = (job, job.folder / "run" / "predictions.json")

    def add_predictions(self) -> None:
        """run_glue.py saves each seed's model, not its predictions: one repro/predict.py job per arm and sentence
        task predicts the evaluation rows with every model its fine-tunings saved (what tells two arms with the same
        scores apart)."""
        runs: dict[tuple[str, str], list[tuple[int, Job]]] = {}
        for (arm, task, unit, _), (job, _) in self.sources.items():
            if task_facts(task).finetuned_by == "glue" and all(job is not other
                                                               for _, other in runs.get((arm, task), [])):
                runs.setdefault((arm, task), []).append((unit, job))
        for (arm, task), units in runs.items():
            predict = self.predict_job(arm, task, [job for _, job in units])
            for unit, job in units:
                for seed in job.seeds:
                    self.predictions[(arm, task, unit, seed)] = (predict, predict.folder / f"seed-{seed}.json")

    def predict_job(self, arm: str, task: str, finetunes: list[Job]) -> Job:
        """Named by its task and a hash of the fine-tunings it reads, not by its arm: another experiment's arm reading
        the same runs (the zoo's hire+minilm is HIRE's `hire`) reuses it."""
        key = {"predict": [str(job.folder) for job in finetunes], "seeds": [list(job.seeds) for job in finetunes]}
        folder = self.cache / "predict" / f"{task}-{self.digest(key)}"
        for job in self.jobs:
            if job.folder == folder:
                return job
        flags = finetunes[0].command[2:]
        seeds = [seed for job in finetunes for seed in job.seeds]
        models = [job.folder / "run" / task / f"seed-{seed}" for job in finetunes for seed in job.seeds]
        command = [sys.executable, str(PREDICT), "--task", task,
                   "--max_seq_length", flag_value(flags, "--max_seq_length"),
                   *(["--max_eval_samples", flag_value(flags, "--max_eval_samples")]
                     if "--max_eval_samples" in flags else []),
                   "--models", *map(str, models), "--names", *(f"seed-{seed}" for seed in seeds),
                   "--output_dir", str(folder)]
        job = Job("predict", arm, f"predictions of {task} {arm} (every unit)", folder, command,
                  [folder / f"seed-{seed}.json" for seed in seeds], needs=list(finetunes), seeds=tuple(seeds),
                  inputs=models)
        self.jobs.append(job)
        return job

    # --------------------------------------------------------------------------------------------------- floors
    def add_floors(self) -> None:
        """Each arm's floor on each task it has runs for (repro/floors.py), the kind its spec declares: on a
        fine-tuned task, a trivial model on the training and evaluation rows its fine-tunings read (bag-of-words for
        sentence tasks, the best first-k-words answer for QA); on a pretraining metric, one on the pretraining's own
        held-out documents (the unigram loss under its own tokenizer). Arms reading the same rows share one job."""
        for arm in self.arms:
            for task in self.tasks:
                facts = task_facts(task)
                runs = [job for (name, t, unit, _), (job, _) in self.sources.items() if name == arm.name and t == task]
                if not runs or facts.floor is None:
                    continue
                if facts.pretraining_metric:
                    # Only a loss the arm's model logs (the cloze model's is no MLM loss, a cloze arm's no bilm loss);
                    # one floor per pretraining, under whichever of its losses (one tokenizer, one held-out split).
                    if self.logs(arm, facts.spec.logged_output):
                        made = next((job for job in self.jobs if job.kind == "floor" and job.needs == [runs[0]]
                                     and job.command[2] == facts.floor), None)
                        self.floors[(arm.name, task)] = made or self.pretraining_floor_job(task, facts.floor, runs[0])
                else:
                    self.floors[(arm.name, task)] = self.floor_job(task, facts.floor, self.setting.train_rows(arm))

    @staticmethod
    def logs(arm: Arm, output: str) -> bool:
        """Whether `arm`'s model logs `output`: its recipe's under the arm's `--config_overrides` (`Recipe.logs`)."""
        from encoder_zoo.training.recipes import get_recipe
        from encoder_zoo.training.run import parse_overrides

        overrides = parse_overrides(flag_value(list(arm.pretrain), "--config_overrides"))
        return output in get_recipe(arm.recipe).logs(overrides)

    def floor_job(self, task: str, kind: str, train_rows: int | None) -> Job:
        key = {"floor": kind, "task": task, "train_rows": train_rows, "eval_rows": self.budget.max_eval_samples,
               "seed": 0}
        folder = self.cache / "floor" / f"{task}-{self.digest(key)}"
        command = [sys.executable, str(FLOORS), kind, "--task", task,
                   *(["--max_train_samples", str(train_rows)] if train_rows else []),
                   *(["--max_eval_samples", str(self.budget.max_eval_samples)] if self.budget.max_eval_samples else []),
                   "--seed", "0", "--output", str(folder / "floor.json")]
        return self.add_floor(Job("floor", FLOOR_ARM, f"{kind} floor of {task} ({train_rows or 'all'} training rows)",
                                  folder, command, [folder / "floor.json"]))

    def pretraining_floor_job(self, task: str, kind: str, pretraining: Job) -> Job:
        """The `kind` floor (unigram) of a pretraining's metric `task`: its own tokenizer, documents and split (the
        pretraining's flags, read again by repro/floors.py)."""
        key = {"floor": kind, "pretraining": str(pretraining.folder)}
        folder = self.cache / "floor" / f"{task}-{self.digest(key)}"
        export = pretraining.folder / "export"
        command = [sys.executable, str(FLOORS), kind, "--export", str(export), "--output",
                   str(folder / "floor.json"), "--", *pretraining.command[2:]]
        return self.add_floor(Job("floor", FLOOR_ARM, f"{kind} floor of {pretraining.name}", folder, command,
                                  [folder / "floor.json"], needs=[pretraining], inputs=[export]))

    def add_floor(self, job: Job) -> Job:
        for other in self.jobs:
            if other.folder == job.folder:
                return other
        self.jobs.append(job)
        return job

    # --------------------------------------------------------------------------------------------------- running
    def run(self, log_path: Path, rerun_stale: bool = False) -> None:
        """Run every job that is not reusable from the cache (`Job.reusable`; `rerun_stale`: nor one that ran other
        code), each once its needs are done, and log each run to `log_path`."""
        from tqdm.auto import tqdm

        from encoder_zoo.training import run as locks

        for job in self.jobs:  # in order: a job whose need runs again is checked once that need is done
            reusable = all(n.status == "cached" for n in job.needs) and self.cached_now(job, rerun_stale)
            job.status = "cached" if reusable else "pending"
        bar = tqdm(total=len(self.jobs), initial=sum(job.status == "cached" for job in self.jobs),
                   desc=f"{self.experiment.name}/{self.budget.name}", unit="run", dynamic_ncols=True)
        pending = [job for job in self.jobs if job.status != "cached"]  # in order: a job's needs come before it
        while pending:
            job = pending[0]
            failed = [n for n in job.needs if n.failed]
            if failed:
                job.status = f"skipped: {failed[0].name} failed (log: {failed[0].log})"
                pending.remove(job)
                bar.update(1)
                continue
            # The first job whose needs are met and that no other sweep sharing the cache is running: a sweep
            # started beside another (say with other --units) works on its own jobs first and waits only when
            # every job it can start is another's.
            ready = [j for j in pending if all(n.status in ("done", "cached") for n in j.needs)]
            job = next((j for j in ready if locks.try_hold(j.folder, ENTRY_LOCK)), ready[0])
            pending.remove(job)
            bar.set_postfix_str(job.name)
            start = time.time()
            locks.wait_and_hold(job.folder, ENTRY_LOCK, lambda holder, job=job: tqdm.write(
                f"Waiting for {job.name}: another sweep is running it ({holder}); its result will be reused."))
            try:
                if job.reusable(rerun_stale):  # another sweep ran it meanwhile, or its needs ran to the same models
                    job.status = "cached"
                    bar.update(1)
                    continue
                job.status = self.execute(job)
                if job.status == "done":
                    job.write_record(code_hash())
            finally:
                locks.release(job.folder, ENTRY_LOCK)
            with open(log_path, "a") as handle:
                handle.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "kind": job.kind, "arm": job.arm,
                                         "job": job.name, "folder": str(job.folder), "status": job.status,
                                         "seconds": round(time.time() - start, 1),
                                         "torch_threads": torch_threads()}) + "\n")
            if job.status == "failed":
                tqdm.write(f"FAILED: {job.name} (log: {job.log})")
            bar.update(1)
        bar.close()

    def failed_jobs(self) -> list[Job]:
        return [job for job in self.jobs if job.status == "failed"]

    def failure_advice(self) -> str:
        """What a user can do about this sweep's failed jobs: each named with its log and its folder."""
        failed = self.failed_jobs()
        skipped = sum(job.status.startswith("skipped") for job in self.jobs)
        lines = [f"{len(failed)} run(s) failed" + (f" and {skipped} were skipped for it" if skipped else "")
                 + ": the report shows no score for them."]
        for job in failed:
            lines.append(f"  - {job.name}: log {job.log}; its folder {job.folder}")
        refused = [job for job in failed if job.exit_code == REFUSED]
        if refused:
            lines.append(f"{len(refused)} of them refused their input (exit status {REFUSED}; the log's last line "
                         "names the flag or file): running the same command again repeats the refusal. Change what "
                         "it names: a value of this command (a --grid entry, --units, --dataset) or of its budget, "
                         "or a damaged cached file (delete its folder, named above).")
        if len(refused) < len(failed):
            lines.append(("The others: f" if refused else "F") + "ix what the log names and run the same command "
                         "again: failed runs run again, finished ones are reused. A run that fails on its own cached "
                         "files (a damaged export) starts over once its folder, named above, is deleted; one that "
                         "fails reading a model cached by other code runs again after `--rerun_stale` retrains that "
                         "model.")
        return "\n".join(lines)

    @staticmethod
    def cached_now(job: Job, rerun_stale: bool = False) -> bool:
        """Whether `job` is reusable from the cache; False while another sweep holds its entry (it is waited for
        later)."""
        from encoder_zoo.training.run import release, try_hold

        if not try_hold(job.folder, ENTRY_LOCK):
            return False
        try:
            return job.reusable(rerun_stale)
        finally:
            release(job.folder, ENTRY_LOCK)

    def execute(self, job: Job) -> str:
        job.folder.mkdir(parents=True, exist_ok=True)
        command = list(job.command)
        if job.kind == "pretrain":
            set_aside_damaged_export(job.folder / "export")
        if job.kind == "pretrain" and any(job.folder.glob("checkpoint-*")):
            command += ["--resume_from_checkpoint", "true"]  # the entry point's own exact resume
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               "TOKENIZERS_PARALLELISM": "false"}
        with open(job.log, "a") as log:
            log.write(f"\n$ {shlex.join(command)}\n")
            log.flush()
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env).returncode
        if code != 0:
            job.exit_code = code
            return "failed"
        if job.kind == "finetune":
            self.collect(job)
        return "done" if job.done() else "failed"

    @staticmethod
    def collect(job: Job) -> None:
        """Split the entry point's result file into one cached JSON per seed."""
        run = job.folder / "run"
        if (run / "glue_results.json").exists():
            result = json.loads((run / "glue_results.json").read_text())
            for seed, metrics in glue_run_scores(result).items():
                write_whole(job.folder / f"seed-{seed}.json", json.dumps(metrics, indent=1))
        elif (run / "qa_results.json").exists():
            metrics = json.loads((run / "qa_results.json").read_text())["eval"]
            write_whole(job.folder / f"seed-{job.seeds[0]}.json", json.dumps(metrics, indent=1))


# ------------------------------------------------------------------------------ sweeps side by side (--jobs)
def start_helpers(script: Path, argv: list[str], jobs: int, output_dir: Path) -> list[subprocess.Popen]:
    """`--jobs` of a command (`script` with `argv`) that sweeps OUTPUT_DIR's cache: every run (this sweep's and the
    helpers') gets cores / jobs torch threads, and jobs - 1 helper sweeps, the same command with `--jobs 1
    --sweep_only`, share the cache: each takes the next job no other sweep holds (`Sweep.run`)."""
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = threads  # inherited by every run
    try:
        import torch

        torch.set_num_threads(int(threads))  # what runs.jsonl records per run
    except ImportError:
        pass
    (output_dir / "cache").mkdir(parents=True, exist_ok=True)
    helpers = []
    for i in range(1, jobs):
        with open(output_dir / "cache" / f"helper-{i}.log", "a") as log:
            helpers.append(subprocess.Popen([sys.executable, str(script), *argv, "--jobs", "1",
                                             "--sweep_only"], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                            start_new_session=True))  # stopped as a group, with the run it holds
    return helpers


def stop_helpers(helpers: list[subprocess.Popen], finished: bool) -> None:
    """Wait for the helpers once this sweep has finished (every job is then done or failed, so they only confirm it);
    if it was interrupted, stop them with the runs they started (a killed pretraining resumes on the next sweep). A
    helper that failed is named with its log."""
    for i, helper in enumerate(helpers, 1):
        if not finished and helper.poll() is None:
            os.killpg(helper.pid, signal.SIGTERM)
        if helper.wait() != 0 and finished:
            print(f"Helper sweep {i} exited with {helper.returncode}: see its log, cache/helper-{i}.log")
