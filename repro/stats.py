"""Statistics for the reproduction harness: descriptive intervals and floors, and the verdict on a paper's claim
(numpy, scipy).

The verdict (`decide`, `decide_family`)
---------------------------------------
*Unit of replication.* A claim compares two training procedures, so the independent replicate is one independently
trained model: a pretraining seed, or, for a fusion over a fixed backbone, an initialisation seed. Fine-tuning seeds
of one model measure that model more precisely but are not new models: they are averaged to one unit mean and never
counted as units. Counting them (the harness's former percentile bootstrap over paired runs, kept in
`tests/test_repro_stats.py` as the rule the simulation must catch) treats one lucky pretraining run as
several, and says "reproduced" for two equal arms 14-35% of the time at the budgets' sizes.

*Test.* A one-sided t-test on unit means: paired by unit seed when the arms share at least 2 unit seeds (the
difference of each pair's unit means; unshared units are dropped and counted in `dropped_units`), otherwise Welch's
unequal-variance t-test on all unit means. A unit mean is a model's random offset plus the average of its
fine-tuning noise; when both are normal the paired test's error rate is exactly `alpha`, and Welch's is at most
`alpha` (simulated with equal arms: 3.2%, 3.9%, 4.4% at 2, 3, 5 units per arm; `tests/test_repro_stats.py` bounds
both). Welch stays valid (conservative) if units sharing a seed are positively correlated. Why not something
distribution-free: an exact sign-flip permutation test on n pairs has smallest one-sided p 2^-n, so with the 2-4
units the budgets afford it can never reach 5% (1/4, 1/8, 1/16), nor can a two-sample permutation test with 2 + 2
units (1/6); and a bootstrap of 2-5 units underestimates the spread (variance times (n-1)/n, normal instead of t
quantiles) and is anti-conservative. With 2 units the t-test has 1 degree of freedom and little power: `mdd` reports
how large a difference that size could find.

*Directions.* Everything is computed on the better-direction difference (arm - baseline, sign-flipped when lower is
better); `estimate`, `low`, `high` are reported as arm - baseline in the metric's units.
- "better" (the paper says the arm beats the baseline): REPRODUCED when the one-sided p in the claimed direction is
  below `alpha`, OPPOSITE when the one-sided p in the other direction is, else NOT_REPRODUCED.
- "not_better" (the paper says the arm is no better): a non-inferiority-style test needing a `margin` > 0, the
  smallest improvement (in the metric's units, toward its better side) that would count as "better", stated by the
  experiment with its source in the paper. REPRODUCED when the one-sided (1 - alpha) upper bound of the
  better-direction difference lies below +margin, i.e. the data show the arm is not better by the margin or more.
  OPPOSITE when the arm is shown better than the baseline (one-sided p < alpha beyond 0); that takes precedence, so
  a significant improvement is never called "no better" even when it is smaller than the margin. Without a margin a
  "no better" claim cannot be reproduced (an absent difference is not evidence of no difference): NOT_REPRODUCED with
  a `reason`.
- Fewer than 2 units in either arm (after pairing): INSUFFICIENT, never REPRODUCED.
- `control=False` (the experiment's positive control, pretrained > the same architecture at random initialisation,
  is not reproduced on this task; at a continued-pretraining budget also its adaptation control, the encoder
  continued with plain MLM > the encoder fine-tuned directly, `decide_gated`): NO_CONTROL, "this budget does not
  detect pretraining", whatever the claim's data; `control=None`: no control gates the claim. Where the positive
  control reads reproduced and the adaptation control alone does not, the verdict names that gate and its reason
  (`adaptation_gate`): the budget detects pretraining, but not what continuing the encoder adds.
- `learned=False` (neither arm clears its floor, see `clears_floor` and `learned`): NO_SIGNAL, since two models that
  learned no more than a trivial model differ by noise; but an arm shown worse than its baseline reads OPPOSITE
  floors or not, so a model significantly below its random start reads the same at every budget (the floors gate
  crediting a claim, and an OPPOSITE credits none).
- Every unit of the two arms scores the same (paired: each difference is exactly 0; unpaired: neither arm has spread
  and their means agree): INDISTINGUISHABLE, whatever the direction.
Precedence: INSUFFICIENT, NO_CONTROL, OPPOSITE, NO_SIGNAL, INDISTINGUISHABLE, then REPRODUCED / NOT_REPRODUCED.
Every verdict is one word of `VERDICT_WORDS`; "no signal" (not judged) names its gate in brackets.
`low`/`high` are the two-sided (1 - 2 alpha) interval, whose ends are the one-sided (1 - alpha) bounds the verdict uses:
"better" is reproduced exactly when the interval excludes 0 on the better side, "not_better" needs it wholly below
+margin (on the better side).

*Several claims.* One experiment (one paper) makes several claims, each scored on several tasks; every (claim, task)
verdict of one experiment's report is one family. `decide_family` runs `decide` on each and replaces the p-values by
Holm-adjusted ones (`holm`) before the verdicts: reproduction p-values form one family (controls the chance of any
false REPRODUCED at `alpha`, whatever the dependence between claims sharing a baseline arm), the opposite-direction
p-values another (any false OPPOSITE). Claims that cannot be tested (INSUFFICIENT, no margin) have no p-value and are
left out of the family; NO_SIGNAL, NO_CONTROL and INDISTINGUISHABLE claims stay in it (conservative: a gate never
makes the family smaller). After adjustment, `low`/`high` are the unadjusted interval and no longer match the verdict
exactly. The held-out MLM loss carries no claim and is no member. A paper's one primary claim is decided alone at
`alpha` (`decide`); its other claims are secondary, one family (`decide_family`).

*MDD at the verdict's alpha.* A family's `mdd` is computed at alpha / m (m: the family's claims with a p-value), the
level Holm's first step applies: a raw p below alpha / m is always rejected (each adjusted p is at most m times its
raw one), so a true difference of `mdd` is found with at least 80% power under Holm too. The MDD at the unadjusted
alpha would promise a power the adjusted verdict does not have (`tests/test_repro_stats.py` measures both).

*No spread.* When every unit's difference is the same (a discrete metric on a few hundred rows can do it: two
fusions whose CNNs barely move the predictions score the same on every unit), the t statistic is 0/0 or infinite.
The p-values are then the exact permutation test's, distribution-free: all n paired differences on one side give
2^-n (sign flips), two spread-less arms 1/C(n_a + n_b, n_a) (relabellings), no difference gives 1. At 3 units that
is 1/8, never a verdict; `mdd` is None, since no spread was observed to state a resolution from.

*Minimum detectable difference.* `minimum_detectable_difference` gives, for a unit count and a unit-level SD, the
true difference a one-sided t-test at `alpha` finds with probability `power` (80%), from the noncentral t
distribution; `decide` reports it (`mdd`) with the observed unit-level SD so a NOT_REPRODUCED reads as "no
difference of at least `mdd` at this scale", not as evidence against the paper.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from scipy import optimize, stats

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
OPPOSITE = "opposite"
INSUFFICIENT = "insufficient (fewer than 2 units per arm)"
# "no signal" is one word for one thing, the claim not judged, its gate named in brackets (`verdict_word`).
NO_SIGNAL = "no signal (neither arm clears its floor)"
NO_CONTROL = "no signal (the positive control does not reproduce)"
NO_ADAPTATION = "no signal (the adaptation control reads "  # + that control's verdict word + ")" (`no_adaptation`)
# Why MiniLM continued with plain MLM fine-tunes no better than MiniLM itself (docs/reproduction.md).
ADAPTATION_REASON = ("the shipped MiniLM is a sentence encoder with no MLM head: its new head starts random and MLM "
                     "moves the encoder away from what fine-tuning uses (docs/reproduction.md, The adapt budget)")
INDISTINGUISHABLE = "indistinguishable (the same score on every unit)"
# The one vocabulary of every report, README's table and the docs: each verdict's word and what it means.
VERDICT_WORDS = {
    "reproduced": "significant as claimed (one-sided 5%)",
    "not reproduced": "no significant difference (none as large as the MDD)",
    "opposite": "significantly the other way (a control: below its random start, or adapted below not adapted)",
    "no signal": "not judged, the gate in brackets fails",
    "indistinguishable": "the same score on every unit",
    "insufficient": "under 2 units per arm",
}
# Phrasings of reports written before this vocabulary, read as the verdicts they meant (`current_verdict`).
FORMER_VERDICTS = {
    "not reproduced at this scale": NOT_REPRODUCED,
    "no signal at this scale (neither arm clears the floor)": NO_SIGNAL,
    "no signal: this budget does not detect pretraining": NO_CONTROL,
}
FORMER_ADAPTATION = "no signal: the adaptation control reads "


def verdict_word(verdict: str) -> str:
    """A verdict's word (`VERDICT_WORDS`), its bracket left out."""
    return verdict.split(" (")[0]


