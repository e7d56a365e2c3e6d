"""The sweep machinery that the papers' experiments (`repro/run.py`) and the zoo (`repro/zoo.py`) share: one job per
subprocess of the project's own entry points, cached by a hash of its flags and data, locked per cache entry, run in
order; the per-arm results (every run, unit means, medians) and the report helpers (machine, commit, commands
written relative to the repository)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from encoder_zoo.repro.budgets import Budget
from encoder_zoo.repro.experiments import GLUE_TASKS, METRICS, QA_TASKS, Arm, Experiment

REPO = Path(__file__).resolve().parent.parent
PRETRAIN = REPO / "training" / "pretrain.py"
RUN_GLUE = REPO / "glue" / "run_glue.py"
RUN_QA = REPO / "qa" / "run_qa.py"
INIT = {"hire": REPO / "glue" / "init_hire.py", "bertac": REPO / "glue" / "init_bertac.py"}
# Each cache entry (a job's folder) is locked while a sweep checks or runs it: two sweeps sharing a cache never run one
# job twice, and never read or set aside the half-written outputs of a job the other is running.
ENTRY_LOCK = ".repro-entry.lock"


def digest(payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


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


def write_whole(path: Path, text: str) -> None:
    """Write `path` whole or not at all (a staged file renamed into place): a reader never sees half of it."""
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(text, encoding="utf-8")
    os.replace(staged, path)


@dataclass
class Job:
    """One subprocess of the sweep. `done` tells whether its outputs are already cached."""

    kind: str  # pretrain, init, finetune
    arm: str
    name: str
    folder: Path
    command: list[str]
    outputs: list[Path]
    needs: list["Job"] = field(default_factory=list)
    seeds: tuple[int, ...] = ()  # fine-tuning seeds this job produces (run_glue takes several)
    status: str = "pending"

    def done(self) -> bool:
        cached = [cached_output(p, self.folder) for p in self.outputs]  # every output checked (and set aside if corrupted)
        return all(cached)

    @property
    def log(self) -> Path:
        return self.folder / "log.txt"


class Sweep:
    """The jobs of one experiment at one budget, in order, and their cached results."""

    def __init__(self, experiment: Experiment, budget: Budget, output_dir: Path, dataset: str | None,
                 tasks: list[str] | None = None):
        self.experiment, self.budget, self.dataset = experiment, budget, dataset
        self.cache = output_dir / "cache"
        self.tasks = [t for t in experiment.tasks_at(budget.name) if t in (tasks or budget.tasks)]
        self.arms = experiment.arms_at(budget.name)
        self.jobs: list[Job] = []
        # (arm, task, unit, finetune_seed or None) -> (job producing the number, the file it is read from)
        self.sources: dict = {}
        self.warmup_steps = self.shared_warmup_steps()
        for arm in self.arms:
            for unit in budget.unit_seeds:
                self.add_arm(arm, unit)

    def shared_warmup_steps(self) -> int | None:
        """One warmup for every pretrained arm: the schedule arm's recipe at this run length (each recipe's own rule
        would give TEAMS and ELECTRA different warmups at the same steps)."""
        arm = self.experiment.schedule_arm()
        return None if arm is None or not self.experiment.shared_warmup else self.own_warmup_steps(arm)

    def own_warmup_steps(self, arm: Arm) -> int:
        from encoder_zoo.training.recipes import get_recipe

        model = arm.pretrain[arm.pretrain.index("--model") + 1]
        return get_recipe(model).training_defaults[self.budget.model_size].warmup_steps_of_run(self.budget.pretrain_steps)

    def schedules(self) -> dict:
        """Each pretrained arm's schedule shape and peak learning rate (its recipe's), and the shared warmup."""
        from encoder_zoo.training.recipes import get_recipe

        out = {}
        for arm in self.arms:
            if arm.pretrain:
                defaults = get_recipe(arm.pretrain[arm.pretrain.index("--model") + 1]).training_defaults[self.budget.model_size]
                out[arm.name] = {"lr_scheduler_type": defaults.lr_scheduler_type, "learning_rate": defaults.learning_rate,
                                 "warmup_steps": self.warmup_steps or self.own_warmup_steps(arm)}
        return out

    # --------------------------------------------------------------------------------------------- building jobs
    def pretrain_job(self, arm: Arm, flags: list[str], seed: int, label: str) -> Job:
        key = {"flags": flags, "seed": seed, "data": dataset_fingerprint(self.dataset) if label == "pretrain" else None}
        model = flags[flags.index("--model") + 1]
        folder = self.cache / "pretrain" / f"{model}-{digest(key)}"
        for job in self.jobs:  # the same recipe and data in another arm: one run
            if job.folder == folder:
                return job
        command = [sys.executable, str(PRETRAIN), *flags, "--seed", str(seed), "--output_dir", str(folder),
                   "--save_steps", str(self.save_steps(flags)), "--dataloader_num_workers", "0",
                   "--logging_steps", str(max(1, self.steps(flags) // 20)), "--disable_tqdm", "true"]
        job = Job("pretrain", arm.name, f"{label} {arm.name} ({model}) seed {seed}", folder, command,
                  [folder / "export" / "model.safetensors"])
        (folder / "key.json").parent.mkdir(parents=True, exist_ok=True)
        (folder / "key.json").write_text(json.dumps(key, indent=1))
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
        (seed `unit`), then its fine-tuning runs."""
        budget = self.budget
        needs: list[Job] = []
        if arm.pretrain:
            job = self.encoder_job(arm, unit)
            needs, model = [job], str(job.folder / "export")
            if "heldout_mlm" in self.tasks:
                self.sources[(arm.name, "heldout_mlm", unit, None)] = (job, job.folder / "trainer_state.json")
        backbone_job = self.encoder_job(self.experiment.arm(arm.backbone_from), unit) if arm.backbone_from else None
        cnn_job = None
        if arm.cnn is not None:
            cnn_job = self.pretrain_job(arm, [*budget.cnn_flags(), *arm.cnn], unit, "cnn")
            needs = [cnn_job]
        if backbone_job is not None:
            needs = [*needs, backbone_job]
        for task in self.tasks:
            if task == "heldout_mlm":
                continue
            if arm.init:
                if task in QA_TASKS and arm.init != "bertac":
                    continue
                model_job = self.init_job(arm, task, cnn_job, unit, backbone_job)
                needs_task, model = [*needs, model_job], str(model_job.folder / "model")
            elif arm.pretrain:
                needs_task = needs
            else:
                from encoder_zoo.training.run import minilm_path

                needs_task, model = needs, minilm_path()
            self.finetune_jobs(arm, task, model, needs_task, unit)

    def encoder_job(self, arm: Arm, unit: int) -> Job:
        """The pretraining of a pretrained arm's unit (one job, however many arms build on it)."""
        warmup = self.warmup_steps or self.own_warmup_steps(arm)
        flags = [*arm.pretrain, *self.budget.pretrain_flags(), *(["--dataset", self.dataset] if self.dataset else []),
                 "--warmup_steps", str(warmup)]
        return self.pretrain_job(arm, flags, unit, "pretrain")

    def init_job(self, arm: Arm, task: str, cnn_job: Job | None, unit: int, backbone_job: Job | None = None) -> Job:
        head = ["--head", "question_answering"] if task in QA_TASKS else \
            ["--num_labels", "1" if task == "movie_sentiment_regression" else "2"]
        backbone = ["--backbone", str(backbone_job.folder / "export"), "--trust_remote_code"] if backbone_job else []
        flags = [*arm.init_flags, *backbone, *(head if arm.init == "bertac" else head[-2:] if task not in QA_TASKS else []),
                 "--seed", str(unit)]
        key = {"init": arm.init, "flags": flags, "cnn": str(cnn_job.folder) if cnn_job else None}
        folder = self.cache / "init" / f"{arm.init}-{digest(key)}"
        for job in self.jobs:
            if job.folder == folder:
                return job
        command = [sys.executable, str(INIT[arm.init]), *flags, "--output_dir", str(folder / "model")]
        if cnn_job is not None:
            command += ["--cnn", str(cnn_job.folder / "export")]
        job = Job("init", arm.name, f"{arm.init} init {' '.join(flags)}", folder, command,
                  [folder / "model" / "config.json"], needs=[j for j in (cnn_job, backbone_job) if j])
        self.jobs.append(job)
        return job

    def finetune_folder(self, arm: Arm, task: str, key: dict) -> Path:
        """A fine-tuning's cache folder, named by its arm, task and a hash of its model, flags and seeds. The same run
        made by another experiment under its own arm's name (the zoo's hire+minilm is hire's `hire`) is reused: the
        hash names the run, the arm only labels the folder."""
        run = f"{task}-{digest(key)}"
        own = self.cache / "finetune" / f"{arm.name}-{run}"
        return own if own.exists() else next(iter(sorted(own.parent.glob(f"*-{run}"))), own)

    def finetune_jobs(self, arm: Arm, task: str, model: str, needs: list[Job], unit: int) -> None:
        budget = self.budget
        seeds = tuple(budget.finetune_seed(unit, seed) for seed in budget.finetune_seeds)
        # Over the MiniLM the budget's MiniLM epochs; an encoder of ours, or a fusion over one, fine-tunes alike.
        budget_flags = budget.finetune_flags(over_minilm=arm.pretrain is None and arm.backbone_from is None)
        jobs = []
        if task in GLUE_TASKS:
            # A fusion init's classifier is new for the task's labels; a QA init already carries its QA head.
            remote = ["--trust_remote_code", *(["--ignore_mismatched_sizes"] if arm.init else [])]
            preset_name = arm.glue_preset or self.experiment.glue_preset
            preset = ["--preset", preset_name] if preset_name else []
            flags = [*remote, *preset, "--task_name", task, *budget_flags, "--report_to", "none",
                     "--save_strategy", "no", "--disable_tqdm", "true"]
            folder = self.finetune_folder(arm, task, {"model": model, "flags": flags, "seeds": seeds})
            command = [sys.executable, str(RUN_GLUE), "--model_name_or_path", model, *flags, "--seeds",
                       *map(str, seeds), "--output_dir", str(folder / "run")]
            jobs.append(Job("finetune", arm.name, f"{task} {arm.name} unit {unit} seeds {list(seeds)}", folder,
                            command, [folder / f"seed-{s}.json" for s in seeds], needs=needs, seeds=seeds))
        else:
            length = max(budget.finetune_max_seq_length, 96)
            flags = ["--trust_remote_code", "--dataset", task, *budget_flags, "--max_seq_length", str(length),
                     "--doc_stride", str(length // 4), "--max_question_length", str(length // 3),
                     "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true"]
            for seed in seeds:
                folder = self.finetune_folder(arm, task, {"model": model, "flags": flags, "seed": seed})
                command = [sys.executable, str(RUN_QA), "--model_name_or_path", model, *flags, "--seed", str(seed),
                           "--output_dir", str(folder / "run")]
                jobs.append(Job("finetune", arm.name, f"{task} {arm.name} unit {unit} seed {seed}", folder, command,
                                [folder / f"seed-{seed}.json"], needs=needs, seeds=(seed,)))
        self.jobs += jobs
        for job in jobs:
            for seed in job.seeds:
                self.sources[(arm.name, task, unit, seed)] = (job, job.folder / f"seed-{seed}.json")

    # --------------------------------------------------------------------------------------------------- running
    def run(self, log_path: Path) -> None:
        from tqdm.auto import tqdm

        from encoder_zoo.training import run as locks

        cached = [job for job in self.jobs if self.cached_now(job)]
        for job in cached:
            job.status = "cached"
        bar = tqdm(total=len(self.jobs), initial=len(cached), desc=f"{self.experiment.name}/{self.budget.name}",
                   unit="run", dynamic_ncols=True)
        pending = [job for job in self.jobs if job.status != "cached"]  # in order: a job's needs come before it
        while pending:
            job = pending[0]
            failed = [n for n in job.needs if n.status == "failed" or n.status.startswith("skipped")]
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
                if job.done():  # another sweep ran it meanwhile
                    job.status = "cached"
                    bar.update(1)
                    continue
                job.status = self.execute(job)
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

    @staticmethod
    def cached_now(job: Job) -> bool:
        """Whether `job`'s outputs are cached; False while another sweep holds its entry (it is waited for later)."""
        from encoder_zoo.training.run import release, try_hold

        if not try_hold(job.folder, ENTRY_LOCK):
            return False
        try:
            return job.done()
        finally:
            release(job.folder, ENTRY_LOCK)

    def execute(self, job: Job) -> str:
        job.folder.mkdir(parents=True, exist_ok=True)
        command = list(job.command)
        if job.kind == "pretrain" and any(job.folder.glob("checkpoint-*")):
            command += ["--resume_from_checkpoint", "true"]  # the entry point's own exact resume
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               "TOKENIZERS_PARALLELISM": "false"}
        with open(job.log, "a") as log:
            log.write(f"\n$ {shlex.join(command)}\n")
            log.flush()
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env).returncode
        if code != 0:
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
            for entry in next(iter(result["tasks"].values()))["runs"]:
                write_whole(job.folder / f"seed-{entry['seed']}.json", json.dumps(entry["metrics"], indent=1))
        elif (run / "qa_results.json").exists():
            metrics = json.loads((run / "qa_results.json").read_text())["eval"]
            write_whole(job.folder / f"seed-{job.seeds[0]}.json", json.dumps(metrics, indent=1))

    # --------------------------------------------------------------------------------------------------- results
    def values(self, arm: str, task: str) -> dict:
        """{(unit, finetune_seed): score} of `arm` on `task` (finetune_seed None for a pretraining metric)."""
        metric = METRICS[task]
        out = {}
        for key, (job, path) in self.sources.items():
            if key[0] != arm or key[1] != task or not path.exists():
                continue
            if task == "heldout_mlm":
                try:
                    history = json.loads(path.read_text(encoding="utf-8"))["log_history"]
                except (UnicodeDecodeError, json.JSONDecodeError, KeyError) as error:
                    # Written by the pretraining itself: recomputing it means pretraining again, so it is left as is.
                    print(f"repro cache: {path} is not a valid trainer state ({error!r}); its held-out loss is left "
                          f"out. Move {job.folder} aside to pretrain again.", file=sys.stderr)
                    continue
                evals = [e[metric.key] for e in history if metric.key in e]
                if evals:
                    out[key[2:]] = float(evals[-1])
            else:
                value = json.loads(path.read_text()).get(metric.key)
                if value is not None:
                    out[key[2:]] = float(value)
        return out

    def logged_runs(self) -> list[dict]:
        """The log entry of each of the sweep's jobs' last successful run (cached ones included), as `run` wrote it."""
        log = self.cache / "runs.jsonl"
        done = {}
        if log.exists():
            for line in log.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if entry.get("status") == "done":
                    done[entry["folder"]] = entry
        return [done[str(job.folder)] for job in self.jobs if str(job.folder) in done]

    def run_seconds(self) -> float:
        """Seconds the sweep's jobs took, each job's last successful run; a pretraining resumed after a kill counts
        its logged training intervals, the killed part's included, where they add up to more than its last run."""
        jobs = {str(job.folder): job for job in self.jobs}
        total = 0.0
        for entry in self.logged_runs():
            job, seconds = jobs[entry["folder"]], entry["seconds"]
            if job.kind == "pretrain":
                seconds = max(seconds, training_seconds(log_history(job.folder)) or 0.0)
            total += seconds
        return total

    def wall_seconds(self) -> float:
        """Wall-clock seconds during which at least one of the sweep's jobs ran (each job's last successful run): the
        union of their intervals, so that sweeps sharing the cache count once and the gaps between sittings not at
        all. `run_seconds` sums the runs instead (two one-thread sweeps on 2 cores: about twice this)."""
        intervals = sorted((end - entry["seconds"], end) for entry in self.logged_runs()
                           for end in [time.mktime(time.strptime(entry["time"], "%Y-%m-%dT%H:%M:%S"))])
        total, reach = 0.0, float("-inf")
        for start, end in intervals:
            total += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        return total

    def run_threads(self) -> dict:
        """{torch threads: runs} of the sweep's jobs' last successful runs; None counts runs logged before the
        thread count was."""
        return dict(Counter(entry.get("torch_threads") for entry in self.logged_runs()))

    def failures(self, arm: str) -> list[dict]:
        """`arm`'s failed runs and those skipped for a failure upstream, each with the tasks whose scores it writes
        (a fine-tuning its task, a pretraining its held-out loss, an init or a CNN none: the runs it feeds are
        skipped and listed with theirs)."""
        gives: dict[int, set] = {}
        for (_, task, _, _), (job, _) in self.sources.items():
            gives.setdefault(id(job), set()).add(task)
        return [{"run": j.name, "status": j.status, "log": str(j.log), "tasks": sorted(gives.get(id(j), ()))}
                for j in self.jobs if j.arm == arm and (j.status == "failed" or j.status.startswith("skipped"))]


