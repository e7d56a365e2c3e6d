"""`repro/stats.py`'s verdict, measured by simulation: error rates, power and the minimum detectable difference.

Every simulated experiment trains `n_units` models per arm, each with its own random offset (SD `UNIT_SD`), and
fine-tunes each `FINETUNE_SEEDS` times with noise (SD `FINETUNE_SD`): the unit SD exceeds the fine-tuning SD, as it
does for pretraining. Rates come from `EXPERIMENTS` seeded experiments per setting; a bound "<= alpha" is asserted as
<= alpha + 3 Monte-Carlo standard errors (`ALPHA_BOUND`), which a correct test exceeds with probability ~0.1%.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from encoder_zoo.repro.stats import (
    ALPHA as VERDICT_ALPHA,
)
from encoder_zoo.repro.stats import (
    INDISTINGUISHABLE,
    INSUFFICIENT,
    NO_CONTROL,
    NO_SIGNAL,
    NOT_REPRODUCED,
    OPPOSITE,
    REPRODUCED,
    clears_floor,
    decide,
    decide_experiment,
    decide_family,
    holm,
    learned,
    mean_interval,
    minimum_detectable_difference,
)

UNIT_SD, FINETUNE_SD, FINETUNE_SEEDS = 1.0, 0.5, 3
EXPERIMENTS = 2000
ALPHA = 0.05
ALPHA_BOUND = ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / EXPERIMENTS)
UNIT_MEAN_SD = math.sqrt(UNIT_SD ** 2 + FINETUNE_SD ** 2 / FINETUNE_SEEDS)  # one model's mean over its seeds


def simulate(n_units, shifts, seed, finetune_seeds=FINETUNE_SEEDS, experiments=EXPERIMENTS, paired=True):
    """Per experiment, one {(unit_seed, finetune_seed): score} per arm; arm i is shifted by shifts[i]. Paired: every
    arm trains with unit seeds 0..n-1; unpaired: each arm has its own seeds (nothing to pair)."""
    rng = np.random.default_rng(seed)
    shape = (experiments, len(shifts), n_units)
    scores = (np.asarray(shifts, dtype=float)[None, :, None, None] + rng.normal(0, UNIT_SD, shape)[..., None]
              + rng.normal(0, FINETUNE_SD, (*shape, finetune_seeds)))
    return [[{(unit + (0 if paired else 100 * a), f): float(scores[e, a, unit, f])
              for unit in range(n_units) for f in range(finetune_seeds)} for a in range(len(shifts))]
            for e in range(experiments)]


def rate(verdicts, which):
    return float(np.mean([v == which for v in verdicts]))


def decide_all(arms, **kwargs):
    return [decide(arm, baseline, **kwargs) for arm, baseline in arms]


def old_rule(arm, baseline, seed=0):
    """The harness's former rule, kept as the lenient reference the simulation must catch: "reproduced" when the
    percentile-bootstrap 95% interval of the mean paired difference (fine-tuning runs counted as pairs) excludes 0."""
    keys = sorted(set(arm) & set(baseline))
    differences = np.array([arm[k] - baseline[k] for k in keys])
    rng = np.random.default_rng(seed)
    means = differences[rng.integers(0, len(differences), (2000, len(differences)))].mean(axis=1)
    return REPRODUCED if np.percentile(means, 2.5) > 0 else NOT_REPRODUCED


# ------------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("paired", [True, False], ids=["paired", "welch"])
@pytest.mark.parametrize("n_units", [2, 3, 5])
def test_equal_arms_are_reproduced_at_most_alpha_at_every_budget_unit_count(n_units, paired):
    results = decide_all(simulate(n_units, [0.0, 0.0], seed=n_units + 10 * paired, paired=paired), direction="better")
    verdicts = [r["verdict"] for r in results]
    assert rate(verdicts, REPRODUCED) <= ALPHA_BOUND
    assert rate(verdicts, OPPOSITE) <= ALPHA_BOUND
    assert all(r["test"].startswith("one-sided paired t-test" if paired else "one-sided Welch") for r in results)
    assert all(r["units"] == {"arm": n_units, "baseline": n_units} for r in results)


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "welch"])
def test_one_unit_per_arm_is_insufficient_however_large_the_difference(paired):
    results = decide_all(simulate(1, [10.0, 0.0], seed=1, finetune_seeds=10, experiments=50, paired=paired),
                         direction="better")
    assert {r["verdict"] for r in results} == {INSUFFICIENT}
    assert all(r["units"] == {"arm": 1, "baseline": 1} and r["p_value"] is None for r in results)
    # many fine-tuning seeds of one model are still one unit, and a second unit on one side only does not help
    lone = {(1, f): 10.0 + f for f in range(5)}
    assert decide({**lone, (2, 0): 10.0}, {(7, f): float(f) for f in range(5)}, "better")["verdict"] == INSUFFICIENT


def test_fine_tuning_seeds_are_averaged_not_counted():
    arm, baseline = simulate(3, [0.5, 0.0], seed=2, experiments=1)[0]
    full = decide(arm, baseline, "better")

    def means(runs):
        return {(u, 0): float(np.mean([v for (unit, _), v in runs.items() if unit == u])) for u in range(3)}

    collapsed = decide(means(arm), means(baseline), "better")
    assert full["units"] == {"arm": 3, "baseline": 3} and full["df"] == 2 and full["runs"]["arm"] == 9
    for key in ("estimate", "low", "high", "p_value", "unit_sd", "mdd"):
        assert full[key] == pytest.approx(collapsed[key], rel=1e-9, abs=1e-12)


def test_the_old_rule_is_caught_too_lenient_by_the_same_simulation():
    """Regression check: the harness that bounds `decide` flags the old bootstrap rule (fine-tuning seeds counted as
    pairs), so the bound above is not vacuous."""
    arms = simulate(3, [0.0, 0.0], seed=3, experiments=1000)
    old = rate([old_rule(a, b) for a, b in arms], REPRODUCED)
    new = rate([r["verdict"] for r in decide_all(arms, direction="better")], REPRODUCED)
    assert old > 0.10
    assert new <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / 1000)


# -------------------------------------------------------------------------------------------------------- power
@pytest.mark.parametrize("paired", [True, False], ids=["paired", "welch"])
def test_a_difference_of_three_unit_sds_is_found_with_five_units(paired):
    results = decide_all(simulate(5, [3 * UNIT_SD, 0.0], seed=4, experiments=1000, paired=paired),
                         direction="better")
    assert rate([r["verdict"] for r in results], REPRODUCED) >= 0.5
    assert np.mean([r["estimate"] for r in results]) == pytest.approx(3 * UNIT_SD, abs=0.1)


def test_the_minimum_detectable_difference_shrinks_with_units_and_is_found_80_percent_of_the_time():
    mdds = [minimum_detectable_difference(n, 1.0) for n in (2, 3, 5, 10, 30)]
    assert all(a > b for a, b in itertools.pairwise(mdds))
    assert minimum_detectable_difference(5, 2.0) == pytest.approx(2 * mdds[2])
    assert minimum_detectable_difference(1, 1.0) == math.inf
    # large samples: the normal approximation (z_0.95 + z_0.8) * sd / sqrt(n)
    assert minimum_detectable_difference(2000, 1.0) == pytest.approx((1.6449 + 0.8416) / math.sqrt(2000), rel=0.01)
    difference_sd = math.sqrt(2) * UNIT_MEAN_SD  # of two independent models' means
    for n_units, paired, sd in ((3, True, difference_sd), (5, True, difference_sd), (5, False, UNIT_MEAN_SD)):
        mdd = minimum_detectable_difference(n_units, sd, paired=paired)
        results = decide_all(simulate(n_units, [mdd, 0.0], seed=5 + n_units, experiments=1000, paired=paired),
                             direction="better")
        assert 0.65 <= rate([r["verdict"] for r in results], REPRODUCED) <= 0.95, (n_units, paired)
        # the reported MDD is the same formula at the observed SD
        r = results[0]
        expected = minimum_detectable_difference(n_units if paired else (n_units, n_units), r["unit_sd"], paired=paired)
        assert r["mdd"] == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------- "no better" claims
@pytest.mark.parametrize("n_units", [2, 3, 5])
def test_no_better_is_reproduced_at_most_alpha_when_the_arm_is_better_by_exactly_the_margin(n_units):
    margin = UNIT_SD
    results = decide_all(simulate(n_units, [margin, 0.0], seed=20 + n_units), direction="not_better", margin=margin)
    assert rate([r["verdict"] for r in results], REPRODUCED) <= ALPHA_BOUND


def test_no_better_is_reproduced_only_with_the_interval_below_the_margin():
    margin = 3 * UNIT_SD
    results = decide_all(simulate(5, [0.0, 0.0], seed=6, experiments=1000), direction="not_better", margin=margin)
    reproduced = [r for r in results if r["verdict"] == REPRODUCED]
    assert len(reproduced) >= 0.5 * len(results)  # equal arms, a generous margin: usually shown
    # the verdict and the interval agree both ways (short of OPPOSITE, which takes precedence)
    assert all((r["verdict"] == REPRODUCED) == (r["high"] < margin) for r in results if r["verdict"] != OPPOSITE)
    # an arm shown better is the opposite of "no better", even by less than the margin
    clearly_better = decide_all(simulate(5, [2 * UNIT_SD, 0.0], seed=7, experiments=200), direction="not_better",
                                margin=margin)
    assert rate([r["verdict"] for r in clearly_better], OPPOSITE) >= 0.5
    assert all(r["low"] > 0 for r in clearly_better if r["verdict"] == OPPOSITE)


def test_no_better_without_a_margin_is_never_reproduced():
    results = decide_all(simulate(5, [0.0, 0.0], seed=8, experiments=300), direction="not_better")
    assert REPRODUCED not in {r["verdict"] for r in results}
    assert all(r["p_value"] is None for r in results)
    assert all("no margin" in r["reason"] for r in results if r["verdict"] == NOT_REPRODUCED)
    identical = {(u, f): 0.8 for u in range(10) for f in range(3)}
    assert decide(identical, dict(identical), "not_better")["verdict"] == INDISTINGUISHABLE
    for bad in (0.0, -0.1):
        with pytest.raises(ValueError, match="margin"):
            decide(identical, identical, "not_better", margin=bad)
    with pytest.raises(ValueError, match="direction"):
        decide(identical, identical, "worse")


# ------------------------------------------------------------------------------------------------ lower is better
def test_lower_is_better_flips_the_direction():
    arms = simulate(5, [-3 * UNIT_SD, 0.0], seed=9, experiments=300)  # the arm's loss is lower
    loss = decide_all(arms, direction="better", higher_is_better=False)
    assert rate([r["verdict"] for r in loss], REPRODUCED) >= 0.5
    assert rate([r["verdict"] for r in decide_all(arms, direction="better")], OPPOSITE) >= 0.5
    # the same verdicts, p-values and (negated) interval as the negated scores with higher is better
    for (arm, baseline), r in zip(arms[:50], loss):
        mirrored = decide({k: -v for k, v in arm.items()}, {k: -v for k, v in baseline.items()}, "better")
        assert r["verdict"] == mirrored["verdict"] and r["p_value"] == pytest.approx(mirrored["p_value"])
        assert (r["estimate"], r["low"], r["high"]) == pytest.approx((-mirrored["estimate"], -mirrored["high"],
                                                                      -mirrored["low"]))
        assert (r["verdict"] == REPRODUCED) == (r["high"] < 0)  # the whole interval on the lower (better) side
    null = decide_all(simulate(3, [0.0, 0.0], seed=10), direction="better", higher_is_better=False)
    assert rate([r["verdict"] for r in null], REPRODUCED) <= ALPHA_BOUND
    # "no better" for a loss: the arm's loss is not lower by the margin or more
    margin = 1.0
    at_margin = decide_all(simulate(3, [-margin, 0.0], seed=11), direction="not_better", higher_is_better=False,
                           margin=margin)
    assert rate([r["verdict"] for r in at_margin], REPRODUCED) <= ALPHA_BOUND


# ---------------------------------------------------------------------------------------------------- families
def test_holm_adjusts_like_the_step_down_definition():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.2]) == [0.2] and holm([]) == []
    rng = np.random.default_rng(12)
    for _ in range(50):
        p = rng.uniform(0, 0.3, rng.integers(2, 8)).tolist()
        adjusted = holm(p)
        assert all(a >= q for a, q in zip(adjusted, p)) and max(adjusted) <= 1
        order = np.argsort(p)
        assert all(np.diff(np.asarray(adjusted)[order]) >= 0)  # monotone in the raw p-values
        # step-down: the i-th smallest is rejected iff every smaller one has p_(j) * (m - j + 1) < alpha
        sorted_p = np.sort(p)
        step_down = np.cumprod([q * (len(p) - j) < ALPHA for j, q in enumerate(sorted_p)]).astype(bool)
        assert (np.sort(adjusted) < ALPHA).tolist() == step_down.tolist()


def test_holm_keeps_the_family_wise_error_of_three_null_claims_at_alpha():
    """Three arms that equal a shared baseline (three claims, as SpanBERT's against one baseline): without an
    adjustment some claim is falsely reproduced well above 5% of the time; with Holm at most 5%."""
    experiments = simulate(3, [0.0, 0.0, 0.0, 0.0], seed=13)
    any_single, any_family = [], []
    for arms in experiments:
        family = [{"arm": arms[i], "baseline": arms[3], "direction": "better"} for i in range(3)]
        adjusted = decide_family(family, alpha=ALPHA)
        raw = [r["p_value_raw"] for r in adjusted]
        any_single.append(any(p < ALPHA for p in raw))
        any_family.append(any(r["verdict"] == REPRODUCED for r in adjusted))
        assert all(r["family_size"] == 3 and r["p_value"] >= r["p_value_raw"] for r in adjusted)
    assert np.mean(any_single) > 0.08
    assert np.mean(any_family) <= ALPHA_BOUND


def test_decide_family_leaves_untestable_claims_out_and_recomputes_verdicts():
    arm, baseline = simulate(5, [5.0, 0.0], seed=14, experiments=1)[0]
    one_unit = {(0, f): 9.0 for f in range(3)}
    family = decide_family([
        {"arm": arm, "baseline": baseline, "direction": "better"},
        {"arm": one_unit, "baseline": baseline, "direction": "better"},  # INSUFFICIENT: no p-value
        {"arm": baseline, "baseline": arm, "direction": "not_better"},  # no margin: no reproduction p-value
        {"arm": arm, "baseline": baseline, "direction": "better", "learned": False},
    ])
    assert [r["verdict"] for r in family][1:] == [INSUFFICIENT, NOT_REPRODUCED, NO_SIGNAL]
    assert family[0]["family_size"] == 2
    alone = decide(arm, baseline, "better")
    assert family[0]["p_value"] == pytest.approx(min(1.0, 2 * alone["p_value"]))
    assert family[0]["verdict"] == (REPRODUCED if family[0]["p_value"] < ALPHA else NOT_REPRODUCED)
    json.dumps(family, allow_nan=False)  # goes into results.json as it is


# ----------------------------------------------------------------------------------------------- the harness's keys
def test_no_signal_when_neither_arm_learned():
    runs = {(u, f): 0.7 + 0.05 * u + 0.004 * (u % 2) + 0.001 * f for u in (1, 2, 3) for f in (1, 2, 3)}
    base = {(u, f): 0.6 + 0.05 * u + 0.002 * f for u in (1, 2, 3) for f in (1, 2, 3)}
    result = decide(runs, base, "better")
    assert result["verdict"] == REPRODUCED and result["paired"] and result["units"] == {"arm": 3, "baseline": 3}
    assert result["estimate"] == pytest.approx(0.1 - 0.002 + 0.004 * 2 / 3)
    assert decide(runs, base, "better", learned=False)["verdict"] == NO_SIGNAL
    with pytest.raises(TypeError, match="unit_seed"):
        decide({"seed-1": 0.5}, base, "better")


@pytest.mark.parametrize("paired", [True, False])
def test_units_without_spread_get_the_exact_permutation_p_and_no_mdd(paired):
    """Scores of a few hundred rows are discrete: every unit can differ by the same amount (or not at all). The t
    statistic is then infinite or 0/0; the exact permutation test gives 2^-n (paired) or 1/C(2n, n), and no MDD."""
    def arms(difference, n):
        arm = {(u, 1): 0.75 + 0.01 * u * paired + difference for u in range(1, n + 1)}
        base = {(u if paired else u + 100, 1): 0.75 + 0.01 * u * paired for u in range(1, n + 1)}
        return arm, base

    three = decide(*arms(0.002, 3), "better")
    assert three["verdict"] == NOT_REPRODUCED and three["mdd"] is None and "permutation" in three["test"]
    assert three["p_value"] == pytest.approx(1 / 8 if paired else 1 / math.comb(6, 3))
    assert three["estimate"] == pytest.approx(0.002) and three["low"] == pytest.approx(three["high"])
    worse = decide(*arms(-0.002, 3), "better")
    assert worse["p_value"] == 1.0 and worse["p_opposite"] == pytest.approx(three["p_value"])
    assert decide(*arms(0.0, 3), "better")["p_value"] == decide(*arms(0.0, 3), "better")["p_opposite"] == 1.0
    five = decide(*arms(0.002, 5), "better")  # 1/32 or 1/252: all five agree, which a permutation test can trust
    assert five["verdict"] == REPRODUCED and five["p_value"] == pytest.approx(1 / 32 if paired else 1 / 252)
    no_better = decide(*arms(0.0, 5), "not_better", margin=0.01)  # the same scores: said so, p as before
    assert no_better["verdict"] == INDISTINGUISHABLE and no_better["p_value"] == pytest.approx(five["p_value"])


# --------------------------------------------------------------- the rules of floors, controls and unit intervals
def test_mean_interval_is_the_t_interval_of_unit_means_and_covers_95_percent():
    mean, low, high = mean_interval([0.56, 0.58, 0.57])
    half = 4.302653 * 0.01 / math.sqrt(3)  # t_0.975 with 2 df times the standard error
    assert mean == pytest.approx(0.57) and (low, high) == pytest.approx((0.57 - half, 0.57 + half))
    assert mean_interval([0.5]) == (0.5, None, None) and mean_interval([0.6] * 3) == (0.6, 0.6, 0.6)
    rng = np.random.default_rng(30)
    covered = [low <= 0 <= high for low, high in (mean_interval(rng.normal(0, 1, 3))[1:] for _ in range(4000))]
    assert abs(np.mean(covered) - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / 4000)  # not the range's 75% over 3 units


def test_a_family_reports_its_mdd_at_holms_first_step_and_that_difference_is_found_80_percent_of_the_time():
    """Three secondary claims, one true at the MDD the family reports (at alpha / 3), two null: Holm finds it at
    least 80% of the time (each adjusted p is at most 3 times its raw one). At the unadjusted alpha's MDD, the
    former report's, it is found well under 80% of the time."""
    n, sd = 5, math.sqrt(2) * UNIT_MEAN_SD  # SD of a paired difference of unit means
    adjusted, unadjusted = (minimum_detectable_difference(n, sd, alpha) for alpha in (ALPHA / 3, ALPHA))
    assert adjusted > unadjusted
    found = {}
    for name, shift in (("adjusted", adjusted), ("unadjusted", unadjusted)):
        hits = []
        for arms in simulate(n, [shift, 0.0, 0.0, 0.0], seed=31 if name == "adjusted" else 32, experiments=1000):
            family = decide_family([{"arm": arms[i], "baseline": arms[3], "direction": "better"} for i in range(3)])
            hits.append(family[0]["verdict"] == REPRODUCED)
            r = family[0]
            assert r["mdd_alpha"] == pytest.approx(ALPHA / 3) and r["family_size"] == 3
            assert r["mdd"] == pytest.approx(minimum_detectable_difference(n, r["unit_sd"], ALPHA / 3))
        found[name] = np.mean(hits)
    assert found["adjusted"] >= 0.8 - 3 * math.sqrt(0.8 * 0.2 / 1000)
    assert found["unadjusted"] <= 0.7
    alone = decide(*simulate(3, [0.0, 0.0], seed=33, experiments=1)[0], "better")
    assert alone["mdd_alpha"] == ALPHA and alone["mdd"] == pytest.approx(minimum_detectable_difference(
        3, alone["unit_sd"], ALPHA))


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "welch"])
def test_identical_arms_read_indistinguishable_and_arms_that_differ_anywhere_never_do(paired):
    """Scores of a few hundred rows are discrete; two arms whose models barely differ can score the same on every
    unit. That reads "indistinguishable" in either direction of claim (never "not reproduced", which would suggest a
    difference below resolution), after the gates; arms that differ on any unit never read it."""
    indistinguishable = 0
    for arm, _ in simulate(3, [0.0, 0.0], seed=34, experiments=200, paired=paired):
        units = {u: round(float(np.mean([v for (w, _), v in arm.items() if w == u])), 3) for u, _ in arm}
        same = {(u, 0): (units[u] if paired else 0.5) for u in units}
        copy = {((u if paired else u + 50), 0): v for (u, _), v in same.items()}
        for direction, margin in (("better", None), ("not_better", 0.01)):
            r = decide(same, copy, direction, margin=margin)
            indistinguishable += r["verdict"] == INDISTINGUISHABLE and r["identical"]
        assert decide(same, copy, "better", learned=False)["verdict"] == NO_SIGNAL
        assert decide(same, copy, "better", control=False)["verdict"] == NO_CONTROL
        shifted = dict(copy)
        key = next(iter(shifted))
        shifted[key] += 0.002  # one unit, one evaluation row of 500
        assert decide(same, shifted, "better")["verdict"] != INDISTINGUISHABLE
    assert indistinguishable == 400
    differing = decide_all(simulate(3, [0.0, 0.0], seed=35, experiments=500, paired=paired), direction="better")
    assert not any(r["verdict"] == INDISTINGUISHABLE for r in differing)
    # an indistinguishable claim stays in its family: a gate never makes the family smaller
    arm, baseline = simulate(3, [5.0, 0.0], seed=36, experiments=1)[0]
    family = decide_family([{"arm": arm, "baseline": baseline, "direction": "better"},
                            {"arm": {(0, 0): 0.7, (1, 0): 0.7}, "baseline": {(0, 0): 0.7, (1, 0): 0.7},
                             "direction": "better"}])
    assert family[1]["verdict"] == INDISTINGUISHABLE and family[0]["family_size"] == 2


