"""The zoo table: every method trained by the same code, on the same data and budget, evaluated by the same harness,
with its compute next to every score.

    python repro/run.py zoo --budget smoke|cpu|adapt|gpu [--output_dir runs/repro]

Two stages of one sweep (`repro.jobs.Sweep`, same cache as the papers' experiments; `repro.run.run_zoo`):
1. the pretrained encoders (`zoo_encoders`: every method a paper's experiment pretrains under its plain recipe; today
   bert, spanbert, bert_2seq_nsp, teams, electra, cloze), each with its own recipe and warmup (the paper's run), and
   the two fusions over the embedded MiniLM (HIRE, BERTAC with the GAN CNN) as their papers' experiments train them;
   runs of the same flags and data that a paper's experiment already made are reused;
2. HIRE and BERTAC over the best encoder of stage 1 (highest mean over the GLUE-style tasks of the median over
   units): models no paper trained.
Every encoder, and every fusion over one, fine-tunes with one protocol (`PROTOCOL`); the fusions over MiniLM keep
their papers' presets. A positive control, bert's architecture at random initialisation fine-tuned alike, shows
whether the budget detects pretraining at all. Pairwise differences: `SIGNIFICANCE_RULE`, stated once here and
quoted by the report and README.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import asdict

from encoder_zoo.repro.budgets import BUDGETS
from encoder_zoo.repro.experiments import CNN_GAN, ZOO_TASKS, Arm, Experiment, all_experiments
from encoder_zoo.repro.results import chance_level, values
from encoder_zoo.repro.tasks import task_facts

BASELINE = "bert"


def zoo_encoders(budget: str | None = None) -> dict[str, str]:
    """Every method that a registered experiment (`all_experiments`, plugins included) pretrains under its plain recipe
    (an arm whose pretraining is `--model NAME` and nothing else), by `--model` name with its arm's description, in
    the experiments' order and the baseline first: found, not listed, so an experiment that pretrains a new method
    brings it into the zoo. `budget`: only the arms the experiments train at that budget (`Experiment.arms_at`)."""
    found: dict[str, str] = {}
    for experiment in all_experiments().values():
        for arm in experiment.arms_at(budget) if budget else experiment.arms:
            if arm.plain_recipe:
                found.setdefault(arm.recipe, arm.description)
    return {BASELINE: found.pop(BASELINE), **found}


def heldout_comparable(arm: Arm, task: str) -> bool:
    """Whether `arm`'s pretraining metric `task` (a held-out loss) is paired with other methods': its recipe declares
    that loss comparable (`Recipe.comparable_outputs`: a masked LM's own MLM loss, predicting the masked words with
    its own encoder; not ELECTRA's or TEAMS's, their generator's). The others are shown against their unigram floor, in
    no pair."""
    from encoder_zoo.training.recipes import get_recipe

    return arm.recipe is not None and task_facts(task).spec.logged_output in get_recipe(arm.recipe).comparable_outputs


PROTOCOL = "teams_small"  # ELECTRA/TEAMS-Small fine-tuning: the one preset made for small encoders trained from scratch


def zoo_experiment(best: str | None = None) -> Experiment:
    arms = [Arm(name, description, pretrain=("--model", name)) for name, description in zoo_encoders().items()]
    arms += [Arm("hire+minilm", "HIRE + fusion over the embedded MiniLM", init="hire", glue_preset="hire"),
             Arm("bertac+minilm", "BERTAC (GAN-style CNN + TIER) over the embedded MiniLM", init="bertac", cnn=CNN_GAN,
                 glue_preset="bertac")]
    if best:
        arms += [Arm(f"hire+{best}", f"HIRE + fusion over {best} (same unit)", init="hire", backbone_from=best),
                 Arm(f"bertac+{best}", f"BERTAC over {best} (same unit)", init="bertac", cnn=CNN_GAN,
                     backbone_from=best)]
    # At a continued-pretraining budget (`Experiment.adapted`: every encoder that can continue the shipped MiniLM, the
    # fusions over it, MiniLM itself and its random copy): the encoders the papers' experiments train there (the
    # two-segment recipe needs multi-sentence documents, which the task's text is not).
    fusions = [a.name for a in arms if a.init]
    continued = {name: (*zoo_encoders(name), *fusions) for name, budget in BUDGETS.items() if budget.init_from}
    return Experiment(
        name="zoo", paper="every method of the zoo on one budget", arms=tuple(arms), baseline=BASELINE, claims=(),
        tasks=ZOO_TASKS, glue_preset=PROTOCOL, paper_table="", shared_warmup=False,
        # 3 units at cpu: six encoders' pretrainings (the papers' units 1-3 reused) would not fit 5 units in a day;
        # at adapt: four continued encoders, MiniLM and six fusions (docs/reproduction.md, "The adapt zoo")
        budget_units={"cpu": (1, 2, 3), "adapt": (1, 2, 3)}, budget_arms=continued,
        notes=f"Encoders and the fusions over one fine-tune with one protocol (`--preset {PROTOCOL}`); the fusions "
              "over MiniLM with their papers' presets (`hire`, `bertac`), so that the papers' runs are reused.")


def best_encoder(sweep) -> str:
    """The encoder with the highest mean, over the GLUE-style tasks (fine-tuned by run_glue.py) it has results on, of
    its median over units."""
    from encoder_zoo.repro.stats import unit_means

    def score(name):
        medians = []
        for task in (t for t in sweep.tasks if task_facts(t).finetuned_by == "glue"):
            scores = values(sweep, name, task)
            if scores:
                medians.append(statistics.median(unit_means(scores).values()))
        return sum(medians) / len(medians) if medians else -math.inf

    return max(zoo_encoders(), key=score)  # ties: the first in zoo_encoders()


# ----------------------------------------------------------------------------------------------------- analysis
SIGNIFICANCE_RULE = (
    "Every pair of methods on each task (the positive control left out) is tested with `repro.stats.decide` on unit "
    "means, paired by unit seed: two-sided at 5% (the better-looking method tested one-sided at 2.5%), Holm across "
    "the pairs of the task. A pair counts as significant only where its Holm-adjusted two-sided p (`p`: twice the "
    "one-sided one) is below 5%, at least one of its two methods clears its floor (its 95% t interval wholly above "
    "it), and the two do not score the same on every unit. Its MDD is at the level Holm's first step uses, 2.5% over "
    "the task's pairs, one-sided. The positive control, bert pretrained against bert's architecture at random "
    "initialisation, is reported on its own line and gates no pair.")


def analyse_zoo(sweep, best: str, seed: int = 0) -> dict:
    """Every method's scores, floors and compute; the positive control; every pair of methods on each task under
    `SIGNIFICANCE_RULE`."""
    from encoder_zoo.repro.results import (
        arm_floors,
        control_results,
        describe_arms,
        floor_rows,
        prediction_difference,
        unit_compute,
    )
    from encoder_zoo.repro.stats import INDISTINGUISHABLE, REPRODUCED, decide_family, learned, unit_means

    chance = {task: chance_level(task, sweep.budget) for task in sweep.tasks}
    floors = arm_floors(sweep, chance)
    arms, runs = describe_arms(sweep, floors)
    for arm in sweep.arms:
        arms[arm.name]["compute"] = {str(u): unit_compute(sweep, arm, u) for u in sweep.units}
    methods = {a.name: a for a in sweep.arms if not a.random_init_of}
    pairs = []
    for task in sweep.tasks:
        metric = task_facts(task)
        # Every held-out loss is shown against its floor; only comparable ones are paired (`heldout_comparable`).
        names = [n for n, arm in methods.items() if task in arms[n]["tasks"]
                 and (not metric.pretraining_metric or heldout_comparable(arm, task))]
        family = []
        for a, b in itertools.combinations(names, 2):
            means = {n: sum(unit_means(runs[(n, task)]).values()) / arms[n]["tasks"][task]["n_units"] for n in (a, b)}
            better, worse = (a, b) if (means[a] >= means[b]) == metric.higher_is_better else (b, a)
            gate = learned(runs[(better, task)], runs[(worse, task)],
                           (floors[(better, task)]["value"], floors[(worse, task)]["value"]), metric.higher_is_better)
            family.append(({"task": task, "better": better, "worse": worse},
                           {"arm": runs[(better, task)], "baseline": runs[(worse, task)], "direction": "better",
                            "higher_is_better": metric.higher_is_better, "learned": gate}))
        for (entry, _), decision in zip(family, decide_family([f[1] for f in family], alpha=0.025)):
            decision["p_two_sided"] = None if decision["p_value"] is None else min(1.0, 2 * decision["p_value"])
            if decision["verdict"] == INDISTINGUISHABLE:
                decision["prediction_difference"] = prediction_difference(sweep, entry["better"], entry["worse"], task)
            pairs.append({**entry, "significant": decision["verdict"] == REPRODUCED, "decision": decision})
    adaptation = ({"adaptation_control": control_results(sweep, runs, floors, adaptation=True),
                   "tests_what": sweep.budget.tests_what} if sweep.experiment.adaptation_control else {})
    return {"experiment": "zoo", "budget": asdict(sweep.budget), "units": list(sweep.units), "tasks": list(sweep.tasks),
            "best_encoder": best, "protocol": PROTOCOL, "bootstrap_seed": seed, "chance": chance,
            "floors": floor_rows(sweep, chance), "control": control_results(sweep, runs, floors), **adaptation,
            "significance_rule": SIGNIFICANCE_RULE, "schedules": sweep.schedules, "arms": arms, "pairs": pairs}