# ------------------------------------------------------------------------------------------------------ results
def failed_on(arm_result: dict, task: str) -> bool:
    """Whether `task`'s score of an arm is missing for a failure: one of its failed or skipped runs writes `task`'s
    score (`Sweep.failures`). A task the arm has no run for (held-out loss of a fusion) is then not a failure."""
    return any(task in f["tasks"] for f in arm_result["failed"])


def score_cell(arm_result: dict, task: str) -> str:
    """A report table's cell: the median over units [95% bootstrap interval] (units); 'failed' where a failure left
    no score; '—' where the arm has no run for the task."""
    r = arm_result["tasks"].get(task)
    if r:
        return f"{r['median']:.4g} [{r['low']:.4g}, {r['high']:.4g}] ({r['n_units']})"
    return "failed" if failed_on(arm_result, task) else "—"


def chance_level(task: str, budget: Budget) -> float | None:
    """What a model that learned nothing scores on `task` at `budget`: no correlation (regression); the accuracy of
    one constant answer, the most frequent label of the scored rows (classification scored by accuracy); None where
    no such level is defined (QA F1)."""
    if task not in GLUE_TASKS:
        return None
    from encoder_zoo.glue.tasks import first_samples, get_task, load_task, majority_class_accuracy

    spec = get_task(task)
    if spec.is_regression:
        return 0.0
    if METRICS[task].key != "accuracy":
        return None
    _, raw = load_task(task)
    raw = first_samples(raw, spec, budget.max_train_samples, budget.max_eval_samples)
    return majority_class_accuracy(raw[spec.validation_splits[0]]["label"])


