"""Seeded percentile-bootstrap statistics and the verdict on a paper's claim (numpy only)."""

from __future__ import annotations

import numpy as np

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced at this scale"
OPPOSITE = "opposite"
NO_VERDICT = "no verdict (fewer than 2 paired runs)"
NO_SIGNAL = "no signal at this scale (neither arm above chance)"
RESAMPLES = 10_000


def median_ci(values, seed: int = 0, confidence: float = 0.95) -> tuple[float, float, float]:
    """Median and its percentile-bootstrap interval."""
    values = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(values[rng.integers(0, len(values), (RESAMPLES, len(values)))], axis=1)
    tail = (1 - confidence) / 2 * 100
    return float(np.median(values)), float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


def paired_difference_ci(arm: dict, baseline: dict, seed: int = 0, confidence: float = 0.95) -> dict:
    """Mean of paired differences arm - baseline (pairs: runs sharing a key, e.g. (pretraining seed, fine-tuning
    seed)) and its percentile-bootstrap interval, resampling pairs."""
    keys = sorted(set(arm) & set(baseline))
    differences = np.array([arm[k] - baseline[k] for k in keys], dtype=float)
    if len(differences) == 0:
        return {"pairs": 0, "mean": None, "low": None, "high": None}
    rng = np.random.default_rng(seed)
    means = differences[rng.integers(0, len(differences), (RESAMPLES, len(differences)))].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    return {"pairs": len(differences), "mean": float(differences.mean()), "low": float(np.percentile(means, tail)),
            "high": float(np.percentile(means, 100 - tail))}


def above_chance(low: float, high: float, chance: float | None, higher_is_better: bool = True) -> bool | None:
    """Whether an arm's interval (of its median) lies wholly on the better side of `chance`, the score of a model
    that learned nothing; None when the task has no such level."""
    if chance is None:
        return None
    return low > chance if higher_is_better else high < chance


def verdict(difference: dict, direction: str, higher_is_better: bool = True, learned: bool = True) -> str:
    """direction "better": the paper says arm beats baseline; "not_better": the paper says arm is no better.

    "better": reproduced when the interval of the difference excludes 0 on the better side, opposite when it excludes
    0 on the worse side, otherwise not reproduced at this scale. "not_better": reproduced unless the interval shows
    the arm better (then opposite). `learned=False` (neither arm above chance, see `above_chance`): no verdict,
    since a difference between two models that learned nothing says nothing about the paper's claim."""
    if direction not in ("better", "not_better"):
        raise ValueError(f"unknown claim direction {direction!r}: use 'better' or 'not_better'")
    if difference["pairs"] < 2:
        return NO_VERDICT
    if not learned:
        return NO_SIGNAL
    sign = 1 if higher_is_better else -1
    low, high = sorted((sign * difference["low"], sign * difference["high"]))  # in "better is positive" units
    if direction == "better":
        return REPRODUCED if low > 0 else OPPOSITE if high < 0 else NOT_REPRODUCED
    return OPPOSITE if low > 0 else REPRODUCED