def test_an_arm_at_its_floor_clears_it_at_most_2_5_percent_of_the_time():
    for n_units in (2, 3, 5):
        arms = simulate(n_units, [0.0], seed=40 + n_units)
        cleared = [clears_floor(a[0], 0.0) for a in arms]
        assert np.mean(cleared) <= 0.025 + 3 * math.sqrt(0.025 * 0.975 / EXPERIMENTS)
        lower = [clears_floor({k: -v for k, v in a[0].items()}, 0.0, higher_is_better=False) for a in arms]
        assert np.mean(lower) <= 0.025 + 3 * math.sqrt(0.025 * 0.975 / EXPERIMENTS)  # a loss at its unigram floor
    assert clears_floor({(1, 0): 0.9}, 0.5) is None and clears_floor({(1, 0): 0.9, (2, 0): 0.9}, None) is None


@pytest.mark.parametrize("n_units", [3, 5])
def test_no_signal_where_neither_arm_clears_its_floor(n_units):
    """Two arms at their floor (a bag-of-words model's score, say), one of them better by 3 unit SDs: the verdict
    reads "no signal" at least 85% of the time (each arm clears at most 2.5%; measured 90.0% and 91.3% at 3 and 5
    units), "reproduced" at most 5% and "opposite" at most its test's 5% (an arm shown worse reads opposite, floors or
    not). Arms well above their floors are never "no signal"; one arm above its floor is enough."""
    floor = 0.0
    at_floor = simulate(n_units, [floor, floor], seed=50 + n_units)
    verdicts = [decide(a, b, "better", learned=learned(a, b, floor))["verdict"] for a, b in at_floor]
    assert rate(verdicts, NO_SIGNAL) >= 0.85 and rate(verdicts, REPRODUCED) <= ALPHA_BOUND
    assert rate(verdicts, OPPOSITE) <= ALPHA_BOUND
    above = simulate(n_units, [floor + 6 * UNIT_SD, floor + 6 * UNIT_SD], seed=60 + n_units, experiments=500)
    assert all(decide(a, b, "better", learned=learned(a, b, floor))["verdict"] != NO_SIGNAL for a, b in above)
    one_above = simulate(n_units, [floor + 6 * UNIT_SD, floor], seed=70 + n_units, experiments=500)
    assert np.mean([learned(a, b, (floor, floor)) for a, b in one_above]) >= 0.95
    # each arm its own floor: the MiniLM arms of the zoo read 1,000 training rows, the encoders 2,000
    a, b = one_above[0]
    assert learned(a, b, (floor + 100, floor)) is False and learned(a, b, (None, None)) is True