def describe_arms(sweep: Sweep, seed: int, chance: dict) -> tuple[dict, dict]:
    """Per arm and task: every run, each unit's mean and the median over units with its bootstrap interval; and the
    runs themselves, {(arm, task): {(unit, finetune_seed): score}}."""
    from encoder_zoo.repro.stats import above_chance, median_ci, unit_means

    arms, runs = {}, {}
    for arm in sweep.arms:
        per_task = {}
        for task in sweep.tasks:
            runs[(arm.name, task)] = values = sweep.values(arm.name, task)
            if not values:
                continue
            units = unit_means(values)
            median, low, high = median_ci(list(units.values()), seed=seed)
            per_task[task] = {
                "metric": METRICS[task].key, "n_units": len(units), "median": median, "low": low, "high": high,
                "above_chance": above_chance(low, high, chance[task], METRICS[task].higher_is_better),
                "units": {str(unit): mean for unit, mean in units.items()},
                "runs": [{"unit": unit, "finetune_seed": finetune_seed, "value": value}
                         for (unit, finetune_seed), value in values.items()]}
        arms[arm.name] = {"description": arm.description, "tasks": per_task, "failed": sweep.failures(arm.name)}
    return arms, runs


def log_history(folder: Path) -> list[dict] | None:
    """The `log_history` of a run's trainer_state.json, or None when it is missing or unreadable."""
    try:
        return json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))["log_history"]
    except (OSError, ValueError, KeyError):
        return None


