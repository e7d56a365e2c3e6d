"""What changed since a report's previous run: the previous results.json kept in short (`previous_record`, stored
under "previous" in the new results.json by `repro/summary.py --since`), and one row per claim and positive control
of either report with its verdict and difference before and now and why they differ (`changes`), which the report's
section "Since the previous report" shows. Composed only from the two results, never written by hand."""

from __future__ import annotations

from encoder_zoo.repro.stats import NO_SIGNAL, OPPOSITE, current_verdict
from encoder_zoo.repro.tasks import shown, shown_difference, significant, task_facts

DECISION_KEYS = ("estimate", "low", "high", "mdd")
SAME = "same verdict"
NEW = "new at this budget"
GONE = "no longer tested"


def numbers(entry: dict) -> dict:
    """A claim's or control's difference, its 90% interval and its MDD (None where missing)."""
    decision = entry.get("decision") or {}
    return {key: decision.get(key) for key in DECISION_KEYS}


def highest_floors(results: dict) -> dict:
    """Each task's highest floor value (a report made before floors: its chance level)."""
    floors = results.get("floors")
    if floors is None:
        return {task: value for task, value in (results.get("chance") or {}).items() if value is not None}
    highest = {}
    for task, entries in floors.items():
        values = [floor["value"] for floor in entries if floor.get("value") is not None]
        if values:
            highest[task] = max(values)
    return highest


def previous_record(old: dict, commit: str, because: str) -> dict:
    """From a results.json, what a later report compares itself with: its commit, its code's hash, why it was rerun,
    each claim's verdict and numbers, each task's positive control and highest floor."""
    claims = [{"role": claim.get("role"), "arm": claim["arm"], "baseline": claim["baseline"], "task": claim.get("task"),
               "metric": claim.get("metric"), "verdict": claim["verdict"], **numbers(claim)}
              for claim in old.get("claims", [])]
    controls = {task: {"arm": entry.get("arm"), "baseline": entry.get("baseline"), "metric": entry.get("metric"),
                       "verdict": entry["verdict"], **numbers(entry)}
                for task, entry in (old.get("control") or {}).items()}
    return {"commit": commit, "ran_at": old.get("commit"), "code": (old.get("code") or {}).get("current"),
            "because": because, "claims": claims, "controls": controls, "floors": highest_floors(old)}


def difference(entry: dict | None, task: str) -> str:
    """A difference and its interval on the task's display scale."""
    if not entry or entry.get("estimate") is None:
        return "—"
    return shown_difference(entry["estimate"], entry["low"], entry["high"], task)


def against_mdd(entry: dict, task: str) -> str:
    """The difference and whether it lies within its MDD (its size below the MDD)."""
    if entry.get("estimate") is None or entry.get("mdd") is None:
        return difference(entry, task) + (", no MDD" if entry.get("estimate") is not None else "")
    within = "within" if abs(entry["estimate"]) < entry["mdd"] else "beyond"
    return f"{difference(entry, task)}, {within} its MDD {significant(entry['mdd'], task)}"


def why(before: dict | None, now: dict | None, task: str, previous: dict, current: dict, control: bool) -> str:
    """One line naming what changed between the two readings of one claim (or control), from the data alone."""
    if before is None:
        return NEW
    if now is None:
        return GONE
    parts = [SAME] if before["verdict"] == now["verdict"] else []
    old_floor, new_floor = previous["floors"].get(task), current["floors"].get(task)
    if shown(old_floor, task) != shown(new_floor, task):
        parts.append(f"highest floor {shown(old_floor, task)} -> {shown(new_floor, task)}")
    if not control:
        old_control = (previous["controls"].get(task) or {}).get("verdict")
        new_control = (current["controls"].get(task) or {}).get("verdict")
        if old_control != new_control:
            parts.append(f"positive control {old_control or 'none'} -> {new_control or 'none'}")
    old_difference, new_difference = against_mdd(before, task), against_mdd(now, task)
    if old_difference != new_difference or before["verdict"] != now["verdict"] or not parts:
        parts.append(f"difference unchanged, {new_difference}" if old_difference == new_difference else
                     f"difference {old_difference} -> {new_difference}")
    return "; ".join(parts)


def row(role: str | None, key: tuple, before: dict | None, now: dict | None, previous: dict, current: dict) -> dict:
    arm, baseline, task, metric = key
    return {"role": role, "arm": arm, "baseline": baseline, "task": task, "metric": metric, "before": before,
            "now": now, "why": why(before, now, task, previous, current, control=role == "control")}


def key_of(entry: dict, task: str | None = None) -> tuple:
    return entry["arm"], entry["baseline"], task or entry.get("task"), entry.get("metric")


def control_verdict(entry: dict, task: str) -> str:
    """A previous report's control verdict as the current rule gives it: reworded (`current_verdict`), and where it
    read "no signal" with its interval wholly on the worse side of 0, opposite (a control is tested alone at 5%, so
    its 90% interval's end is the test; before, the floors gated that too)."""
    verdict = current_verdict(entry["verdict"])
    worse = entry.get("high") if task_facts(task).higher_is_better else entry.get("low")
    if verdict == NO_SIGNAL and worse is not None and (worse < 0 if task_facts(task).higher_is_better else worse > 0):
        return OPPOSITE
    return verdict


def reworded(record: dict) -> dict:
    """A `previous_record` in the current vocabulary, whichever a report was written in."""
    return {**record, "claims": [{**c, "verdict": current_verdict(c["verdict"])} for c in record["claims"]],
            "controls": {task: {**e, "verdict": control_verdict(e, task)} for task, e in record["controls"].items()}}


def changes(previous: dict, results: dict) -> list[dict]:
    """One row per positive control (role "control") and per claim of either report, matched on (arm, baseline,
    task, metric): the previous verdict and difference, the new ones (None where the report lacks it), and `why`
    they differ."""
    current, previous = (reworded(record) for record in (previous_record(results, results.get("commit"), ""), previous))
    rows = []
    for record, role in ((lambda r: {key_of(e, t): e for t, e in r["controls"].items()}, "control"),
                         (lambda r: {key_of(c): c for c in r["claims"]}, None)):
        old, new = record(previous), record(current)
        for key in [*new, *(k for k in old if k not in new)]:
            entry = new.get(key) or old[key]
            before, now = old.get(key), new.get(key)
            rows.append(row(role or entry.get("role"), key,
                            before and {"verdict": before["verdict"], **{k: before.get(k) for k in DECISION_KEYS}},
                            now and {"verdict": now["verdict"], **{k: now.get(k) for k in DECISION_KEYS}},
                            previous, current))
    return rows
