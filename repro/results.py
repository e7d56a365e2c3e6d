"""What a sweep's cache says: each arm's scores per task (every run, unit means, their mean with its t interval) and
floors, the positive control, the verdicts on a paper's claims (primary and secondary), the compute behind each arm,
and the runs behind them (failures, time, threads, the code they ran)."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np

from encoder_zoo.repro.budgets import Budget
from encoder_zoo.repro.provenance import REFUSED, code_hash
from encoder_zoo.repro.tasks import MAJORITY_CLASS, NO_CORRELATION, task_facts


# ------------------------------------------------------------------------------------------------------ scores
def values(sweep, arm: str, task: str) -> dict:
    """{(unit, finetune_seed): score} of `arm` on `task` (finetune_seed None for a pretraining metric)."""
    metric = task_facts(task)
    out = {}
    for key, (job, path) in sweep.sources.items():
        if key[0] != arm or key[1] != task or job.failed or not path.exists():
            continue  # a failed or skipped job's cached file is from an earlier run, on other inputs
        if metric.pretraining_metric:
            try:
                history = json.loads(path.read_text(encoding="utf-8"))["log_history"]
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError) as error:
                # Written by the pretraining itself: recomputing it means pretraining again, so it is left as is.
                print(f"repro cache: {path} is not a valid trainer state ({error!r}); its held-out loss is left "
                      f"out. Move {job.folder} aside to pretrain again.", file=sys.stderr)
                continue
            evals = [e[metric.metric] for e in history if metric.metric in e]
            if evals:
                out[key[2:]] = float(evals[-1])
        else:
            value = json.loads(path.read_text()).get(metric.metric)
            if value is not None:
                out[key[2:]] = float(value)
    return out


def chance_level(task: str, budget: Budget) -> float | None:
    """What a model that learned nothing scores on `task` at `budget`, as its spec declares (`Scoring.chance`): no
    correlation (0); the accuracy of one constant answer, the most frequent label of the scored rows; None where no
    such level is defined (QA F1, a loss)."""
    facts = task_facts(task)
    if facts.chance == NO_CORRELATION:
        return 0.0
    if facts.chance != MAJORITY_CLASS:
        return None
    from encoder_zoo.glue.tasks import first_samples, load_task, majority_class_accuracy

    spec, raw = load_task(task)
    raw = first_samples(raw, spec, budget.max_train_samples, budget.max_eval_samples)
    return majority_class_accuracy(raw[spec.validation_splits[0]]["label"])


# ------------------------------------------------------------------------------------------------------ floors
INTERVAL = "95% t interval of the mean over unit means"
# A unigram floor's job also scores the bigram model (repro/floors.py): shown beside it, never the floor an arm must
# clear (it reads neighbours a masked model may not see). A floor cached before it has none.
NO_BIGRAM = "not computed: its floor job ran before the bigram floor was added"


def read_floor(job) -> dict | None:
    """A floor job's result (repro/floors.py), or None where it has none (not run, failed, unreadable)."""
    if job.failed:
        return None
    try:
        floor = json.loads((job.folder / "floor.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = floor.get("value") if isinstance(floor, dict) else None
    return floor if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def arm_floors(sweep, chance: dict) -> dict:
    """{(arm, task): {"value", "kind", "chance", "model"}}: the floor each arm must clear on each task, the higher
    (on the better side) of chance and its trivial model's score on the same rows (`Sweep.floors`); value None
    where the task has neither."""
    out = {}
    for arm in sweep.arms:
        for task in sweep.tasks:
            job = sweep.floors.get((arm.name, task))
            model = read_floor(job) if job else None
            candidates = [(chance[task], "chance")] if chance.get(task) is not None else []
            candidates += [(model["value"], model["kind"])] if model else []
            higher = task_facts(task).higher_is_better
            value, kind = (max if higher else min)(candidates, key=lambda c: c[0]) if candidates else (None, None)
            out[(arm.name, task)] = {"value": value, "kind": kind, "chance": chance.get(task), "model": model}
    return out


def floor_rows(sweep, chance: dict) -> dict:
    """{task: [{"kind", "value", "description", "arms"}]}: every floor of the report's tables, chance first; a
    trivial model's once per set of rows, with the arms read against it."""
    rows = {}
    for task in sweep.tasks:
        entries = [] if chance.get(task) is None else [
            {"kind": "chance", "value": chance[task], "description": "one constant answer (most frequent label; no "
             "correlation)", "arms": [a.name for a in sweep.arms]}]
        by_job: dict = {}
        for arm in sweep.arms:
            job = sweep.floors.get((arm.name, task))
            if job is not None:
                by_job.setdefault(id(job), (job, []))[1].append(arm.name)
        for job, names in by_job.values():
            floor = read_floor(job)
            entries.append({"kind": floor["kind"] if floor else job.command[2], "value": floor and floor["value"],
                            "description": floor["description"] if floor else f"not available ({job.status})",
                            "arms": names, **({"rows": floor.get("train_rows")} if floor else {})})
            if entries[-1]["kind"] == "unigram":
                bigram = (floor or {}).get("bigram") or {}
                entries.append({"kind": "bigram", "value": bigram.get("value"), "arms": names, "description":
                                bigram.get("description") or (NO_BIGRAM if floor else entries[-1]["description"])})
        rows[task] = entries
    return rows


# ------------------------------------------------------------------------------------------------------ scores
def describe_arms(sweep, floors: dict) -> tuple[dict, dict]:
    """Per arm and task: every run, each unit's mean, the mean over units with its t interval, the median, its floor
    and whether it clears it (`floors`: `arm_floors`); and the runs themselves, {(arm, task): {(unit,
    finetune_seed): score}}."""
    from encoder_zoo.repro.stats import above_floor, mean_interval, unit_means

    arms, runs = {}, {}
    for arm in sweep.arms:
        per_task = {}
        for task in sweep.tasks:
            runs[(arm.name, task)] = scores = values(sweep, arm.name, task)
            if not scores:
                continue
            units = unit_means(scores)
            mean, low, high = mean_interval(list(units.values()))
            floor, higher = floors[(arm.name, task)], task_facts(task).higher_is_better
            per_task[task] = {
                "metric": task_facts(task).metric, "n_units": len(units), "mean": mean, "low": low, "high": high,
                "interval": INTERVAL, "median": float(np.median(list(units.values()))),
                "floor": floor["value"], "floor_kind": floor["kind"],
                "clears_floor": above_floor(low, high, floor["value"], higher),
                "above_chance": above_floor(low, high, floor["chance"], higher),
                "units": {str(unit): mean for unit, mean in units.items()},
                "runs": [{"unit": unit, "finetune_seed": finetune_seed, "value": value}
                         for (unit, finetune_seed), value in scores.items()]}
        arms[arm.name] = {"description": arm.description, "tasks": per_task, "failed": failures(sweep, arm.name)}
    return arms, runs


def failed_on(arm_result: dict, task: str) -> bool:
    """Whether `task`'s score of an arm is missing for a failure: one of its failed or skipped runs writes `task`'s
    score (`failures`). A task the arm has no run for (held-out loss of a fusion) is then not a failure."""
    return any(task in f["tasks"] for f in arm_result["failed"])


def score_cell(arm_result: dict, task: str) -> str:
    """A report table's cell, on the tables' scale (`display_scale`: percent points, nats for a loss): the mean over
    units [its 95% t interval] (units), marked * where that interval does not lie wholly above the arm's floor;
    'failed' where a failure left no score; '—' where the arm has no run for the task. A report written before means
    were (its `median` with the bootstrap interval that, over 2-5 units, is the units' range) shows `median [range]
    (units)`."""
    r = arm_result["tasks"].get(task)
    if not r:
        return "failed" if failed_on(arm_result, task) else "—"
    scale = task_facts(task).display_scale
    if "mean" not in r:
        return f"{r['median'] * scale:.4g} [{r['low'] * scale:.4g}, {r['high'] * scale:.4g}] ({r['n_units']})"
    interval = f" [{r['low'] * scale:.4g}, {r['high'] * scale:.4g}]" if r["low"] is not None else ""
    under = "*" if r.get("floor") is not None and not r.get("clears_floor") else ""
    return f"{r['mean'] * scale:.4g}{interval} ({r['n_units']}){under}"


def score_key(results: dict) -> str:
    """What a table's score cells hold, in the words of the results they come from."""
    cells = [r for arm in results["arms"].values() for r in arm["tasks"].values()]
    if cells and all("mean" not in r for r in cells):
        return "median over units [range: lowest and highest unit] (units)"
    return (f"mean over units [{INTERVAL}] (units); * where that interval does not lie wholly above the arm's floor "
            "(the higher of chance and the task's trivial model: bag-of-words, trivial answer or unigram)")


# ------------------------------------------------------------------------------------------------------ compute
def pretraining_compute(job, budget) -> dict | None:
    """FLOPs (Trainer's total_flos: the bench's per-batch count where the recipe has one), tokens seen (non-padding,
    or steps x batch x length when the run did not count them) and wall time of one pretraining `job`, from its
    trainer_state.json. The time is `training_seconds`, which a run resumed after a kill keeps whole; where the
    intervals carry no token rate (the BERTAC CNN counts words), train_runtime, and no time for a resumed run."""
    if job.failed:
        return None
    try:
        state = json.loads((job.folder / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    tokens = state.get("num_input_tokens_seen") or 0
    counted = bool(tokens)
    if not counted:
        tokens = state["global_step"] * state["train_batch_size"] * budget.max_seq_length
    seconds = training_seconds(state.get("log_history"))
    if seconds is None:
        resumed = job.log.exists() and any(line.startswith("$ ") and "--resume_from_checkpoint" in line for line in
                                           job.log.read_text(encoding="utf-8", errors="replace").splitlines())
        end = next((e for e in reversed(state["log_history"]) if "train_runtime" in e), None)
        seconds = end["train_runtime"] if end and not resumed else None
    return {"flops": float(state.get("total_flos") or 0.0), "tokens": int(tokens), "tokens_counted": counted,
            "seconds": seconds, "tokens_per_second": tokens / seconds if seconds else None}


def unit_compute(sweep, arm, unit: int) -> dict:
    """The pretraining compute behind one unit of `arm`: its own pretraining, or its backbone's and its CNN's; the
    MiniLM's pretraining is not ours and is left out (None); the positive control has none (0)."""
    parts = sweep.pretraining.get((arm.name, unit), [])
    measured = [pretraining_compute(job, sweep.budget) for job in parts]
    runs, includes_minilm = [job.folder.name for job in parts], not arm.pretrain and not arm.backbone_from
    if arm.random_init_of:
        return {"flops": 0.0, "tokens": 0, "seconds": 0.0, "tokens_per_second": None, "runs": [],
                "includes_minilm": False}
    if not parts or any(m is None for m in measured):
        return {"flops": None, "tokens": None, "seconds": None, "tokens_per_second": None, "runs": runs,
                "includes_minilm": includes_minilm}
    main = measured[0]
    timed = all(m["seconds"] is not None for m in measured)
    return {"flops": sum(m["flops"] for m in measured), "tokens": main["tokens"],
            "tokens_counted": main["tokens_counted"], "seconds": sum(m["seconds"] for m in measured) if timed else None,
            "tokens_per_second": main["tokens_per_second"], "runs": runs, "includes_minilm": includes_minilm}


def ratio(arm_compute: dict, baseline_compute: dict, key: str) -> float | None:
    """Median over units of `key` (flops, tokens) of the arm over the baseline's; None where either is unmeasured
    or the baseline has none."""
    def median(compute):
        measured = [c[key] for c in compute.values() if c.get(key) is not None]
        return float(np.median(measured)) if measured and len(measured) == len(compute) else None

    a, b = median(arm_compute), median(baseline_compute)
    return a / b if a is not None and b else None


# ------------------------------------------------------------------------------------------------------ verdicts
def prediction_difference(sweep, arm: str, baseline: str, task: str) -> dict:
    """On what fraction of the evaluation rows two arms' predictions differ, over their runs paired by (unit,
    fine-tuning seed) (`Sweep.predictions`: run_qa.py's predictions.json, repro/predict.py's for run_glue.py's saved
    models). `fraction` None with the reason where no pair has both."""
    differ = rows = pairs = 0
    for (name, t, unit, seed), (job, path) in sweep.predictions.items():
        other = sweep.predictions.get((baseline, task, unit, seed))
        if name != arm or t != task or other is None or job.failed or other[0].failed:
            continue
        try:
            a, b = (json.loads(Path(p).read_text(encoding="utf-8")) for p in (path, other[1]))
            if task_facts(task).finetuned_by == "qa":  # question id -> answer text
                keys = sorted(set(a) | set(b))
                changed, scored = sum(a.get(k) != b.get(k) for k in keys), len(keys)
            else:  # repro/predict.py's rows, in order
                pa, pb = (np.asarray(x["predictions"], dtype=float) for x in (a, b))
                if pa.shape != pb.shape or pa.ndim != 1:
                    continue
                changed, scored = int(np.sum(~np.isclose(pa, pb, rtol=0, atol=1e-6))), len(pa)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # missing or not predictions
            continue
        differ, rows, pairs = differ + changed, rows + scored, pairs + 1
    if not pairs:
        return {"fraction": None, "rows": 0, "pairs": 0, "reason": "no paired run has recorded predictions"}
    return {"fraction": differ / rows if rows else None, "rows": rows, "pairs": pairs}


def control_source(sweep):
    """The positive control arm of a sweep (None: it has none)."""
    return next((a for a in sweep.arms if a.random_init_of), None)


def control_arguments(sweep, runs: dict, floors: dict) -> tuple[dict | None, dict]:
    """The positive control's `decide` arguments per task (not the held-out loss): its source arm, pretrained,
    against the same model at random initialisation, gated by the floors; and an entry per task for the report
    (a task where either has no result: 'unavailable'). (None, {}) without a control."""
    control = control_source(sweep)
    if control is None:
        return None, {}
    return pair_arguments(sweep, runs, floors, control.random_init_of, control.name)


def adaptation_arguments(sweep, runs: dict, floors: dict) -> tuple[dict | None, dict]:
    """The adaptation control's (`Experiment.adaptation_control`: adapted > not adapted), as `control_arguments`;
    (None, {}) where the experiment has none."""
    pair = sweep.experiment.adaptation_control
    return (None, {}) if pair is None else pair_arguments(sweep, runs, floors, *pair)


def pair_arguments(sweep, runs: dict, floors: dict, arm: str, baseline: str) -> tuple[dict, dict]:
    """A control's `decide` arguments per fine-tuned task, `arm` > `baseline`, gated by the floors, and its report
    entries."""
    from encoder_zoo.repro.stats import learned

    arguments, entries = {}, {}
    for task in sweep.tasks:
        metric = task_facts(task)
        if metric.pretraining_metric:  # the random copy has no pretraining
            continue
        entries[task] = {"arm": arm, "baseline": baseline, "task": task, "metric": metric.metric}
        a, b = runs.get((arm, task)), runs.get((baseline, task))
        if not a or not b:
            entries[task]["verdict"] = f"unavailable ({arm if not a else baseline} has no results)"
            continue
        arguments[task] = {"arm": a, "baseline": b, "direction": "better", "higher_is_better": metric.higher_is_better,
                           "learned": learned(a, b, (floors[(arm, task)]["value"], floors[(baseline, task)]["value"]),
                                              metric.higher_is_better)}
    return arguments, entries


def control_results(sweep, runs: dict, floors: dict, adaptation: bool = False) -> dict:
    """The positive control (`adaptation`: the adaptation control) on each task alone (the zoo's lines; a paper's
    come with its claims, `analyse`)."""
    from encoder_zoo.repro.stats import decide_experiment

    arguments, entries = (adaptation_arguments if adaptation else control_arguments)(sweep, runs, floors)
    for task, decision in decide_experiment([], arguments)[0].items():
        entries[task].update(decision=decision, verdict=decision["verdict"])
    add_prediction_differences(sweep, entries.values())
    return entries


def add_prediction_differences(sweep, entries) -> None:
    """Where two arms read indistinguishable, the share of evaluation rows their predictions differ on."""
    for entry in entries:
        decision = entry.get("decision")
        if decision and decision["identical"]:
            decision["prediction_difference"] = prediction_difference(sweep, entry["arm"], entry["baseline"],
                                                                      entry["task"])


def analyse(sweep, seed: int = 0) -> dict:
    """Per arm and task: `describe_arms` with each arm's floor and the compute behind each unit; every verdict of
    the report by `repro.stats.decide_experiment`: the positive control per task, the primary claim alone at 5%, the
    others (secondary) one Holm family, each claim gated by its task's control and its floors, with the arms'
    FLOPs and tokens ratios and, where the arms read indistinguishable, the share of rows their predictions differ
    on. `seed` is kept for the command line's --bootstrap_seed (nothing is resampled now)."""
    from encoder_zoo.repro.stats import ALPHA, decide_gated, learned

    experiment = sweep.experiment
    chance = {task: chance_level(task, sweep.budget) for task in sweep.tasks}
    floors = arm_floors(sweep, chance)
    arms, runs = describe_arms(sweep, floors)
    for arm in sweep.arms:
        arms[arm.name]["compute"] = {str(u): unit_compute(sweep, arm, u) for u in sweep.units}
    controls, control = control_arguments(sweep, runs, floors)
    adaptations, adaptation = adaptation_arguments(sweep, runs, floors)
    claims, decided = [], []
    tested = experiment.claims_at(sweep.budget.name)
    for claim in tested:
        for task in sweep.tasks:
            metric = task_facts(task)
            if metric.pretraining_metric:
                continue  # no paper claims a pretraining-loss difference
            entry = {**asdict(claim), "task": task, "metric": metric.metric, "margin": claim.margin(task),
                     "role": "primary" if experiment.is_primary(claim, task) else "secondary",
                     "flops_ratio": ratio(arms[claim.arm]["compute"], arms[claim.baseline]["compute"], "flops"),
                     "tokens_ratio": ratio(arms[claim.arm]["compute"], arms[claim.baseline]["compute"], "tokens")}
            claims.append(entry)
            a, b = runs.get((claim.arm, task)), runs.get((claim.baseline, task))
            if not a or not b:
                entry["verdict"] = f"unavailable ({claim.arm if not a else claim.baseline} has no results)"
                continue
            entry["learned"] = learned(a, b, (floors[(claim.arm, task)]["value"],
                                              floors[(claim.baseline, task)]["value"]), metric.higher_is_better)
            decided.append((entry, {"task": task, "primary": entry["role"] == "primary", "arm": a, "baseline": b,
                                    "direction": claim.direction, "higher_is_better": metric.higher_is_better,
                                    "margin": entry["margin"], "learned": entry["learned"]}))
    gates, decisions = decide_gated([arguments for _, arguments in decided],
                                    {"positive": controls, "adaptation": adaptations}, ALPHA)
    for entries, name in ((control, "positive"), (adaptation, "adaptation")):
        for task, decision in gates.get(name, {}).items():
            entries[task].update(decision=decision, verdict=decision["verdict"])
    for (entry, _), decision in zip(decided, decisions):
        entry.update(decision=decision, verdict=decision["verdict"], control=decision["control"])
    add_prediction_differences(sweep, [*control.values(), *adaptation.values(), *(entry for entry, _ in decided)])
    claims.sort(key=lambda c: c["role"] != "primary")  # the primary first, then the claims in their order
    return {"experiment": experiment.name, "paper": experiment.paper, "budget": asdict(sweep.budget),
            "units": list(sweep.units), "bootstrap_seed": seed, "chance": chance,
            "floors": floor_rows(sweep, chance), "schedules": sweep.schedules,
            "untested_tasks": [t for t in experiment.tasks if t not in sweep.tasks],
            "untested_claims": [asdict(c) for c in experiment.claims if c not in tested],
            "primary": primary_status(experiment, sweep, tested), "control": control,
            **({"adaptation_control": adaptation, "tests_what": sweep.budget.tests_what}
               if experiment.adaptation_control else {}),
            "arms": arms, "claims": claims}


def primary_status(experiment, sweep, tested) -> dict | None:
    """The experiment's primary claim, and whether this report tests it (and why not)."""
    if experiment.primary is None:
        return None
    p = experiment.primary
    why = None
    if not any((c.arm, c.baseline) == (p.arm, p.baseline) for c in tested):
        why = "its arms are not trained at this budget"
    elif p.task not in sweep.tasks:
        why = f"{p.task} is not evaluated at this budget"
    return {**asdict(p), "tested": why is None, "why_not": why}


# ------------------------------------------------------------------------------------------------------ the runs
def current_verdicts(results: dict) -> dict:
    """`results` with every control's and claim's verdict given again by the current rule from its stored decision
    (`repro.stats.classify` on the same p-values, units, floors and gates; no number changes), in the current
    vocabulary (`VERDICT_WORDS`): a report written before reads as one written now. The zoo's pairs keep theirs,
    reworded (`current_verdict`)."""
    from encoder_zoo.repro.stats import classify, current_verdict

    entries = [*(results.get("control") or {}).values(), *(results.get("adaptation_control") or {}).values(),
               *results.get("claims", [])]
    for entry in entries:
        decision = entry.get("decision")
        if decision and {"p_value", "p_opposite", "units", "control", "learned", "identical", "alpha"} <= set(decision):
            verdict, reason = classify(decision, decision["alpha"])
            entry["verdict"], decision["verdict"], decision["reason"] = verdict, verdict, reason
        elif "verdict" in entry:
            entry["verdict"] = current_verdict(entry["verdict"])
    for pair in results.get("pairs", []):
        if "verdict" in (pair.get("decision") or {}):
            pair["decision"]["verdict"] = current_verdict(pair["decision"]["verdict"])
    return results


def name_the_gate(results: dict) -> dict:
    """`results` in the current vocabulary (`current_verdicts`), with each claim that its adaptation control alone
    gated naming that gate and its reason (`repro.stats.adaptation_gate`), as `decide_gated` now writes it: a report
    written before reads 'this budget does not detect pretraining' there, while its positive control reads
    reproduced."""
    from encoder_zoo.repro.stats import NO_CONTROL, adaptation_gate

    current_verdicts(results)
    for claim in results.get("claims", []):
        if claim.get("verdict") != NO_CONTROL:
            continue
        task = claim["task"]
        adaptation = (results.get("adaptation_control") or {}).get(task, {})
        named = adaptation_gate((results.get("control") or {}).get(task, {}).get("verdict"), adaptation.get("verdict"),
                                (adaptation.get("decision") or {}).get("estimate"))
        if named:
            claim["verdict"] = named[0]
            claim["decision"] = {**claim.get("decision", {}), "verdict": named[0], "reason": named[1]}
    return results


def failures(sweep, arm: str) -> list[dict]:
    """`arm`'s failed runs and those skipped for a failure upstream, each with the tasks whose scores it writes
    (a fine-tuning its task, a pretraining its held-out loss, an init or a CNN none: the runs it feeds are
    skipped and listed with theirs)."""
    gives: dict[int, set] = {}
    for (_, task, _, _), (job, _) in sweep.sources.items():
        gives.setdefault(id(job), set()).add(task)
    return [{"run": j.name, "status": j.status, "log": str(j.log), "folder": str(j.folder),
             "tasks": sorted(gives.get(id(j), ())), **({"refused": True} if j.exit_code == REFUSED else {})}
            for j in sweep.jobs if j.arm == arm and j.failed]


def code_of_runs(sweep) -> dict:
    """The code the sweep's finished runs ran (`Job.ran_code`): this checkout's hash, {hash: runs}, and the runs
    that are stale, from other code (`stale`) or from code they did not record (`unknown`: cached before runs
    recorded it). `--rerun_stale` retrains both."""
    current, ran = code_hash(), [job for job in sweep.jobs if job.status in ("done", "cached")]
    codes = [(job, job.ran_code()) for job in ran]
    return {"current": current, "runs": dict(Counter(code or "unknown" for _, code in codes)),
            "stale": [{"run": job.name, "code": code} for job, code in codes if code and code != current],
            "unknown": [job.name for job, code in codes if not code]}


def logged_runs(sweep) -> list[dict]:
    """The log entry of each of the sweep's jobs' last successful run (cached ones included), as `run` wrote it."""
    log = sweep.cache / "runs.jsonl"
    done = {}
    if log.exists():
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("status") == "done":
                done[entry["folder"]] = entry
    return [done[str(job.folder)] for job in sweep.jobs if str(job.folder) in done]


def run_seconds(sweep) -> float:
    """Seconds the sweep's jobs took, each job's last successful run; a pretraining resumed after a kill counts
    its logged training intervals, the killed part's included, where they add up to more than its last run."""
    jobs = {str(job.folder): job for job in sweep.jobs}
    total = 0.0
    for entry in logged_runs(sweep):
        job, seconds = jobs[entry["folder"]], entry["seconds"]
        if job.kind == "pretrain":
            seconds = max(seconds, training_seconds(log_history(job.folder)) or 0.0)
        total += seconds
    return total


def wall_seconds(sweep) -> float:
    """Wall-clock seconds during which at least one of the sweep's jobs ran (each job's last successful run): the
    union of their intervals, so that sweeps sharing the cache count once and the gaps between sittings not at
    all. `run_seconds` sums the runs instead (two one-thread sweeps on 2 cores: about twice this)."""
    intervals = sorted((end - entry["seconds"], end) for entry in logged_runs(sweep)
                       for end in [time.mktime(time.strptime(entry["time"], "%Y-%m-%dT%H:%M:%S"))])
    total, reach = 0.0, float("-inf")
    for start, end in intervals:
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


def run_threads(sweep) -> dict:
    """{torch threads: runs} of the sweep's jobs' last successful runs; None counts runs logged before the
    thread count was."""
    return dict(Counter(entry.get("torch_threads") for entry in logged_runs(sweep)))


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