def training_seconds(history: list[dict] | None) -> float | None:
    """A pretraining's training time from its `log_history`: the sum of its logged intervals' wall times (each
    interval's tokens over its tokens/s, both logged), or None where they carry no token rate. Trainer's train_runtime
    covers only the last part of a run resumed after a kill; the intervals before its checkpoint are restored with
    the checkpoint."""
    intervals = [e for e in history or [] if "loss" in e and "num_input_tokens_seen" in e]
    if not intervals or not all(float(e.get("tokens_per_second", 0)) > 0 for e in intervals):
        return None
    seen = [0] + [e["num_input_tokens_seen"] for e in intervals]
    return sum((b - a) / float(e["tokens_per_second"]) for a, b, e in zip(seen, seen[1:], intervals))


def torch_threads() -> int | None:
    """The intra-op threads of this process's torch, which the runs it starts inherit (through OMP_NUM_THREADS, or
    torch's default from the same cores)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.get_num_threads()


def machine(threads: dict | None = None) -> str:
    """The CPU, its cores, the torch threads per run (`threads`: a sweep's `run_threads`; runs not logged with theirs
    are taken to have this process's) and the GPU."""
    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    description = f"{cpu}, {os.cpu_count()} logical cores"
    # Two sweeps sharing 2 cores run one thread each (1.35x the throughput of one sweep on two threads for the tiny
    # models, measured): the wall times are those of the runs' thread count.
    counts = Counter()
    for n, runs in (threads or {None: 1}).items():
        counts[n if n is not None else torch_threads()] += runs
    if None not in counts:
        shares = [f"{n} torch thread(s) per run" + (f" ({runs} run{'s' * (runs != 1)})" if len(counts) > 1 else "")
                  for n, runs in sorted(counts.items())]
        description += ", " + " and ".join(shares)
    try:
        import torch

        if torch.cuda.is_available():
            description += f"; GPU: {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return description


def git_commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


# Shell variables the report's commands use for paths that differ between machines (defined above its commands).
MINILM_VARIABLE = 'MINILM=$(python -c "from encoder_zoo.training.run import minilm_path; print(minilm_path())")'


def relative(command: list[str], output_dir: Path) -> str:
    """A command as a reader of the report runs it: from the repository root, `python`, the sweep's folder relative to
    the root (or $OUTPUT_DIR when it lies elsewhere), the embedded MiniLM as $MINILM; no path of the machine that
    ran it."""
    from encoder_zoo.training.run import minilm_path

    places = [(Path(minilm_path()), "$MINILM"), (output_dir, os.path.relpath(output_dir, REPO)
                                                 if output_dir.is_relative_to(REPO) else "$OUTPUT_DIR"), (REPO, "")]

    def shown(part: str) -> str:
        if part == sys.executable:
            return "python"
        for root, name in places:
            try:
                rest = Path(part).relative_to(root)
            except ValueError:
                continue
            text = str(Path(name) / rest) if name else str(rest)
            return text.rstrip("/.") if text.endswith("/.") else text
        return shlex.quote(part)

    return " ".join(shown(part) for part in command)


def command_block(commands: list[str]) -> list[str]:
    """A report's fenced block of `relative` commands, preceded by the shell variables they use."""
    lines = []
    if any("$OUTPUT_DIR" in c for c in commands):
        lines.append("OUTPUT_DIR=...  # the sweep's --output_dir")
    if any("$MINILM" in c for c in commands):
        lines.append(MINILM_VARIABLE)
    return [*lines, *commands, "```", ""]