def test_the_positive_control_gates_every_claim():
    """The control (pretrained > random) is decided alone at 5%; a claim is judged only on a task whose control is
    reproduced, else it reads "no signal: this budget does not detect pretraining", however large its difference.
    Where pretraining does nothing at this budget (pretrained = random) the control is reproduced at most 5% of the
    time, and so, at most, is any claim; where it clearly helps, claims are judged."""
    def experiment(pretraining_effect, claim_effect, seed):
        for arms in simulate(3, [claim_effect, 0.0, -pretraining_effect], seed=seed, experiments=500):
            controls = {"t": {"arm": arms[1], "baseline": arms[2], "direction": "better"}}
            claims = [{"task": "t", "primary": True, "arm": arms[0], "baseline": arms[1], "direction": "better"},
                      {"task": "t", "primary": False, "arm": arms[0], "baseline": arms[1], "direction": "better"}]
            yield decide_experiment(claims, controls)

    nothing = list(experiment(0.0, 10 * UNIT_SD, seed=80))
    controls = [c["t"]["verdict"] for c, _ in nothing]
    assert rate(controls, REPRODUCED) <= ALPHA_BOUND
    for control, claims in nothing:
        passed = control["t"]["verdict"] == REPRODUCED
        assert all((r["verdict"] == NO_CONTROL) == (not passed) and r["control"] is passed for r in claims)
    any_claim = [any(r["verdict"] == REPRODUCED for r in claims) for _, claims in experiment(0.0, 0.0, seed=81)]
    assert np.mean(any_claim) <= ALPHA_BOUND
    helps = list(experiment(10 * UNIT_SD, 10 * UNIT_SD, seed=82))
    assert rate([c["t"]["verdict"] for c, _ in helps], REPRODUCED) >= 0.95
    assert rate([claims[0]["verdict"] for c, claims in helps if c["t"]["verdict"] == REPRODUCED], REPRODUCED) >= 0.95
    # a task without a control result is not judged; an experiment without a control is not gated
    arm, baseline = simulate(3, [5.0, 0.0], seed=83, experiments=1)[0]
    claim = {"task": "t", "primary": True, "arm": arm, "baseline": baseline, "direction": "better"}
    control, [r] = decide_experiment([claim], {})
    assert control == {} and r["verdict"] == NO_CONTROL
    _, [r] = decide_experiment([claim])
    assert r["control"] is None and r["verdict"] == REPRODUCED