def no_adaptation(verdict: str) -> str:
    """The verdict of a claim gated by the adaptation control alone, naming that control's verdict word."""
    return f"{NO_ADAPTATION}{verdict_word(verdict)})"


def current_verdict(verdict: str) -> str:
    """A verdict as this vocabulary writes it, a report's of the former phrasings included."""
    if verdict.startswith(FORMER_ADAPTATION):
        return no_adaptation(current_verdict(verdict.removeprefix(FORMER_ADAPTATION)))
    return FORMER_VERDICTS.get(verdict, verdict)


def verdict_key() -> str:
    """One line saying what each verdict word means (README's table, the reports)."""
    return "; ".join(f"*{word}*: {meaning}" for word, meaning in VERDICT_WORDS.items()) + "."


ALPHA = 0.05  # every verdict's one-sided level: a primary claim and the positive control alone, a family under Holm
DIRECTIONS = ("better", "not_better")


def mean_interval(values, confidence: float = 0.95) -> tuple[float, float | None, float | None]:
    """The mean of unit means and its two-sided t interval (n - 1 degrees of freedom); (mean, None, None) below 2
    units, (mean, mean, mean) where every unit scores the same."""
    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, None, None
    half = float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1)) * _spread(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def above_floor(low: float | None, high: float | None, floor: float | None, higher_is_better: bool = True):
    """Whether an interval lies wholly on the better side of `floor` (the score of a trivial model: one constant
    answer, a bag-of-words model, a unigram model); None when there is no floor or no interval (fewer than 2 units)."""
    if floor is None or low is None:
        return None
    return low > floor if higher_is_better else high < floor


def clears_floor(runs: dict, floor: float | None, higher_is_better: bool = True, confidence: float = 0.95):
    """Whether an arm, {(unit_seed, finetune_seed): score}, clears `floor`: the 95% t interval of its mean over unit
    means lies wholly on the better side of it. None: no floor, or fewer than 2 units."""
    _, low, high = mean_interval(list(unit_means(runs).values()), confidence) if runs else (None, None, None)
    return above_floor(low, high, floor, higher_is_better)


def learned(arm: dict, baseline: dict, floors, higher_is_better: bool = True) -> bool:
    """The `learned` of `decide`: whether at least one of the two arms clears its floor (`floors`: one for both, or
    (the arm's, the baseline's)); True where neither arm has a floor to clear."""
    arm_floor, baseline_floor = floors if isinstance(floors, tuple) else (floors, floors)
    cleared = [clears_floor(arm, arm_floor, higher_is_better), clears_floor(baseline, baseline_floor, higher_is_better)]
    return any(cleared) or all(c is None for c in cleared)



# ------------------------------------------------------------------------------------------------------- verdict
def unit_means(runs: dict[tuple, float]) -> dict:
    """unit_seed -> mean over that unit's fine-tuning seeds (insertion order of first appearance)."""
    grouped: dict = {}
    for key, value in runs.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise TypeError(f"run key {key!r} is not (unit_seed, finetune_seed)")
        grouped.setdefault(key[0], []).append(float(value))
    return {unit: float(np.mean(values)) for unit, values in grouped.items()}


@cache
def _mdd_factor(n_arm: int, n_baseline: int, alpha: float, power: float, paired: bool) -> float:
    """MDD per unit of unit-level SD: solve the noncentral t power equation for the noncentrality, scale by the
    standard error factor."""
    df = n_arm - 1 if paired else n_arm + n_baseline - 2
    se_factor = 1 / math.sqrt(n_arm) if paired else math.sqrt(1 / n_arm + 1 / n_baseline)
    critical = stats.t.ppf(1 - alpha, df)
    noncentrality = optimize.brentq(lambda nc: stats.nct.sf(critical, df, nc) - power, 0.0, 1e4, xtol=1e-10)
    return noncentrality * se_factor


def minimum_detectable_difference(n_units, unit_sd: float, alpha: float = 0.05, power: float = 0.8,
                                  paired: bool = True) -> float:
    """The true difference a one-sided t-test at `alpha` detects with probability `power`, from the noncentral t
    distribution (exact for the paired test under normal units).

    Paired: `n_units` pairs, `unit_sd` the SD of the paired differences of unit means. Unpaired: `n_units` per arm
    (an int, or (arm, baseline)), `unit_sd` the SD of one arm's unit means (pooled); the power uses the pooled
    t-test's n_a + n_b - 2 degrees of freedom, so for Welch (fewer df) the real power at this difference is a little
    lower. Infinite below 2 units per arm."""
    n_arm, n_baseline = (n_units, n_units) if np.isscalar(n_units) else n_units
    if paired and n_arm != n_baseline:
        raise ValueError(f"a paired design has as many units in each arm, not {n_arm} and {n_baseline}")
    if min(n_arm, n_baseline) < 2:
        return math.inf
    return float(unit_sd) * _mdd_factor(int(n_arm), int(n_baseline), float(alpha), float(power), bool(paired))


def _spread(values: np.ndarray) -> float:
    """The sample SD, 0 where it is only rounding (equal scores computed along different float paths)."""
    sd = float(values.std(ddof=1))
    return 0.0 if sd <= 1e-9 * max(1.0, float(np.abs(values).max())) else sd


def _same(a: float, b: float) -> bool:
    """Equal up to rounding (as `_spread`)."""
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _t_test(arm_units: dict, baseline_units: dict, sign: int) -> dict:
    """The t statistic's pieces on the better-direction difference (sign * (arm - baseline))."""
    shared = [unit for unit in arm_units if unit in baseline_units]
    if len(shared) >= 2:
        differences = sign * np.array([arm_units[u] - baseline_units[u] for u in shared])
        n = len(differences)
        sd = _spread(differences)
        return {"paired": True, "test": "one-sided paired t-test on unit means (paired by unit seed)",
                "n_arm": n, "n_baseline": n, "estimate": float(differences.mean()), "se": sd / math.sqrt(n),
                "df": n - 1, "unit_sd": sd, "identical": all(_same(arm_units[u], baseline_units[u]) for u in shared),
                "dropped_units": {"arm": len(arm_units) - n, "baseline": len(baseline_units) - n}}
    a, b = np.array(list(arm_units.values())), np.array(list(baseline_units.values()))
    result = {"paired": False, "test": "one-sided Welch t-test on unit means (fewer than 2 shared unit seeds to pair)",
              "n_arm": len(a), "n_baseline": len(b), "dropped_units": {"arm": 0, "baseline": 0},
              "estimate": float(sign * (a.mean() - b.mean())) if len(a) and len(b) else None, "identical": False}
    if min(len(a), len(b)) < 2:
        return {**result, "se": None, "df": None, "unit_sd": None}
    result["identical"] = _spread(a) == _spread(b) == 0 and _same(float(a.mean()), float(b.mean()))
    va, vb = _spread(a) ** 2 / len(a), _spread(b) ** 2 / len(b)
    pooled = ((len(a) - 1) * _spread(a) ** 2 + (len(b) - 1) * _spread(b) ** 2) / (len(a) + len(b) - 2)
    # Welch-Satterthwaite degrees of freedom; with no spread at all the df do not matter (se is 0)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if va + vb > 0 else len(a) + len(b) - 2
    return {**result, "se": float(math.sqrt(va + vb)), "df": float(df), "unit_sd": float(math.sqrt(pooled))}


def _tails(value: float, se: float, df: float) -> tuple[float, float]:
    """(P(T >= value / se), P(T <= value / se)); with no spread at all (se 0) the sign decides, and 0/0 (no
    difference) gives 1/2 each."""
    if se > 0:
        return float(stats.t.sf(value / se, df)), float(stats.t.cdf(value / se, df))
    return (0.0, 1.0) if value > 0 else (1.0, 0.0) if value < 0 else (0.5, 0.5)


def _exact_tails(value: float, extreme: float) -> tuple[float, float]:
    """(p better, p worse) of the exact permutation test when every unit's difference is `value` (no spread): the
    observed statistic is the most extreme of the permutations, reached with probability `extreme`."""
    return (extreme, 1.0) if value > 0 else (1.0, extreme) if value < 0 else (1.0, 1.0)


def classify(result: dict, alpha: float) -> tuple[str, str | None]:
    """The verdict from a result's numbers, in the module docstring's order of precedence."""
    if min(result["units"]["arm"], result["units"]["baseline"]) < 2:
        return INSUFFICIENT, (f"{result['units']['arm']} unit(s) in the arm and {result['units']['baseline']} in "
                              "the baseline (fine-tuning seeds are not units)")
    if result["control"] is False:
        return NO_CONTROL, ("a control (pretrained > random initialisation; at a continued-pretraining budget also "
                            "adapted > not adapted) is not reproduced on this task")
    if result["p_opposite"] is not None and result["p_opposite"] < alpha:
        return OPPOSITE, None  # shown worse: said at every budget, floors or not (they gate crediting a claim)
    if not result["learned"]:
        return NO_SIGNAL, "neither arm clears its floor"
    if result["identical"]:
        return INDISTINGUISHABLE, None
    if result["p_value"] is None:
        return NOT_REPRODUCED, ("no margin stated for the 'no better' claim: an absent difference is not evidence "
                                "of none")
    return (REPRODUCED, None) if result["p_value"] < alpha else (NOT_REPRODUCED, None)


def decide(arm: dict, baseline: dict, direction: str, higher_is_better: bool = True, margin: float | None = None,
           alpha: float = 0.05, learned: bool = True, control: bool | None = None) -> dict:
    """The verdict on one claim ("better" or "not_better", see the module docstring) from `arm` and `baseline`,
    each {(unit_seed, finetune_seed): score}, as `repro/run.py` collects them.

    Returns verdict, reason (None or why), estimate (mean arm - baseline in the metric's units), low, high (two-sided
    1 - 2 alpha interval of it = the one-sided bounds), confidence, p_value (one-sided, of the claimed hypothesis:
    "better": arm not better; "not_better": arm better by margin or more; None without a margin or units), p_opposite
    (one-sided, arm worse for "better", arm better for "not_better"), test, paired, units {"arm", "baseline"} (units
    used; pairs in both when paired), dropped_units, runs {"arm", "baseline"}, df, unit_sd (observed SD of the
    paired differences, or pooled SD of unit means), mdd (minimum detectable difference at 80% power for these units
    and that SD at `mdd_alpha`, here `alpha`; None when that SD is 0), identical (every unit scores the same in both
    arms), direction, margin, higher_is_better, alpha, learned, control (see the module docstring). Undefined numbers
    are None (JSON-safe)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown claim direction {direction!r}: use 'better' or 'not_better'")
    if margin is not None and not margin > 0:
        raise ValueError(f"margin must be > 0 (in the metric's units, toward its better side), not {margin!r}")
    sign = 1 if higher_is_better else -1
    test = _t_test(unit_means(arm), unit_means(baseline), sign)
    result = {"verdict": None, "reason": None, "estimate": None, "low": None, "high": None,
              "confidence": 1 - 2 * alpha, "p_value": None, "p_opposite": None, "test": test["test"],
              "paired": test["paired"], "units": {"arm": test["n_arm"], "baseline": test["n_baseline"]},
              "dropped_units": test["dropped_units"], "runs": {"arm": len(arm), "baseline": len(baseline)},
              "df": test["df"], "unit_sd": test["unit_sd"], "mdd": None, "mdd_alpha": alpha, "direction": direction,
              "margin": margin, "higher_is_better": higher_is_better, "alpha": alpha, "learned": learned,
              "control": control, "identical": test["identical"]}
    if test["estimate"] is not None:
        result["estimate"] = sign * test["estimate"]
    if test["se"] is not None:
        better, se, df = test["estimate"], test["se"], test["df"]
        half_width = float(stats.t.ppf(1 - alpha, df)) * se
        low, high = better - half_width, better + half_width  # better-direction, then back to arm - baseline
        result["low"], result["high"] = (low, high) if sign > 0 else (-high, -low)
        if se > 0:
            tails = lambda value: _tails(value, se, df)  # noqa: E731
        else:  # no spread: the exact permutation test (module docstring)
            n_arm, n_baseline = test["n_arm"], test["n_baseline"]
            extreme = 0.5 ** n_arm if test["paired"] else 1 / math.comb(n_arm + n_baseline, n_arm)
            result["test"] += "; no spread between units: exact permutation p"
            tails = lambda value: _exact_tails(value, extreme)  # noqa: E731
        shown_better, shown_worse = tails(better)
        if direction == "better":
            result["p_value"], result["p_opposite"] = shown_better, shown_worse
        else:
            result["p_opposite"] = shown_better
            if margin is not None:  # H0: better by margin or more; rejected when the upper bound is below margin
                result["p_value"] = tails(better - margin)[1]
        if test["unit_sd"] > 0:
            result["mdd"] = minimum_detectable_difference(
                test["n_arm"] if test["paired"] else (test["n_arm"], test["n_baseline"]), test["unit_sd"], alpha,
                paired=test["paired"])
    result["verdict"], result["reason"] = classify(result, alpha)
    return result


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: the i-th smallest is multiplied by (m - i + 1), kept
    monotone and capped at 1. Rejecting adjusted p < alpha controls the family-wise error at alpha under any
    dependence."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, p[order] * (len(p) - np.arange(len(p))))
    adjusted = np.empty_like(p)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted.tolist()


def decide_family(claims: list[dict], alpha: float = 0.05) -> list[dict]:
    """`decide` on each of a family's claims (dicts of `decide`'s keyword arguments but alpha: arm, baseline,
    direction, and optionally higher_is_better, margin, learned, control), with Holm-adjusted p-values and the
    verdicts they give. Each result keeps its unadjusted p-values as p_value_raw / p_opposite_raw, says family_size
    (the number of claims with a p-value), and gives its MDD at alpha / family_size (`mdd_alpha`; module
    docstring)."""
    results = [decide(**claim, alpha=alpha) for claim in claims]
    for key in ("p_value", "p_opposite"):
        tested = [i for i, r in enumerate(results) if r[key] is not None]
        for i, adjusted in zip(tested, holm([results[i][key] for i in tested])):
            results[i][f"{key}_raw"], results[i][key] = results[i][key], adjusted
        for r in results:
            r.setdefault(f"{key}_raw", None)
    family_size = sum(r["p_value"] is not None for r in results)
    for r in results:
        r["family_size"] = family_size
        r["mdd_alpha"] = alpha / max(1, family_size)
        if r["unit_sd"]:
            r["mdd"] = minimum_detectable_difference(
                r["units"]["arm"] if r["paired"] else (r["units"]["arm"], r["units"]["baseline"]), r["unit_sd"],
                r["mdd_alpha"], paired=r["paired"])
        r["verdict"], r["reason"] = classify(r, alpha)
    return results


def decide_experiment(claims: list[dict], controls: dict | None = None, alpha: float = ALPHA) -> tuple[dict, list]:
    """Every verdict of one paper's report, by the rule of the module docstring: the positive control on each task
    alone at `alpha`; the primary claim alone at `alpha`; the secondary claims one Holm family; every claim gated by
    its task's control (judged only where the control is REPRODUCED) and by its floors (`learned`).

    `claims`: dicts of `decide`'s keyword arguments but alpha and control, plus "task" and "primary" (bool).
    `controls`: task -> `decide`'s keyword arguments (pretrained arm, random baseline, "better"); None where the
    experiment has no positive control (nothing gates). A task the controls lack has no control result: its claims
    are not judged. Returns ({task: control decision}, [claim decisions, in the order of `claims`])."""
    decided, results = decide_gated(claims, {"positive": controls}, alpha)
    return decided.get("positive", {}), results


def adaptation_gate(positive: str | None, adaptation: str | None, estimate: float | None) -> tuple[str, str] | None:
    """The verdict and reason of a claim gated by the adaptation control alone: where the positive control reads
    REPRODUCED on its task and the adaptation control (its `adaptation` verdict, `estimate` its difference) has a
    verdict other than REPRODUCED. None where the positive control gated it too, or no adaptation control ran."""
    if positive != REPRODUCED or adaptation in (None, REPRODUCED) or adaptation.startswith("unavailable"):
        return None
    worse = "worse than" if estimate is not None and estimate < 0 else "no better than"
    return (no_adaptation(adaptation), f"the encoder continued with plain MLM fine-tunes {worse} the encoder "
            f"fine-tuned directly, so this budget cannot credit an objective as a continued-pretraining step; "
            f"{ADAPTATION_REASON}")


def decide_gated(claims: list[dict], controls: dict[str, dict | None], alpha: float = ALPHA) -> tuple[dict, list]:
    """`decide_experiment` under several controls, one rule: each control on each task alone at `alpha`, and a claim
    judged only where every control (`controls`: name -> task -> `decide`'s arguments, or None for a control the
    experiment does not have, which gates nothing) reads REPRODUCED on its task; a task a control lacks is not
    judged. A continued-pretraining budget has two: pretrained > random ("positive") and adapted > not adapted
    ("adaptation"). A claim on a control's own arm (spanbert > bert, bert > minilm the control) is selected on that
    arm drawing high, which makes it rarer to read reproduced, not likelier: simulated with 5 equal units, 2.8% of
    the papers the gate lets through against 5.1% ungated (tests/test_repro_adapt.py).
    Returns ({name: {task: decision}} for each control that is not None, [claim decisions])."""
    decided = {name: {task: decide(**arguments, alpha=alpha) for task, arguments in per_task.items()}
               for name, per_task in controls.items() if per_task is not None}

    def gate(task):  # None: no control at all
        return all(per_task.get(task, {}).get("verdict") == REPRODUCED for per_task in decided.values()) if decided \
            else None

    def arguments(claim):
        return {**{k: v for k, v in claim.items() if k not in ("task", "primary")}, "control": gate(claim["task"])}

    results: list = [None] * len(claims)
    for i, claim in enumerate(claims):
        if claim["primary"]:
            r = decide(**arguments(claim), alpha=alpha)
            results[i] = {**r, "family_size": 1, "p_value_raw": r["p_value"], "p_opposite_raw": r["p_opposite"]}
    secondary = [i for i, claim in enumerate(claims) if not claim["primary"]]
    for i, r in zip(secondary, decide_family([arguments(claims[i]) for i in secondary], alpha)):
        results[i] = r
    for claim, r in zip(claims, results):
        if r["verdict"] != NO_CONTROL:
            continue
        adaptation = decided.get("adaptation", {}).get(claim["task"], {})
        named = adaptation_gate(decided.get("positive", {}).get(claim["task"], {}).get("verdict"),
                                adaptation.get("verdict"), adaptation.get("estimate"))
        if named:
            r["verdict"], r["reason"] = named
    return decided, results