def test_the_primary_claim_is_tested_alone_and_the_secondary_ones_under_holm():
    arm, baseline = simulate(5, [2.0, 0.0], seed=90, experiments=1)[0]
    claims = [{"task": t, "primary": t == "a", "arm": arm, "baseline": baseline, "direction": "better"}
              for t in ("a", "b", "c", "d")]
    _, (primary, *secondary) = decide_experiment(claims)
    alone = decide(arm, baseline, "better")
    assert primary["p_value"] == alone["p_value"] and primary["family_size"] == 1 and primary["mdd_alpha"] == ALPHA
    assert all(r["family_size"] == 3 and r["p_value"] == pytest.approx(min(1, 3 * alone["p_value"]))
               and r["mdd_alpha"] == pytest.approx(ALPHA / 3) for r in secondary)
    assert VERDICT_ALPHA == ALPHA


def test_one_vocabulary_a_model_below_its_random_start_reads_opposite_floors_or_not():
    """Each verdict is one word of `VERDICT_WORDS` ("no signal" naming its gate in brackets); a pretrained arm
    significantly below its random start reads "opposite" whether or not either clears its floor (the teams `cpu`
    control, which read "no signal" before); a former report's phrasings read as the current words."""
    from encoder_zoo.repro.stats import (
        NO_ADAPTATION,
        VERDICT_WORDS,
        current_verdict,
        no_adaptation,
        verdict_key,
        verdict_word,
    )

    pretrained = {(u, 0): 0.02 + 0.01 * u + 0.001 * (u % 2) for u in (1, 2, 3)}
    random = {(u, 0): 0.14 + 0.01 * u for u in (1, 2, 3)}
    for floors_cleared in (True, False):
        assert decide(pretrained, random, "better", learned=floors_cleared)["verdict"] == OPPOSITE
    assert decide(random, pretrained, "better", learned=False)["verdict"] == NO_SIGNAL  # shown better: still gated
    assert decide(pretrained, random, "better", control=False)["verdict"] == NO_CONTROL
    for verdict in (REPRODUCED, NOT_REPRODUCED, OPPOSITE, INSUFFICIENT, NO_SIGNAL, NO_CONTROL, INDISTINGUISHABLE,
                    no_adaptation(OPPOSITE)):
        assert verdict_word(verdict) in VERDICT_WORDS
    assert no_adaptation(NO_SIGNAL) == NO_ADAPTATION + "no signal)"
    assert current_verdict("no signal: this budget does not detect pretraining") == NO_CONTROL
    assert current_verdict("no signal at this scale (neither arm clears the floor)") == NO_SIGNAL
    assert current_verdict("not reproduced at this scale") == NOT_REPRODUCED
    assert current_verdict("no signal: the adaptation control reads opposite") == no_adaptation(OPPOSITE)
    assert all(f"*{word}*" in verdict_key() for word in VERDICT_WORDS)
