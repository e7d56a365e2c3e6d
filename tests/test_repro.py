"""`repro/`: the statistics on synthetic results with known answers, and every experiment's `smoke` budget end to end
through the real entry points (report structure, verdict logic, cache reuse, resume after a killed sweep)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from encoder_zoo.repro.budgets import BUDGETS
from encoder_zoo.repro.experiments import EXPERIMENTS
from encoder_zoo.repro.stats import (
    INDISTINGUISHABLE,
    INSUFFICIENT,
    NO_CONTROL,
    NO_SIGNAL,
    NOT_REPRODUCED,
    OPPOSITE,
    REPRODUCED,
    above_floor,
    decide_experiment,
)
from encoder_zoo.repro.tasks import task_facts

REPO = Path(__file__).resolve().parent.parent
# A HIRE cpu report from before the task rows were shuffled (commit cfeee7b), made at other cpu settings than now.
OLD_HIRE_REPORT = REPO / "tests" / "fixtures" / "repro" / "hire_cpu_before_the_shuffle.json"
VERDICTS = {REPRODUCED, NOT_REPRODUCED, OPPOSITE, INSUFFICIENT, NO_SIGNAL, NO_CONTROL, INDISTINGUISHABLE}


def env():
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


# ---------------------------------------------------------------------------------------------------- statistics
def test_above_floor_reads_the_metrics_direction():
    assert above_floor(0.60, 0.64, floor=0.572) and not above_floor(0.55, 0.60, floor=0.572)
    assert above_floor(2.0, 2.5, floor=3.0, higher_is_better=False) and above_floor(0.1, 0.2, floor=None) is None
    assert above_floor(None, None, floor=0.5) is None  # one unit: no interval


def test_chance_is_one_constant_answer_on_the_scored_rows():
    from encoder_zoo.glue.tasks import first_samples, load_task, majority_class_accuracy
    from encoder_zoo.repro.results import chance_level

    assert majority_class_accuracy([1, 0, 0, 0]) == 0.75 and majority_class_accuracy([2, 1]) == 0.5
    budget = BUDGETS["cpu"]
    spec, raw = load_task("rotten_tomatoes")
    scored = first_samples(raw, spec, budget.max_train_samples, budget.max_eval_samples)["validation"]["label"]
    chance = chance_level("rotten_tomatoes", budget)
    assert chance == max(np.mean(scored), 1 - np.mean(scored)) and len(scored) == budget.max_eval_samples
    assert chance_level("movie_sentiment_regression", budget) == 0.0 and chance_level("wiki_cloze", budget) is None


def test_cpu_budget_fine_tunes_every_arm_of_a_comparison_alike(tmp_path):
    """The sweep's own tiny pretrained models, and their positive control, fine-tune for the budget's 3 epochs at its
    3e-4 (the presets' 1e-4 leaves a random initialisation at the label prior: repro/reports/tuning); arms over the
    offline MiniLM for the budget's 2 epochs at its 1e-4, every arm alike (the papers' 1e-5 left them all at the
    majority class); the rest of each preset (TEAMS's Adam betas, HIRE's beta2) stays."""
    from encoder_zoo.glue.run_glue import parse_args
    from encoder_zoo.repro.jobs import Sweep

    def glue_args(experiment, arm):
        job = next(j for j in Sweep(EXPERIMENTS[experiment].at(BUDGETS["cpu"]), tmp_path).jobs
                   if j.kind == "finetune" and j.arm == arm and "run_glue.py" in j.command[1])
        return parse_args(job.command[2:])[1]

    own = [glue_args("teams", "electra"), glue_args("teams", "teams"), glue_args("teams", "electra_random"),
           glue_args("cloze", "cloze")]
    assert {(a.num_train_epochs, a.learning_rate) for a in own} == {(3, 3e-4)}
    minilm_arms = [glue_args("hire", "hire"), glue_args("hire", "backbone"), glue_args("bertac", "gan_cnn"),
                   glue_args("bertac", "backbone")]
    assert {(a.num_train_epochs, a.learning_rate) for a in minilm_arms} == {(2, BUDGETS["cpu"].minilm_learning_rate)}
    assert glue_args("hire", "hire").adam_beta2 == 0.98
    smoke = next(j for j in Sweep(EXPERIMENTS["bertac"].at(BUDGETS["smoke"]), tmp_path).jobs
                 if j.kind == "finetune" and j.arm == "gan_cnn")
    # the preset's (the paper's) where the budget sets none
    assert parse_args(smoke.command[2:])[1].learning_rate == 1e-5


def sweep_jobs(experiment, budget="cpu", tmp_path=Path("/nonexistent")):
    from encoder_zoo.repro.jobs import Sweep

    return Sweep(EXPERIMENTS[experiment].at(BUDGETS[budget]), tmp_path).jobs


def flag(command, name):
    return command[command.index(name) + 1] if name in command else None


@pytest.mark.parametrize("experiment", sorted(EXPERIMENTS))
def test_every_arm_trains_one_model_per_unit_seed_and_no_run_counts_in_two_arms(experiment, tmp_path):
    """Units are independently trained models: one pretraining (or init, or CNN pretraining) per arm and unit seed,
    with that seed; fine-tuning seeds differ across units (so a fixed backbone's units are different models) and are
    shared by the arms' units of one seed (so they pair); no pretraining, init or fine-tuning serves two arms."""
    from encoder_zoo.repro.jobs import FLOOR_ARM

    budget = BUDGETS["cpu"]
    assert len(budget.unit_seeds) >= 3 and len(BUDGETS["gpu"].unit_seeds) >= 3
    units = list(EXPERIMENTS[experiment].units_at(budget))
    jobs = sweep_jobs(experiment, tmp_path=tmp_path)
    assert {j.arm for j in jobs} == {a.name for a in EXPERIMENTS[experiment].arms_at("cpu")} | {FLOOR_ARM}
    for arm in EXPERIMENTS[experiment].arms_at("cpu"):
        mine = [j for j in jobs if j.arm == arm.name]
        for kind in ("pretrain", "init", "random_init"):
            seeds = sorted({int(flag(j.command, "--seed")) for j in mine if j.kind == kind})
            assert seeds in ([], units), (arm.name, kind, seeds)
        finetuned = sorted(s for j in mine if j.kind == "finetune" and "run_glue.py" in j.command[1] for s in j.seeds)
        tasks = [t for t in EXPERIMENTS[experiment].tasks_at("cpu") if t in budget.tasks and t in ("rotten_tomatoes",
                                                                                                    "movie_sentiment_regression")]
        assert finetuned == sorted(budget.finetune_seed(u, f) for u in units for f in budget.finetune_seeds
                                   for _ in tasks)
    folders = [j.folder for j in jobs if j.kind in ("init", "random_init", "finetune", "predict")] + [
        j.folder for j in jobs
        if j.kind == "pretrain" and "--cnn" not in " ".join(j.command) and "bertac_cnn" not in j.command]
    assert len(folders) == len(set(folders))


def test_every_pretrained_arm_of_a_comparison_warms_up_for_the_same_steps(tmp_path):
    """Each recipe's own rule gives TEAMS 40 and ELECTRA 20 warmup steps at 2,000 steps: the sweep passes the
    schedule arm's to every arm, and every schedule shape of one experiment is the same."""
    from encoder_zoo.training.recipes import get_recipe

    for name, experiment in EXPERIMENTS.items():
        pretrain = [j for j in sweep_jobs(name, tmp_path=tmp_path)
                    if j.kind == "pretrain" and "bertac_cnn" not in j.command]
        warmups = {flag(j.command, "--warmup_steps") for j in pretrain}
        assert len(warmups) <= 1, (name, warmups)
        shapes = {get_recipe(flag(j.command, "--model")).training_defaults["tiny"].lr_scheduler_type for j in pretrain}
        assert len(shapes) <= 1, (name, shapes)
    teams = [j for j in sweep_jobs("teams", tmp_path=tmp_path) if j.kind == "pretrain"]
    assert {flag(j.command, "--warmup_steps") for j in teams} == {"200"}  # tiny's 5% of the cpu budget's 4,000


def test_a_budget_may_train_fewer_arms_and_the_report_lists_the_claims_left_untested(tmp_path, monkeypatch):
    """cloze at `cpu` trains cloze and bilm only (nine two-tower pretrainings exceed 2 hours): its one claim between
    them is decided, the claim on cloze + bilm is listed as untested, and no run of that arm is made."""
    import dataclasses

    from encoder_zoo.repro.jobs import Sweep
    from encoder_zoo.repro.report import write_report
    from encoder_zoo.repro.results import analyse
    from encoder_zoo.repro.summary import table

    experiment = EXPERIMENTS["cloze"]
    assert [a.name for a in experiment.arms_at("smoke")] == [*(a.name for a in experiment.arms), "bilm_random"]
    sweep = Sweep(experiment.at(BUDGETS["cpu"]), tmp_path)
    assert {j.arm for j in sweep.jobs} == {"cloze", "bilm", "bilm_random", "floors"}
    assert sweep.tasks == ["rotten_tomatoes", "movie_sentiment_regression", "heldout_cloze", "heldout_bilm"]

    def execute(job):
        for output in job.outputs:
            output.parent.mkdir(parents=True, exist_ok=True)
            value = 0.6 + 0.01 * len(job.arm) + 0.001 * sum(job.seeds)
            output.write_text(json.dumps({"accuracy": value, "pearson": value}))
        return "done"

    monkeypatch.setattr(sweep, "execute", execute)
    sweep.run(tmp_path / "cache" / "runs.jsonl")
    results = analyse(sweep, 0)
    assert {(c["arm"], c["baseline"]) for c in results["claims"]} == {("cloze", "bilm")}
    assert all("decision" in c for c in results["claims"]) and set(results["arms"]) == {"cloze", "bilm", "bilm_random"}
    untested = next(c for c in experiment.claims if c.arm == "cloze_bilm")
    assert results["untested_claims"] == [dataclasses.asdict(untested)]
    write_report(results, sweep, tmp_path / "report", ["cloze", "--budget", "cpu"])
    assert untested.source in (tmp_path / "report" / "report.md").read_text()
    (tmp_path / "reports" / "cloze" / "cpu").mkdir(parents=True)
    (tmp_path / "reports" / "cloze" / "cpu" / "results.json").write_text(json.dumps(results))
    rows = [r for r in table("cpu", tmp_path / "reports").splitlines() if r.startswith("| ")][2:]
    # README: the control on the primary's task, the primary, the other claims counted (the untested one included)
    assert len(rows) == 3 and "bilm > bilm_random (positive control) | movie_sentiment_regression" in rows[0]
    assert "cloze > bilm (primary) | movie_sentiment_regression Pearson" in rows[1]
    assert "secondary claims (Holm): 1 tested (" in rows[2] and "1 not tested here" in rows[2]


def leave_outputs(job, scores: dict, predictions: dict | None = None, flops: dict | None = None, floor: float = 0.6):
    """What each kind of job leaves, standing in for the real scripts: a fine-tuning `scores[(arm, unit)]`; its
    predictions `predictions[(arm, unit)]` (100 rows); a floor `floor`; a pretraining `flops[arm]` FLOPs over 1,000
    tokens; a random copy its marker."""
    from encoder_zoo.repro.random_init import MARKER

    for output in job.outputs:
        output.parent.mkdir(parents=True, exist_ok=True)
    unit = int(job.name.split("unit ")[1].split()[0]) if "unit " in job.name else None
    if job.kind == "finetune":
        for output in job.outputs:
            output.write_text(json.dumps({"accuracy": scores[(job.arm, unit)]}))
    elif job.kind == "predict":  # one file per fine-tuning seed, 100 unit + seed
        for output in job.outputs:
            seed_unit = int(output.stem.split("-")[1]) // 100
            output.write_text(json.dumps({"predictions": (predictions or {}).get((job.arm, seed_unit), [1] * 100)}))
    elif job.kind == "floor":
        job.outputs[0].write_text(json.dumps({"kind": "bag_of_words", "value": floor, "train_rows": 32,
                                              "description": "stands in"}))
    elif job.kind == "pretrain":
        for output in job.outputs:
            output.write_text("{}")
        (job.folder / "trainer_state.json").write_text(json.dumps({
            "total_flos": (flops or {}).get(job.arm, 1e12), "num_input_tokens_seen": 1000, "global_step": 10,
            "train_batch_size": 4, "log_history": []}))
    elif job.kind == "random_init":
        job.outputs[0].write_text(json.dumps({"seed": 1}))
        assert job.outputs[0].name == MARKER
    return "done"


def test_a_report_gives_floors_the_control_the_primary_and_reads_identical_arms_as_indistinguishable(tmp_path):
    """teams with 3 units, standing-in runs. The control, electra > electra at random initialisation, is reproduced:
    the primary claim is then judged, and TEAMS, scoring what ELECTRA scores on every unit, reads
    indistinguishable with the share of rows their predictions differ on; the row gives the FLOPs ratio, 1.47x.
    With a control that is not reproduced, the same large difference reads 'no signal: this budget does not
    detect pretraining'."""
    from encoder_zoo.repro.jobs import Sweep
    from encoder_zoo.repro.report import write_report
    from encoder_zoo.repro.results import analyse

    def run(folder, scores):
        sweep = Sweep(EXPERIMENTS["teams"].at(BUDGETS["smoke"], tasks=["rotten_tomatoes"], units=(1, 2, 3)), folder)
        differ = {("teams", u): [1] * 95 + [0] * 5 for u in (1, 2, 3)}  # 5 of 100 rows answered otherwise
        sweep.execute = lambda job: leave_outputs(job, scores, differ, {"teams": 2.51e13, "electra": 1.71e13})
        sweep.run(folder / "cache" / "runs.jsonl")
        results = analyse(sweep)
        write_report(results, sweep, folder / "report", ["teams", "--budget", "smoke"])
        return results, (folder / "report" / "report.md").read_text()

    electra = {("electra", u): 0.75 + 0.01 * u + 0.002 * u * u for u in (1, 2, 3)}
    random = {("electra_random", u): 0.55 + 0.004 * (u % 2) for u in (1, 2, 3)}
    same = {("teams", u): electra[("electra", u)] for u in (1, 2, 3)}
    results, report = run(tmp_path / "a", {**electra, **random, **same})
    control = results["control"]["rotten_tomatoes"]
    assert control["verdict"] == REPRODUCED and (control["arm"], control["baseline"]) == ("electra", "electra_random")
    assert results["arms"]["electra_random"]["compute"]["1"]["flops"] == 0
    [claim] = results["claims"]
    assert claim["role"] == "secondary" and claim["control"] is True  # the primary is on wiki_cloze, not run here
    assert results["primary"] == {**results["primary"], "tested": False,
                                  "why_not": "wiki_cloze is not evaluated at this budget"}
    assert claim["verdict"] == INDISTINGUISHABLE and claim["flops_ratio"] == pytest.approx(2.51 / 1.71)
    assert claim["decision"]["prediction_difference"] == {"fraction": 0.05, "rows": 300, "pairs": 3}
    assert "predictions differ on 5.0% of 300 evaluation rows (3 paired runs)" in report
    assert "| 1.47x |" in report and "at equal pretraining steps, batch and data, not equal FLOPs" in report
    assert "**Primary claim:** teams > electra on wiki_cloze (SQuAD 1.1-style) F1" in report
    assert "| floor: bag-of-words (32 training rows) | 60 |" in report  # percent points, as every score
    assert "| electra_random | 55.27 [54.69, 55.84] (3)* |" in report  # under its floor
    assert ("- **pretrained > random** on rotten_tomatoes accuracy (electra > electra_random): difference 22.7 ["
            in report)

    no_detection = {("electra_random", u): electra[("electra", u)] + (0.01 if u == 2 else -0.005) for u in (1, 2, 3)}
    better = {("teams", u): 0.95 + 0.001 * u for u in (1, 2, 3)}
    results, report = run(tmp_path / "b", {**electra, **no_detection, **better})
    assert results["control"]["rotten_tomatoes"]["verdict"] == NOT_REPRODUCED
    assert results["claims"][0]["verdict"] == NO_CONTROL and results["claims"][0]["decision"]["estimate"] > 0.1
    assert f"**{NO_CONTROL}**" in report


def test_reports_and_readme_show_every_score_in_percent_points_and_the_loss_in_nats(tmp_path):
    """One scale: results.json keeps what the scripts store (accuracy 0-1, QA F1 0-100, the loss in nats);
    a report's scores, floors, differences and MDDs, the paper's numbers beside them, and README's rows show percent
    points, as GLUE and SQuAD print them: an accuracy of 0.5312 reads 53.12, an F1 of 25.5 stays 25.5, a held-out
    loss of 6.5 nats stays 6.5."""
    from encoder_zoo.repro.jobs import Sweep
    from encoder_zoo.repro.report import score_table, table_key, write_report
    from encoder_zoo.repro.results import analyse
    from encoder_zoo.repro.summary import DIFFERENCE_KEY, table

    # over bert (and the other arms): 0.5012 accuracy, 25 F1; units spread apart so that differences have an MDD
    offset, spread = {"spanbert": 0.03, "bert_random": -0.1}, {"spanbert": 0.003}

    def execute(job):
        if job.kind != "finetune":
            leave_outputs(job, {})
        unit = int(job.name.split("unit ")[1].split()[0]) if "unit " in job.name else None
        if job.kind == "finetune":
            for output in job.outputs:
                extra = offset.get(job.arm, 0.0) + spread.get(job.arm, 0.001) * (unit - 2)
                output.write_text(json.dumps({"accuracy": 0.5012 + extra, "f1": 25.0 + 10 * extra}))
        elif job.kind == "pretrain":  # a held-out loss of 6.5 nats (spanbert) or 6.6
            seed = int(job.name.rsplit("seed ", 1)[1])
            loss = (6.5 if job.arm == "spanbert" else 6.6) + 0.01 * (seed - 2)
            (job.folder / "trainer_state.json").write_text(json.dumps({
                "total_flos": 1e12, "num_input_tokens_seen": 1000, "global_step": 10, "train_batch_size": 4,
                "log_history": [{"eval_mlm_loss": loss - 0.3, "eval_mlm_masked_loss": loss}]}))
        elif job.kind == "floor":
            kind = job.command[2]
            job.outputs[0].write_text(json.dumps({
                "kind": kind, "value": {"bag_of_words": 0.45, "trivial_answer": 10.0, "unigram": 7.5}[kind],
                "train_rows": 32, "description": "stands in",
                **({"bigram": {"value": 4.4, "description": "stands in too"}} if kind == "unigram" else {})}))
        return "done"

    tasks = ["rotten_tomatoes", "wiki_cloze", "heldout_mlm_masked"]
    sweep = Sweep(EXPERIMENTS["spanbert"].at(BUDGETS["smoke"], tasks=tasks, units=(1, 2, 3)), tmp_path)
    sweep.execute = execute
    sweep.run(tmp_path / "cache" / "runs.jsonl")
    results = analyse(sweep)
    write_report(results, sweep, tmp_path / "report", ["spanbert", "--budget", "smoke"])
    report = (tmp_path / "report" / "report.md").read_text()
    stored = json.loads((tmp_path / "report" / "results.json").read_text())["arms"]["spanbert"]["tasks"]
    assert stored["rotten_tomatoes"]["mean"] == pytest.approx(0.5312) and stored["wiki_cloze"]["mean"] == 25.3
    assert stored["heldout_mlm_masked"]["mean"] == pytest.approx(6.5)  # stored as the scripts wrote them

    ours = report.split("## Ours")[1].split("## Verdicts")[0]
    rows = {line.split(" | ")[0][2:]: line for line in ours.splitlines() if line.startswith("| ")}
    assert ours.count("| arm | wiki_cloze (SQuAD 1.1-style) F1 | rotten_tomatoes accuracy | held-out MLM loss at "
                      "[MASK] targets only, nats")
    f1, accuracy, loss = (stored[task] for task in ("wiki_cloze", "rotten_tomatoes", "heldout_mlm_masked"))
    assert rows["spanbert"] == (f"| spanbert | 25.3 [{f1['low']:.4g}, {f1['high']:.4g}] (3) | 53.12 "
                                f"[{accuracy['low'] * 100:.4g}, {accuracy['high'] * 100:.4g}] (3)* | 6.5 "
                                f"[{loss['low']:.4g}, {loss['high']:.4g}] (3) |")  # F1 and the loss as stored
    assert rows["bert (baseline)"].startswith("| bert (baseline) | 25 [24.98, 25.02] (3) | 50.12 [49.87, 50.37] (3)")
    assert rows["floor: chance (one constant answer)"] == "| floor: chance (one constant answer) | — | 56.25 | — |"
    assert "| floor: bag-of-words (32 training rows) | — | 45 | — |" in ours  # 0.45 accuracy
    assert "| floor: trivial answer | 10 | — | — |" in ours
    assert "| floor: unigram loss (same tokenizer and documents) | — | — | 7.5 |" in ours
    assert ("| floor: bigram loss from both neighbours (same tokenizer and documents; shown, not gated) | — | — | 4.4 |"
            in ours)  # beside the unigram floor; the arms' * still reads against the unigram one
    claim = next(c for c in results["claims"] if (c["arm"], c["baseline"], c["task"]) ==
                 ("spanbert", "bert", "rotten_tomatoes"))
    d = claim["decision"]
    assert d["estimate"] == pytest.approx(0.03)  # computed on the stored scale
    assert "| role | claim | task | difference, points [90% CI] | units |" in report
    row = next(r for r in report.splitlines() if "| spanbert > bert (" in r and "rotten_tomatoes accuracy" in r)
    assert d["mdd"] < 0.2 and f" | 3.00 [{d['low'] * 100:.2f}, {d['high'] * 100:.2f}] | " in row  # 3 digits
    assert f" | {d['mdd'] * 100:.3g} (α " in row and f"{d['mdd']:.3g}" not in row
    qa = next(c["decision"] for c in results["claims"] if (c["arm"], c["baseline"], c["task"]) ==
              ("spanbert", "bert", "wiki_cloze"))
    assert qa["estimate"] == pytest.approx(0.3)  # F1 points, shown as they are
    assert "on rotten_tomatoes accuracy (bert > bert_random): difference 10.0 [" in report
    # the paper's numbers, in points, beside ours on the same scale
    paper = report.split("## The paper's numbers")[1].split("## Ours")[0]
    assert "SpanBERT 94.6" in paper and "ours below are on the same scale" in paper
    assert "in percent points" in ours.split("| arm |")[0]

    (tmp_path / "reports" / "spanbert" / "smoke").mkdir(parents=True)
    (tmp_path / "reports" / "spanbert" / "smoke" / "results.json").write_text(json.dumps(results))
    readme = table("smoke", tmp_path / "reports")
    assert readme.startswith("| paper | claim | task | difference, points [90% CI] | units | MDD | verdict |")
    # README: per paper the control on the primary's task, the primary, and the secondary claims counted
    [row] = [r for r in readme.splitlines() if "| spanbert > bert (primary) |" in r]
    assert f" | {qa['estimate']:.3f} [" in row and "wiki_cloze" in row  # F1 not multiplied, 3 significant digits
    assert [r for r in readme.splitlines() if "| bert > bert_random (positive control) | wiki_cloze" in r]
    secondary = [c for c in results["claims"] if c["role"] == "secondary"]
    assert f"| secondary claims (Holm): {len(secondary)} tested (" in readme and "rotten_tomatoes" not in readme
    assert "in the report |" in readme
    assert DIFFERENCE_KEY in readme and "nats" in DIFFERENCE_KEY
    zoo = {"tasks": tasks, "chance": results["chance"], "floors": results["floors"],
           "arms": {"spanbert": {**results["arms"]["spanbert"], "compute": {}}}}
    cells = rows["spanbert"][:-2].split(" | ")  # README's zoo table: the report's cells, task by task
    assert score_table(zoo)[2] == "| spanbert | " + " | ".join(cells[i] for i in (2, 1, 3)) + " | — | — | — | — |"
    assert "held-out token-prediction losses (MLM, cloze, bilm) in nats" in table_key(zoo)
    assert "percent points" in table_key(zoo)


@pytest.mark.parametrize("experiment", sorted(EXPERIMENTS))
def test_the_positive_control_fine_tunes_a_random_copy_of_its_sources_model_exactly_as_its_source(experiment,
                                                                                                tmp_path):
    """Each experiment's control re-creates, per unit, the model its source arm (the baseline) fine-tunes (an
    export, a fusion's init, the MiniLM) at random initialisation with the unit's seed, and fine-tunes it with the
    source's command but for the model; its pretraining costs nothing."""
    from encoder_zoo.repro.jobs import Sweep

    setting = EXPERIMENTS[experiment].at(BUDGETS["cpu"])
    sweep = Sweep(setting, tmp_path)
    control = EXPERIMENTS[experiment].control_arm()
    assert control.random_init_of == EXPERIMENTS[experiment].baseline and control in setting.arms
    source = [j for j in sweep.jobs if j.arm == control.random_init_of and j.kind == "finetune"]
    copies = [j for j in sweep.jobs if j.arm == control.name and j.kind == "finetune"]
    assert len(copies) == len(source) > 0
    for mine, theirs in zip(copies, source):
        [random_init] = [n for n in mine.needs if n.kind == "random_init"]
        model = flag(mine.command, "--model_name_or_path")
        assert model == str(random_init.folder / "model")
        assert flag(random_init.command, "--model") == flag(theirs.command, "--model_name_or_path")
        assert flag(random_init.command, "--seed") == mine.name.split("unit ")[1].split()[0]
        without_model = [c for c in mine.command if c != model and "/finetune/" not in c]
        assert without_model == [c for c in theirs.command if c != flag(theirs.command, "--model_name_or_path")
                                 and "/finetune/" not in c]
    assert sweep.pretraining[(control.name, setting.unit_seeds[0])] == []


def test_the_units_per_budget_are_an_experiments_own_where_it_sets_them(tmp_path):
    import dataclasses

    experiment = dataclasses.replace(EXPERIMENTS["teams"], budget_units={"cpu": (1, 2, 3, 4, 5)})
    assert experiment.at(BUDGETS["cpu"]).unit_seeds == (1, 2, 3, 4, 5)
    assert experiment.at(BUDGETS["smoke"]).unit_seeds == BUDGETS["smoke"].unit_seeds
    assert experiment.at(BUDGETS["cpu"], units=(7, 8)).unit_seeds == (7, 8)  # --units
    from encoder_zoo.repro.jobs import Sweep

    pretrainings = [j for j in Sweep(experiment.at(BUDGETS["cpu"]), tmp_path).jobs if j.kind == "pretrain"]
    assert sorted(int(flag(j.command, "--seed")) for j in pretrainings) == sorted([1, 2, 3, 4, 5] * 2)
    # at cpu 5 units where a pretraining takes under 10 minutes on a core, 3 for TEAMS and the two-tower model
    assert {n: len(e.units_at(BUDGETS["cpu"])) for n, e in EXPERIMENTS.items()} == {
        "spanbert": 5, "teams": 3, "cloze": 3, "hire": 5, "bertac": 5}


def test_every_paper_names_one_primary_claim_among_its_claims_and_tasks():
    for name, experiment in EXPERIMENTS.items():
        p = experiment.primary
        assert p is not None and p.source, name
        assert any((c.arm, c.baseline) == (p.arm, p.baseline) for c in experiment.claims_at("cpu")), name
        assert p.task in experiment.tasks_at("cpu") and p.task in BUDGETS["cpu"].tasks, name
        assert all(c.compares_at for c in experiment.claims), name
    teams = EXPERIMENTS["teams"].claims[0]
    assert "not equal FLOPs" in teams.compares_at and "compute" not in teams.source  # TEAMS runs 1.47x the FLOPs
    import dataclasses

    from encoder_zoo.repro.experiments import Primary

    with pytest.raises(ValueError, match="primary"):
        dataclasses.replace(EXPERIMENTS["teams"], primary=Primary("electra", "teams", "wiki_cloze", "x"))


def test_existing_jobs_keep_their_cache_keys():
    """A job's key is its flags, data and seeds, not the code: pinned (smoke budget) from before the tiny size got
    its own rate (which pretrain.py applies, not repro's flags), so a cache made before stays valid; the `cpu` keys
    changed with that budget's own flags (4,000 steps, 3 epochs at 3e-4). The keys of jobs that read another job's
    model changed once, when they stopped naming where the cache lies (`test_a_moved_cache_keeps_its_keys`)."""
    names = {str(j.folder.relative_to("/nonexistent/cache")) for j in sweep_jobs("teams", budget="smoke")}
    assert {"pretrain/teams-2d60aee767dc", "pretrain/electra-be225ca6dde3", "random/electra-20fd2a0c1c24",
            "finetune/teams-rotten_tomatoes-1683705f1fad", "finetune/electra-rotten_tomatoes-3e8e928d9e7b",
            "finetune/electra_random-rotten_tomatoes-3d6aa1098681", "predict/rotten_tomatoes-1aafcb7e1046"} <= names


@pytest.mark.parametrize("experiment", ["hire", "bertac"])
def test_a_moved_cache_keeps_its_keys(experiment, tmp_path, monkeypatch):
    """Keys name the cache's folders and the installed MiniLM, not where they lie: sweeps with other output folders
    (relative or absolute) and another machine's MiniLM name the same jobs, so a cache copied elsewhere or shared by
    two output folders is reused; the records of the models a job read are relative to its folder."""
    from encoder_zoo.repro.jobs import Job, Sweep
    from encoder_zoo.training import run

    def names(output_dir):
        jobs = Sweep(EXPERIMENTS[experiment].at(BUDGETS["smoke"]), output_dir).jobs
        assert any(j.kind in ("random_init", "init") for j in jobs)  # jobs whose keys name other jobs' models
        return {j.folder.relative_to(output_dir) for j in jobs}

    here = names(tmp_path / "a")
    monkeypatch.chdir(tmp_path)
    assert names(Path("relative") / "b") == here
    monkeypatch.setattr(run, "minilm_path", lambda: "/elsewhere/minilm")
    assert names(tmp_path / "c") == here
    job = Job("finetune", "arm", "a run", tmp_path / "cache" / "finetune" / "x", [], [],
              inputs=[tmp_path / "cache" / "pretrain" / "y" / "export"])
    assert job.input_name(job.inputs[0]) == "../../pretrain/y/export"


def test_floors_a_bag_of_words_model_on_the_same_rows_and_the_best_first_words_answer(tmp_path, monkeypatch):
    import datasets

    from encoder_zoo.qa import data as qa_data
    from encoder_zoo.repro import floors

    out = tmp_path / "floor.json"
    argv = ["bag_of_words", "--task", "rotten_tomatoes", "--max_train_samples", "300", "--max_eval_samples", "100",
            "--output", str(out)]
    floor = floors.main(argv)
    assert floor["train_rows"] == 300 and floor["eval_rows"] == 100 and floor["metric"] == "accuracy"
    assert 0.5 <= floor["value"] <= 1 and json.loads(out.read_text()) == floor and floors.main(argv) == floor
    regression = floors.main(["bag_of_words", "--task", "movie_sentiment_regression", "--max_train_samples", "300",
                              "--max_eval_samples", "100", "--output", str(out)])
    assert regression["metric"] == "pearson" and -1 <= regression["value"] <= 1
    # The model is glue/baselines.py's (run_glue.py prints it too): on a committed report's rows it scores what the
    # report recorded.
    committed = next(f for f in json.loads((REPO / "repro/reports/teams/cpu/results.json").read_text())["floors"][
        "movie_sentiment_regression"] if f["kind"] == "bag_of_words")
    again = floors.main(["bag_of_words", "--task", "movie_sentiment_regression", "--max_train_samples",
                         str(committed["rows"]), "--max_eval_samples", "500", "--output", str(out)])
    assert again["description"] == committed["description"] and again["value"] == pytest.approx(committed["value"],
                                                                                                  rel=1e-12)

    def rows(n, answer_first, unanswerable=0):
        records = []
        for i in range(n):
            context = f"Alpha{i} beta gamma delta. Epsilon zeta eta{i}."
            text = f"Alpha{i}" if answer_first else f"eta{i}"
            no = i < unanswerable
            records.append({"id": f"q{i}", "title": "t", "question": "who [who]?", "context": context,
                            "answers": {"text": [] if no else [text],
                                        "answer_start": [] if no else [context.index(text)]}})
        return datasets.Dataset.from_list(records)

    monkeypatch.setattr(qa_data, "load_qa", lambda name, *a, **k: datasets.DatasetDict(
        train=rows(40, True), validation=rows(10, name == "wiki_cloze", unanswerable=8 * (name != "wiki_cloze"))))
    v1 = floors.main(["trivial_answer", "--task", "wiki_cloze", "--max_eval_samples", "5", "--output", str(out)])
    assert v1["words"] == 1 and v1["value"] == pytest.approx(100.0) and v1["eval_rows"] == 5
    monkeypatch.setattr(qa_data, "load_qa", lambda name, *a, **k: datasets.DatasetDict(
        train=rows(40, True, unanswerable=30), validation=rows(10, True, unanswerable=8)))
    v2 = floors.main(["trivial_answer", "--task", "wiki_cloze_v2", "--output", str(out)])
    assert v2["words"] == 0 and v2["value"] == pytest.approx(80.0)  # no answer: right on 8 of 10
    with pytest.raises(SystemExit):
        floors.main(["unigram", "--output", str(out)])


def test_the_unigram_floor_is_below_the_uniform_loss_on_the_pretrainings_own_held_out_examples(tmp_path):
    import math

    from encoder_zoo.repro import floors
    from encoder_zoo.training import pretrain
    from encoder_zoo.training.data.tokenizer import train_wordpiece_tokenizer

    flags = ["--model", "bert", "--model_size", "tiny", "--max_documents", "60", "--validation_documents", "6",
             "--max_seq_length", "64", "--output_dir", str(tmp_path / "run")]
    args, training_args = pretrain.parse_args(flags)
    recipe, _ = pretrain.check_recipe_arguments(args)
    text = pretrain.read_training_text(recipe, args, training_args)
    tokenizer = train_wordpiece_tokenizer(text.train_docs["text"], vocab_size=400)
    tokenizer.save_pretrained(tmp_path / "export")
    floor = floors.unigram(str(tmp_path / "export"), flags)
    targets = len(tokenizer) - len(set(tokenizer.all_special_ids))
    assert 0 < floor["value"] < math.log(targets) and floor["eval_tokens"] > 100 and floor["train_tokens"] > 1000
    assert 0 < floor["bigram"]["value"] < floor["value"]  # both neighbours tell more than frequencies
    assert not any((tmp_path / "run").rglob("*"))  # the pretraining's flags are only read: nothing written


def test_a_random_copy_is_the_sources_model_reinitialised_and_predictions_give_its_score(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, BertConfig, BertModel

    from encoder_zoo.repro import predict, random_init
    from encoder_zoo.training.run import minilm_path

    source = tmp_path / "source"
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(source)
    AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(source)
    (source / "README.md").write_text("the source's card")
    copies = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        record = random_init.main(["--model", str(source), "--seed", str(seed), "--output_dir", str(tmp_path / name)])
        assert record["class"] == "BertModel" and (tmp_path / name / random_init.MARKER).is_file()
        copies[name] = load_file(tmp_path / name / "model.safetensors")
    original = load_file(source / "model.safetensors")
    assert set(copies["a"]) == set(original)
    key = "encoder.layer.0.attention.self.query.weight"
    assert copies["a"][key].equal(copies["b"][key]) and not copies["a"][key].equal(copies["c"][key])
    assert not copies["a"][key].equal(original[key])
    assert json.loads((tmp_path / "a" / "config.json").read_text())["hidden_size"] == 32
    assert (tmp_path / "a" / "tokenizer.json").is_file() and not (tmp_path / "a" / "README.md").exists()
    with pytest.raises(ValueError, match="already holds"):
        random_init.main(["--model", str(source), "--seed", "3", "--output_dir", str(tmp_path / "a")])

    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        [made] = predict.main(["--task", "rotten_tomatoes", "--max_seq_length", "32", "--max_eval_samples", "20",
                               "--models", str(tmp_path / "a"), "--names", "seed-7", "--output_dir",
                               str(tmp_path / "p")])
    import torch

    if not torch.accelerator.is_available():  # CPU loaders pin no memory (glue/README.md), so torch does not warn
        assert not [w for w in caught if "pin_memory" in str(w.message)]
    saved = json.loads((tmp_path / "p" / "seed-7.json").read_text())
    assert saved == made and saved["rows"] == len(saved["predictions"]) == 20
    from encoder_zoo.glue.tasks import first_samples, load_task

    spec, raw = load_task("rotten_tomatoes")
    labels = first_samples(raw, spec, None, 20)["validation"]["label"]
    assert saved["score"]["accuracy"] == pytest.approx(np.mean(np.array(saved["predictions"]) == np.array(labels)))


def test_spanbert_tests_table_6_and_7_in_the_papers_ablation_settings(tmp_path):
    experiment = EXPERIMENTS["spanbert"]
    claims = {(c.arm, c.baseline) for c in experiment.claims}
    assert {("spanbert", "bert"), ("span_2seq_nsp", "bert_2seq_nsp"), ("span_1seq", "span_2seq_nsp"),
            ("spanbert", "span_1seq")} == claims
    commands = {j.arm: j.command for j in sweep_jobs("spanbert", "gpu", tmp_path) if j.kind == "pretrain"}
    assert flag(commands["span_2seq_nsp"], "--model") == "bert_2seq_nsp"  # two segments + NSP, no SBO...
    assert flag(commands["span_2seq_nsp"], "--masking_scheme") == "span"  # ...with geometric spans
    assert flag(commands["bert_2seq_nsp"], "--masking_scheme") is None  # the recipe's subword masking
    assert flag(commands["span_1seq"], "--config_overrides") == "use_span_boundary_objective=False"


def test_the_gpu_budget_runs_hires_primary_and_its_control_in_one_session(tmp_path):
    """`--budget gpu` fits one lent GPU session with HIRE: its primary pair and the control, 5 units each, one
    fine-tuning per unit over every training row: 5 inits and 15 fine-tunings, nothing pretrained."""
    experiment = EXPERIMENTS["hire"]
    assert {a.name for a in experiment.arms_at("gpu")} == {"hire", "backbone", "backbone_random"}
    assert {(c.arm, c.baseline) for c in experiment.claims_at("gpu")} == {("hire", "backbone")}
    assert experiment.primary.task in experiment.tasks_at("gpu")
    jobs = sweep_jobs("hire", "gpu", tmp_path)
    kinds = {kind: [j for j in jobs if j.kind == kind] for kind in {j.kind for j in jobs}}
    assert "pretrain" not in kinds and len(kinds["init"]) == 5 and len(kinds["finetune"]) == 15
    for job in kinds["finetune"]:
        assert flag(job.command, "--max_train_samples") is None and flag(job.command, "--learning_rate") == "0.0001"
        assert flag(job.command, "--bf16") == "true"
    assert len(experiment.units_at(BUDGETS["gpu"])) >= 5


def test_init_scripts_get_each_units_seed(tmp_path):
    for name in ("hire", "bertac"):
        inits = [j for j in sweep_jobs(name, tmp_path=tmp_path) if j.kind == "init"]
        assert inits and {flag(j.command, "--seed") for j in inits} == {str(u) for u in BUDGETS["cpu"].unit_seeds}


# ------------------------------------------------------------------------------------------------ end to end
def sweep(experiment, out, *extra, check=True):
    result = subprocess.run([sys.executable, "repro/run.py", experiment, "--budget", "smoke", "--output_dir", str(out),
                             *extra], cwd=REPO, env=env(), capture_output=True, text=True, timeout=1800)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def run_log(out):
    path = Path(out) / "cache" / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def heldout_losses_of(arm):
    """The held-out loss tasks an arm's pretraining logs: a masked LM its MLM loss, the two-tower model the loss its
    loss_type trains (cloze, bilm or both); an arm without pretraining none."""
    if not arm.pretrain:
        return set()
    args = list(arm.pretrain)
    if args[args.index("--model") + 1] != "cloze":
        return {"heldout_mlm_masked", "heldout_mlm"}
    loss_type = next((a.split("=", 1)[1] for a in args if a.startswith("loss_type=")), "cloze")
    return {f"heldout_{kind}" for kind in loss_type.split("+")}


def check_report(out, name):
    experiment, budget = EXPERIMENTS[name], BUDGETS["smoke"]
    folder = Path(out) / name / "smoke"
    results = json.loads((folder / "results.json").read_text())
    report = (folder / "report.md").read_text()
    assert (folder / "plot.png").read_bytes()[:4] == b"\x89PNG"
    for heading in ("## The paper's numbers", "## Ours", "## Verdicts", "## How this was run", "Commit:", "Machine:",
                    "## Positive control: pretrained > random", "**Primary claim",
                    "| role | claim | task | difference, points [90% CI] | units | p (primary: alone; secondary: "
                    "Holm) | MDD (α) | FLOPs ratio | verdict |"):
        assert heading in report, heading
    assert experiment.paper_table.splitlines()[0] in report
    assert "| floor: chance (one constant answer) |" in report
    assert str(out) not in report and str(REPO) not in report and sys.executable not in report  # no machine path
    assert all(c["command"].startswith("python ") and str(out) not in c["command"] for c in results["commands"])
    tasks = [t for t in experiment.tasks if t not in results["untested_tasks"]]  # or those --tasks named
    assert tasks and set(tasks) <= set(budget.tasks)
    control = experiment.control_arm()
    assert set(results["arms"]) == {arm.name for arm in experiment.arms} | {control.name}
    runs = {}
    for arm in [*experiment.arms, control]:
        entry = results["arms"][arm.name]
        assert entry["failed"] == [], entry["failed"]
        for task in tasks:
            if task_facts(task).pretraining_metric and task not in heldout_losses_of(arm):
                assert task not in entry["tasks"], (arm.name, task)
                continue
            r = entry["tasks"][task]
            assert r["n_units"] == len(budget.unit_seeds) and r["low"] <= r["mean"] <= r["high"]
            assert r["floor"] is not None and r["clears_floor"] == above_floor(
                r["low"], r["high"], r["floor"], task_facts(task).higher_is_better)
            assert sorted(run["unit"] for run in r["runs"]) == sorted(
                u for u in budget.unit_seeds
                for _ in ([None] if task_facts(task).pretraining_metric else budget.finetune_seeds))
            assert all(np.isfinite(run["value"]) for run in r["runs"])
            runs[(arm.name, task)] = {(run["unit"], run["finetune_seed"]): run["value"] for run in r["runs"]}
    # every floor ran: the bag-of-words model on the fine-tunings' rows, the unigram loss of each pretraining
    kinds = {task: {f["kind"] for f in floors if f["value"] is not None} for task, floors in results["floors"].items()}
    assert "bag_of_words" in kinds["rotten_tomatoes"] and "chance" in kinds["rotten_tomatoes"]
    assert kinds.get("heldout_mlm_masked", {"unigram", "bigram"}) == {"unigram", "bigram"}
    assert any(f.startswith("| floor: bag-of-words (") for f in report.splitlines())
    claims = results["claims"]
    assert {(c["arm"], c["baseline"]) for c in claims} == {(c.arm, c.baseline) for c in experiment.claims}
    # the verdicts are decide_experiment's on the runs results.json keeps: control, primary alone, secondary Holm
    source = control.random_init_of
    controls = {task: {"arm": runs[(source, task)], "baseline": runs[(control.name, task)], "direction": "better",
                       "higher_is_better": task_facts(task).higher_is_better,
                       "learned": results["control"][task]["decision"]["learned"]}
                for task in tasks if not task_facts(task).pretraining_metric}
    control_again, again = decide_experiment([
        {"task": c["task"], "primary": c["role"] == "primary", "arm": runs[(c["arm"], c["task"])],
         "baseline": runs[(c["baseline"], c["task"])], "direction": c["direction"], "margin": c["margin"],
         "learned": c["learned"], "higher_is_better": task_facts(c["task"]).higher_is_better}
        for c in claims], controls)
    for task, decision in control_again.items():
        assert results["control"][task]["verdict"] == decision["verdict"] in VERDICTS
        assert "**pretrained > random** on " + task_facts(task).description in report
    for claim, decision in zip(claims, again):
        assert claim["verdict"] == decision["verdict"] in VERDICTS
        assert claim["decision"]["units"] == {"arm": len(budget.unit_seeds), "baseline": len(budget.unit_seeds)}
        assert claim["decision"]["p_value"] == decision["p_value"] and claim["decision"]["mdd"] == decision["mdd"]
        assert claim["control"] == (results["control"][claim["task"]]["verdict"] == REPRODUCED)
        primary = experiment.primary
        is_primary = (claim["arm"], claim["baseline"], claim["task"]) == (primary.arm, primary.baseline, primary.task)
        assert claim["role"] == ("primary" if is_primary else "secondary")
        assert f"**{claim['verdict']}" in report
    assert results["primary"]["tested"] == (experiment.primary.task in tasks)
    scripts = {Path(shlex.split(c["command"])[1]).name for c in results["commands"]}
    assert scripts <= {"pretrain.py", "run_glue.py", "run_qa.py", "init_hire.py", "init_bertac.py", "floors.py",
                       "random_init.py", "predict.py"}
    assert {"floors.py", "random_init.py", "predict.py"} <= scripts
    assert all(c["status"] in ("done", "cached") for c in results["commands"])
    return results


@pytest.mark.slow
@pytest.mark.parametrize("name", ["spanbert", "cloze", "hire", "bertac"])
def test_smoke_budget_end_to_end(name, tmp_path, share_smoke_cache):
    """The runs this shares with the zoo's smoke sweep come from the session's cache (`smoke_cache`), trained once."""
    out = share_smoke_cache(tmp_path)
    sweep(name, out)
    check_report(out, name)
    assert all(entry["status"] == "done" for entry in run_log(out))


@pytest.mark.slow
def test_a_killed_sweep_resumes_and_a_rerun_trains_nothing(tmp_path):
    """teams at smoke: SIGKILL the sweep once the first arm's units are finished, rerun with `--jobs 2` (only the
    second arm trains, each job once, by this sweep and a helper sweep of the same command on the same cache, each
    run with cores / 2 torch threads; the helper is gone when the command returns and the report is the main
    sweep's), then rerun again (nothing trains, same numbers)."""
    process = subprocess.Popen([sys.executable, "repro/run.py", "teams", "--budget", "smoke", "--output_dir",
                                str(tmp_path)], cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 900
    last_unit = f"unit {BUDGETS['smoke'].unit_seeds[-1]} "
    while not any(e["arm"] == "teams" and e["kind"] == "finetune" and last_unit in e["job"] for e in run_log(tmp_path)):
        assert process.poll() is None and time.time() < deadline, "the sweep ended before its first arm finished"
        time.sleep(1)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    first = run_log(tmp_path)
    assert {e["arm"] for e in first} == {"teams"}
    sweep("teams", tmp_path, "--jobs", "2")
    second = run_log(tmp_path)[len(first):]
    assert any(e["arm"] == "electra" for e in second) and all(e["status"] == "done" for e in second)
    assert sorted(e["folder"] for e in second) == sorted({e["folder"] for e in second})  # no job run twice
    assert all(e["torch_threads"] == max(1, os.cpu_count() // 2) for e in second)
    assert (tmp_path / "cache" / "helper-1.log").stat().st_size > 0
    # teams reused: neither pretrained nor fine-tuned again (its predictions come once every arm is fine-tuned)
    assert not [e for e in second if e["arm"] == "teams" and e["kind"] in ("pretrain", "finetune")]
    results = check_report(tmp_path, "teams")
    assert "--jobs 2" in results["command"]
    sweep("teams", tmp_path)
    assert len(run_log(tmp_path)) == len(first) + len(second)  # nothing trained the third time
    assert json.loads((tmp_path / "teams" / "smoke" / "results.json").read_text())["arms"] == results["arms"]


def test_a_failed_arm_is_reported_with_its_log(tmp_path):
    """A pretraining that fails (a missing corpus) marks its arm failed, its fine-tuning skipped, and the report names
    the log; the sweep writes its report and exits 1, naming each failed run's log and folder, and, since the run
    refused the corpus it was given, says that running the same command again repeats the refusal."""
    result = sweep("teams", tmp_path, "--dataset", str(tmp_path / "missing.txt"), "--tasks", "rotten_tomatoes",
                   check=False)
    assert result.returncode == 1, result.stderr[-3000:]
    pretrainings = 2 * len(BUDGETS["smoke"].unit_seeds)  # teams' and electra's per unit
    assert f"{pretrainings} run(s) failed" in result.stderr
    assert f"{pretrainings} of them refused their input" in result.stderr and "--dataset" in result.stderr
    assert "run the same command again" not in result.stderr
    assert str(tmp_path / "cache" / "pretrain" / "teams-") in result.stderr  # the folder to delete, named
    results = json.loads((tmp_path / "teams" / "smoke" / "results.json").read_text())
    for arm in ("teams", "electra"):
        failed = results["arms"][arm]["failed"]
        assert failed[0]["status"] == "failed" and Path(failed[0]["log"]).is_file()
        assert failed[1]["status"].startswith("skipped")
    assert "## Failed runs" in (tmp_path / "teams" / "smoke" / "report.md").read_text()
    assert failed[0]["refused"] and "refused its input" in (tmp_path / "teams" / "smoke" / "report.md").read_text()
    assert "unavailable" in result.stdout


def test_failure_advice_tells_a_refused_input_from_a_run_that_may_pass_again(tmp_path):
    """A run that refused its input (exit status 2) fails the same way on the same command, so the advice for it is
    to change what its log names, never to run the same command again; the advice for a run that failed otherwise
    still is."""
    from encoder_zoo.repro.jobs import Sweep

    sweep = Sweep(EXPERIMENTS["spanbert"].at(BUDGETS["smoke"]), tmp_path)
    refused, crashed = sweep.jobs[:2]
    refused.status, refused.exit_code = "failed", 2
    advice = sweep.failure_advice()
    assert "1 of them refused their input" in advice and "repeats the refusal" in advice
    assert "run the same command again:" not in advice
    crashed.status, crashed.exit_code = "failed", 1
    advice = sweep.failure_advice()
    assert "2 run(s) failed" in advice and "1 of them refused their input" in advice
    assert "The others: fix what the log names and run the same command again" in advice


def test_a_failed_run_shows_no_earlier_score_and_the_sweep_exits_1(tmp_path, monkeypatch, capsys):
    """A sweep whose cached export was damaged by hand: the sweep moves the export aside, and when the pretraining
    fails all the same, its fine-tunings are skipped and the report shows 'failed', not their cached scores of the
    earlier run; the command exits 1 naming the failed run's folder and `--rerun_stale`."""
    from encoder_zoo.repro import run as run_module
    from encoder_zoo.repro.jobs import Sweep, set_aside_damaged_export
    from encoder_zoo.training.run.folders import EXPORT_MARKER

    failing = []
    monkeypatch.setattr(Sweep, "execute", lambda self, job: "failed" if job.folder in failing else
                        write_outputs(job, 0.7) or "done")
    argv = ["teams", "--budget", "smoke", "--tasks", "rotten_tomatoes", "--units", "1", "--output_dir",
            str(tmp_path)]
    run_module.main(argv)
    export = next((tmp_path / "cache" / "pretrain").glob("teams-*/export"))
    (export / EXPORT_MARKER).unlink()  # damaged by hand: no longer a complete export
    failing.append(export.parent)
    with pytest.raises(SystemExit) as exit_info:
        run_module.main(argv)
    assert exit_info.value.code == 1
    advice = capsys.readouterr().err
    assert f"its folder {export.parent}" in advice and "--rerun_stale" in advice
    results = json.loads((tmp_path / "teams" / "smoke" / "results.json").read_text())
    assert "rotten_tomatoes" not in results["arms"]["teams"]["tasks"]  # the earlier run's 0.7 is not shown
    assert results["arms"]["electra"]["tasks"]["rotten_tomatoes"]["mean"] == pytest.approx(0.7)
    assert "| teams | failed |" in (tmp_path / "teams" / "smoke" / "report.md").read_text()
    set_aside_damaged_export(export)  # what the real run does before pretraining again: nothing deleted
    assert not export.exists() and len(list(export.parent.glob("export.damaged-*/model.safetensors"))) == 1


def test_jobs_starts_helpers_of_the_same_command_and_sweep_only_writes_no_report(tmp_path, monkeypatch):
    """The helpers `--jobs 3` starts: the same command as --jobs 1 --sweep_only, in their own process group (stopped
    with the runs they hold), runs with cores / 3 threads; each helper is waited for."""
    import torch

    from encoder_zoo.repro import run as run_module
    from encoder_zoo.repro.jobs import Sweep

    started = []

    class Helper:
        def __init__(self, command, **kwargs):
            started.append(self)
            self.command, self.kwargs, self.threads = command, kwargs, os.environ["OMP_NUM_THREADS"]
            self.pid, self.returncode, self.waited = -1, 0, False

        def poll(self):
            return None

        def wait(self):
            self.waited = True
            return 0

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "1")  # restored afterwards
    monkeypatch.setattr(subprocess, "Popen", Helper)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    monkeypatch.setattr(Sweep, "execute", lambda self, job: write_outputs(job, 0.7) or "done")
    argv = ["hire", "--budget", "smoke", "--tasks", "rotten_tomatoes", "--output_dir", str(tmp_path), "--jobs", "3",
            "--sweep_only"]
    threads = torch.get_num_threads()
    try:
        assert run_module.main(argv) == {}
    finally:
        torch.set_num_threads(threads)
    assert len(started) == 2 and all(h.waited and h.kwargs["start_new_session"] for h in started)
    assert all(h.command[2:] == [*argv, "--jobs", "1", "--sweep_only"] and h.threads == "2" for h in started)
    assert Path(started[0].command[1]) == REPO / "repro" / "run.py"
    assert {e["torch_threads"] for e in run_log(tmp_path)} == {2} and not (tmp_path / "hire").exists()


def write_outputs(job, value):
    """What a job's run leaves: each output a result JSON of `value` (stands in for the real entry points)."""
    for output in job.outputs:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps({"accuracy": value}))


def test_a_sweep_beside_another_runs_its_own_jobs_before_waiting(tmp_path, monkeypatch):
    """Two sweeps sharing a cache (say one per --units): a job the other sweep is running is put off while this sweep
    has other jobs it can start, then taken from the cache; the order is the job list's when nothing is held."""
    from encoder_zoo.repro.jobs import ENTRY_LOCK, Sweep
    from encoder_zoo.training import run as locks

    sweep = Sweep(EXPERIMENTS["hire"].at(BUDGETS["smoke"], tasks=["rotten_tomatoes"]), tmp_path)
    first = sweep.jobs[0]  # hire's first init: the other sweep is running it
    other_running = [True]
    real_try_hold = locks.try_hold
    monkeypatch.setattr(locks, "try_hold", lambda folder, name=ENTRY_LOCK: (
        not (folder == first.folder and other_running[0]) and real_try_hold(folder, name)))
    monkeypatch.setattr(locks, "wait_and_hold", lambda folder, name, message: (
        locks.try_hold(folder, name) or pytest.fail(f"waited for {folder}")))
    executed = []

    def execute(job):
        executed.append(job)
        if len(executed) == 2:  # meanwhile the other sweep finishes the first job
            write_outputs(first, 0.75)
            other_running[0] = False
        write_outputs(job, 0.75)
        return "done"

    monkeypatch.setattr(sweep, "execute", execute)
    sweep.run(tmp_path / "runs.jsonl")
    assert first.status == "cached" and all(job is not first for job in executed)
    put_off = sweep.jobs[1]  # the fine-tuning that needs the held init waits for it too
    assert first in put_off.needs and executed[:2] == sweep.jobs[2:4]  # the next unit's init and fine-tuning first
    rest = [job for job in sweep.jobs if all(job is not j for j in (first, *executed[:2]))]
    assert executed[2:] == rest and rest[0] is put_off  # then the list's order again, nothing run twice
    assert all(job.status in ("done", "cached") for job in sweep.jobs)


def test_the_zoo_reuses_a_papers_fine_tuning_run_made_under_another_arms_name(tmp_path, monkeypatch):
    """The zoo's fusions over MiniLM are the HIRE and BERTAC papers' own runs (same model, flags and seeds) under other
    arm names: a cache holding the papers' runs trains none of them again."""
    from encoder_zoo.repro.jobs import Sweep
    from encoder_zoo.repro.results import values
    from encoder_zoo.repro.zoo import zoo_experiment

    papers = {name: Sweep(EXPERIMENTS[name].at(BUDGETS["smoke"], tasks=["rotten_tomatoes"]), tmp_path)
              for name in ("hire", "bertac")}
    for sweep in papers.values():
        for job in sweep.jobs:
            write_outputs(job, 0.7)
    zoo = Sweep(zoo_experiment().at(BUDGETS["smoke"], tasks=["rotten_tomatoes"]), tmp_path)
    for arm, paper, paper_arm in (("hire+minilm", "hire", "hire"), ("bertac+minilm", "bertac", "gan_cnn")):
        reused = [j for j in zoo.jobs if j.arm == arm]
        made = {j.folder for j in papers[paper].jobs if j.arm == paper_arm}
        assert reused and {j.folder for j in reused} == made and all(j.done() for j in reused)
    executed = []
    monkeypatch.setattr(zoo, "execute", lambda job: executed.append(job) or write_outputs(job, 0.6) or "done")
    zoo.run(tmp_path / "runs.jsonl")
    assert executed and not any(j.arm.endswith("+minilm") for j in executed)
    assert values(zoo, "hire+minilm", "rotten_tomatoes") == values(papers["hire"], "hire", "rotten_tomatoes")
    # a run no other arm made keeps its own arm's name
    assert all(j.folder.name.startswith(f"{j.arm}-") for j in executed if j.kind == "finetune")


def test_the_reports_machine_line_names_the_runs_threads_not_the_report_writers(tmp_path, monkeypatch):
    """Each run's torch threads go to runs.jsonl beside its seconds; a report written later, by a process with another
    thread count, names the runs' count. Runs logged before threads were recorded count as the writer's."""
    from encoder_zoo.repro import jobs as jobs_module
    from encoder_zoo.repro import provenance
    from encoder_zoo.repro.jobs import Sweep
    from encoder_zoo.repro.provenance import machine
    from encoder_zoo.repro.results import run_seconds, run_threads

    sweep = Sweep(EXPERIMENTS["hire"].at(BUDGETS["smoke"], tasks=["rotten_tomatoes"]), tmp_path)
    monkeypatch.setattr(sweep, "execute", lambda job: write_outputs(job, 0.7) or "done")
    monkeypatch.setattr(jobs_module, "torch_threads", lambda: 1)
    sweep.run(tmp_path / "cache" / "runs.jsonl")
    monkeypatch.setattr(jobs_module, "torch_threads", lambda: 2)  # the process writing the report
    monkeypatch.setattr(provenance, "torch_threads", lambda: 2)
    assert run_threads(sweep) == {1: len(sweep.jobs)}
    assert ", 1 torch thread(s) per run" in machine(run_threads(sweep))
    assert run_seconds(sweep) == sum(e["seconds"] for e in run_log(tmp_path))
    log = tmp_path / "cache" / "runs.jsonl"
    entries = run_log(tmp_path)
    del entries[0]["torch_threads"]  # logged by an older sweep
    log.write_text("".join(json.dumps(e) + "\n" for e in entries))
    assert run_threads(sweep) == {None: 1, 1: len(sweep.jobs) - 1}
    line = machine(run_threads(sweep))
    assert f"1 torch thread(s) per run ({len(sweep.jobs) - 1} runs) and 2 torch thread(s) per run (1 run)" in line


def test_a_reports_time_counts_a_resumed_pretrainings_killed_part(tmp_path, monkeypatch):
    """runs.jsonl logs only a pretraining's last, resumed run; its logged training intervals (restored with the
    checkpoint) hold the killed part too, and the report's time counts the larger of the two."""
    from encoder_zoo.repro.jobs import Sweep
    from encoder_zoo.repro.results import run_seconds

    sweep = Sweep(EXPERIMENTS["teams"].at(BUDGETS["smoke"], tasks=["rotten_tomatoes"]), tmp_path)
    pretrain = next(j for j in sweep.jobs if j.kind == "pretrain")
    monkeypatch.setattr(sweep, "execute", lambda job: write_outputs(job, 0.7) or "done")
    sweep.run(tmp_path / "cache" / "runs.jsonl")
    logged = run_seconds(sweep)
    # 1,000 tokens at 10/s before the kill, 1,000 at 100/s after: 110 s of training, where the last run logged ~0 s
    history = [{"loss": 5.0, "num_input_tokens_seen": n, "tokens_per_second": r} for n, r in ((1000, 10), (2000, 100))]
    (pretrain.folder / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    entry = next(e for e in run_log(tmp_path) if e["folder"] == str(pretrain.folder))
    assert run_seconds(sweep) == pytest.approx(logged - entry["seconds"] + 110.0)


def test_a_reports_wall_clock_counts_overlapping_runs_once_and_gaps_between_sittings_not_at_all(tmp_path, monkeypatch):
    """Two sweeps sharing 2 cores run two jobs at once: the report's wall clock is the union of the runs' intervals
    (each logged with its end time and seconds), beside their sum."""
    from encoder_zoo.repro.jobs import Sweep
    from encoder_zoo.repro.results import run_seconds, wall_seconds

    sweep = Sweep(EXPERIMENTS["teams"].at(BUDGETS["smoke"], tasks=["rotten_tomatoes"]), tmp_path)
    monkeypatch.setattr(sweep, "execute", lambda job: write_outputs(job, 0.7) or "done")
    sweep.run(tmp_path / "cache" / "runs.jsonl")
    entries = run_log(tmp_path)
    assert len(entries) >= 4
    # (end, seconds): [0, 100] and [50, 150] overlap, [150, 160] touches, [1000, 1040] after a gap, the rest inside
    spans = [(100, 100), (150, 100), (160, 10), (1040, 40)] + [(1030, 5)] * (len(entries) - 4)
    for entry, (end, seconds) in zip(entries, spans):
        entry["time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(1_800_000_000 + end))
        entry["seconds"] = seconds
    (tmp_path / "cache" / "runs.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    assert wall_seconds(sweep) == pytest.approx(160 + 40)
    assert run_seconds(sweep) == pytest.approx(sum(seconds for _, seconds in spans))


def test_a_corrupted_cache_entry_is_named_moved_aside_and_recomputed(tmp_path, monkeypatch, capsys):
    """A result JSON that does not parse (a sweep killed while writing it) is not taken for a result: it is named,
    moved aside (the seed file; for an init, its model folder), never deleted, and its job runs again; a job with
    valid results stays cached, and so does a fine-tuning whose init, run again, made the same model."""
    import dataclasses

    from encoder_zoo.repro.jobs import Sweep

    budget = dataclasses.replace(BUDGETS["smoke"], finetune_seeds=(1, 2))
    sweep = Sweep(EXPERIMENTS["hire"].at(budget, tasks=["rotten_tomatoes"]), tmp_path)
    backbone = next(j for j in sweep.jobs if j.kind == "finetune" and j.arm == "backbone")
    init = next(j for j in sweep.jobs if j.kind == "init" and j.arm == "hire")
    executed = []

    def execute(job):
        executed.append(job)
        write_outputs(job, 0.5 if job.kind == "init" else 0.75)  # a seeded init makes the same model again
        if job.kind == "init":
            (job.folder / "model" / "model.safetensors").write_bytes(b"weights")
        return "done"

    monkeypatch.setattr(sweep, "execute", execute)
    sweep.run(tmp_path / "runs.jsonl")  # every result cached and valid...
    broken_seed = backbone.outputs[1]
    broken_seed.write_text('{"accuracy": 0.5')  # ...but two of them cut short
    init.outputs[0].write_text('{"model_type": "hi')
    executed.clear()
    sweep.run(tmp_path / "runs.jsonl")
    assert executed == [init, backbone]  # the init (seeded: its fine-tuning results stand) and the broken job
    err = capsys.readouterr().err
    assert f"{broken_seed} is not valid JSON" in err and f"{init.outputs[0]} is not valid JSON" in err
    [aside] = broken_seed.parent.glob(f"{broken_seed.name}.corrupt-*")
    assert aside.read_text() == '{"accuracy": 0.5'
    [model_aside] = init.folder.glob("model.corrupt-*")
    assert (model_aside / "model.safetensors").read_bytes() == b"weights"
    assert json.loads(broken_seed.read_text()) == {"accuracy": 0.75}
    assert json.loads(init.outputs[0].read_text()) == {"accuracy": 0.5}
    assert json.loads(backbone.outputs[0].read_text()) == {"accuracy": 0.75}  # the whole job ran again


def test_readme_reproduction_table_is_generated_from_the_committed_reports():
    from encoder_zoo.repro.summary import BEGIN, END, ZOO_BEGIN, ZOO_END, readme_tables

    readme = (REPO / "README.md").read_text()
    for (begin, end), text in zip(((BEGIN, END), (ZOO_BEGIN, ZOO_END)), readme_tables()):
        assert begin in readme and end in readme
        assert readme.split(begin)[1].split(end)[0].strip() == text.strip(), "rerun: python repro/summary.py --write"


def test_a_pretrainings_time_is_its_logged_intervals_so_a_resumed_run_keeps_its_whole_time(tmp_path):
    """Trainer restores total_flos, the tokens seen and the log of the intervals before the checkpoint, but
    train_runtime is the last part's: the time is the sum of the logged intervals' (tokens over tokens/s). A run
    whose intervals carry no token rate falls back to train_runtime, and has no time when it was resumed; the table
    says how many units were timed."""
    from encoder_zoo.repro.jobs import Job
    from encoder_zoo.repro.report import score_table
    from encoder_zoo.repro.results import pretraining_compute

    # 3 intervals: 1,000 tokens in 10 s, 2,000 in 5 s (before the kill), then 1,000 in 10 s after resuming
    intervals = [{"loss": 5.0, "num_input_tokens_seen": n, "tokens_per_second": r}
                 for n, r in ((1000, "100"), (3000, "400"), (4000, "100"))]
    state = {"log_history": [*intervals, {"train_runtime": 10.0}], "global_step": 300, "train_batch_size": 16,
             "num_input_tokens_seen": 4000, "total_flos": 3e12}

    def compute(name, state, resumed):
        job = Job("pretrain", name, name, tmp_path / name, [], [])
        job.folder.mkdir()
        (job.folder / "trainer_state.json").write_text(json.dumps(state))
        job.log.write_text("$ python pretrain.py --seed 1\n" + ("$ python pretrain.py --seed 1 "
                                                                "--resume_from_checkpoint true\n" if resumed else ""))
        return pretraining_compute(job, BUDGETS["cpu"])

    timed = compute("resumed", state, resumed=True)
    assert timed == {"flops": 3e12, "tokens": 4000, "tokens_counted": True, "seconds": 25.0,
                     "tokens_per_second": 160.0}
    untimed = [{k: v for k, v in e.items() if k != "tokens_per_second"} for e in intervals]
    words = {**state, "log_history": [*untimed, {"train_runtime": 10.0}]}
    assert compute("words", words, resumed=False)["seconds"] == 10.0
    assert compute("words-resumed", words, resumed=True)["seconds"] is None
    score = {"median": 0.6, "low": 0.5, "high": 0.7, "n_units": 3}
    units = {"1": {**timed, "includes_minilm": False}, "2": {**timed, "seconds": None, "tokens_per_second": None,
                                                               "includes_minilm": False},
             "3": {**timed, "includes_minilm": False}}
    rows = score_table({"tasks": ["rotten_tomatoes"], "chance": {"rotten_tomatoes": 0.5},
                        "arms": {"bert": {"tasks": {"rotten_tomatoes": score}, "failed": [], "compute": units}}})
    assert "| bert | 60 [50, 70] (3) | 3e+12 | 4,000 | 160 (2 of 3 units) | 25 (2 of 3 units) |" in rows


def test_readme_zoo_table_shows_every_method_with_its_compute_floors_control_and_the_significant_pairs(tmp_path):
    """README's zoo table: each method's mean [95% t interval] (units), * where it does not clear its floor, its
    compute; the floors (chance and a bag-of-words model per set of training rows, the trivial QA answer); the
    positive control; the significant pairs under the rule, stated once. A report made before (medians with the
    bootstrap interval, which over 3 units is their range) is labelled as the range it is."""
    from encoder_zoo.repro.summary import ZOO_RULE_IN_SHORT, zoo_table
    from encoder_zoo.repro.zoo import SIGNIFICANCE_RULE

    unit = {"flops": 2e12, "tokens": 4000, "tokens_per_second": 800.0, "seconds": 5.0, "includes_minilm": False}
    minilm = {"flops": None, "tokens": None, "tokens_per_second": None, "seconds": None, "includes_minilm": True}
    score = {"mean": 0.61, "median": 0.6, "low": 0.58, "high": 0.64, "n_units": 3, "floor": 0.686,
             "clears_floor": False}
    results = {"tasks": ["rotten_tomatoes", "wiki_cloze"], "best_encoder": "teams",
               "chance": {"rotten_tomatoes": 0.572, "wiki_cloze": None},
               "floors": {"rotten_tomatoes": [{"kind": "chance", "value": 0.572},
                                              {"kind": "bag_of_words", "value": 0.686, "rows": 2000},
                                              {"kind": "bag_of_words", "value": 0.654, "rows": 1000}],
                          "wiki_cloze": [{"kind": "trivial_answer", "value": 17.17}]},
               "arms": {"teams": {"tasks": {"rotten_tomatoes": score, "wiki_cloze": {
                                      **score, "mean": 7.5, "low": 7.0, "high": 8.0, "floor": 17.17}},
                                  "failed": [], "compute": {"1": unit, "2": {**unit, "flops": 4e12}, "3": unit}},
                        "hire+minilm": {"tasks": {"rotten_tomatoes": {**score, "mean": 0.75, "low": 0.74,
                                                                      "high": 0.76, "floor": 0.654,
                                                                      "clears_floor": True}},
                                        "failed": [], "compute": {"1": minilm}}},
               "control": {"rotten_tomatoes": {"arm": "bert", "baseline": "bert_random", "verdict": REPRODUCED}},
               "significance_rule": SIGNIFICANCE_RULE,
               "pairs": [{"task": "rotten_tomatoes", "better": "hire+minilm", "worse": "teams", "significant": True},
                         {"task": "wiki_cloze", "better": "teams", "worse": "bert", "significant": False}]}
    (tmp_path / "zoo" / "cpu").mkdir(parents=True)
    # a task no method scored (the held-out cloze loss where no two-tower model runs) gets no column
    (tmp_path / "zoo" / "cpu" / "results.json").write_text(json.dumps({**results, "tasks": [*results["tasks"],
                                                                                            "heldout_cloze"]}))
    text = zoo_table("cpu", tmp_path)
    assert "cloze loss" not in text
    # accuracy (stored 0-1) in percent points; F1 (stored in points) as it is
    assert "| teams | 61 [58, 64] (3)* | 7.5 [7, 8] (3)* | 2e+12 | 4,000 | 800 | 5 |" in text
    assert "| hire+minilm | 75 [74, 76] (3) | — | — + MiniLM | — | — | — |" in text
    assert "| floor: chance (one constant answer) | 57.2 | — | | | | |" in text
    assert "| floor: bag-of-words (2,000 training rows) | 68.6 | — | | | | |" in text
    assert "| floor: bag-of-words (1,000 training rows) | 65.4 | — | | | | |" in text
    assert "| floor: trivial answer | — | 17.17 | | | | |" in text
    assert "mean over units [95% t interval of the mean over unit means] (units)" in text and "bootstrap" not in text
    assert "Positive control (pretrained > random): bert > bert_random on rotten_tomatoes accuracy: reproduced" in text
    assert SIGNIFICANCE_RULE not in text and f"Significance rule: {ZOO_RULE_IN_SHORT} ([the whole rule](" in text
    assert "hire+minilm > teams on rotten_tomatoes accuracy" in text and "teams > bert" not in text
    assert "**teams**" in text and "(repro/reports/zoo/cpu/plot.png)" in text
    assert zoo_table("gpu", tmp_path).startswith("Not yet run at `gpu`") and "Made before" not in text
    old = {**results, "arms": {"teams": {"tasks": {"rotten_tomatoes": {"median": 0.6, "low": 0.58, "high": 0.64,
                                                                       "n_units": 3}},
                                         "failed": [], "compute": {"1": unit}}}}
    for key in ("floors", "control", "significance_rule"):
        del old[key]
    (tmp_path / "zoo" / "cpu" / "results.json").write_text(json.dumps(old))
    text = zoo_table("cpu", tmp_path)
    assert "| teams | 60 [58, 64] (3) |" in text and "median over units [range: lowest and highest unit]" in text
    # its one arm scored rotten_tomatoes only: the wiki_cloze column is left out
    assert "| chance (a model that learned nothing) | 57.2 |" in text and "wiki_cloze" not in text.splitlines()[0]
    assert "Positive control" not in text
    assert "Made before floors, controls and one scale: its report shows accuracy and Pearson as 0-1" in text


def test_summary_write_replaces_only_the_table(tmp_path):
    from encoder_zoo.repro.summary import BEGIN, END, write_readme

    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n")
    write_readme("| new |\n", readme)
    assert readme.read_text() == f"# Title\n\nbefore\n{BEGIN}\n| new |\n{END}\nafter\n"
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="lacks the markers"):
        write_readme("| new |", readme)
    assert readme.read_text() == "no markers"


def test_every_committed_report_names_no_machine_path():
    for report in (REPO / "repro" / "reports").glob("*/*/report.md"):
        text = report.read_text()
        assert "/root/" not in text and "/tmp/" not in text and "/work/" not in text, report


@pytest.mark.slow
def test_zoo_smoke_trains_every_method_and_reports_compute_and_pairs(tmp_path, share_smoke_cache):
    """`repro/run.py zoo --budget smoke`: every encoder and both fusions over MiniLM and over the best encoder, with
    each unit's pretraining FLOPs (Trainer's total_flos, the bench's count) next to its scores, and every pair of
    methods tested per task."""
    from encoder_zoo.repro.zoo import zoo_encoders

    ENCODERS = zoo_encoders()
    share_smoke_cache(tmp_path)  # the papers' smoke sweeps read the runs they share with it
    sweep("zoo", tmp_path)
    folder = tmp_path / "zoo" / "smoke"
    results = json.loads((folder / "results.json").read_text())
    best = results["best_encoder"]
    assert best in ENCODERS
    arms = results["arms"]
    assert set(arms) == {*ENCODERS, "hire+minilm", "bertac+minilm", f"hire+{best}", f"bertac+{best}", "bert_random"}
    units = [str(u) for u in BUDGETS["smoke"].unit_seeds]
    for name, arm in arms.items():
        assert arm["failed"] == [] and arm["tasks"]["rotten_tomatoes"]["n_units"] == len(units), name
        compute = arm["compute"]
        if name in ENCODERS or name.endswith(f"+{best}"):
            assert all(compute[u]["flops"] > 0 and compute[u]["tokens"] > 0 and compute[u]["seconds"] > 0
                       for u in units)
        if name.endswith(f"+{best}"):  # a fusion's compute includes its encoder's pretraining
            assert all(compute[u]["flops"] >= arms[best]["compute"][u]["flops"] for u in units)
    # every held-out loss is shown (TEAMS's is its generator's, cloze's its cloze loss), only comparable ones paired
    assert {"heldout_mlm_masked"} <= set(arms["bert"]["tasks"]) & set(arms["teams"]["tasks"])
    assert "heldout_cloze" in arms["cloze"]["tasks"] and "heldout_mlm_masked" not in arms["cloze"]["tasks"]
    assert not any("teams" in (p["better"], p["worse"]) for p in results["pairs"] if p["task"] == "heldout_mlm_masked")
    rotten = [p for p in results["pairs"] if p["task"] == "rotten_tomatoes"]
    methods = len(arms) - 1  # the positive control is in no pair
    assert len(rotten) == methods * (methods - 1) // 2 and not any("bert_random" in (p["better"], p["worse"])
                                                                   for p in rotten)
    assert all(p["decision"]["alpha"] == 0.025 and p["decision"]["family_size"] <= len(rotten)
               and p["decision"]["mdd_alpha"] == pytest.approx(0.025 / max(1, p["decision"]["family_size"]))
               for p in rotten)
    assert results["control"]["rotten_tomatoes"]["arm"] == "bert"
    report = (folder / "report.md").read_text()
    assert "| method |" in report and "pretraining FLOPs" in report and str(tmp_path) not in report
    assert "## Positive control: pretrained > random" in report and "| floor: bag-of-words (" in report
    assert (folder / "plot.png").read_bytes()[:4] == b"\x89PNG"
    reused = {c["folder"] for c in results["commands"]}
    assert len(reused) == len(results["commands"])  # one job per folder: a run shared by two methods runs once


def test_the_zoo_finds_its_encoders_in_the_experiments_and_an_experiment_adds_one(monkeypatch):
    """The zoo's encoders are the methods the experiments pretrain under their plain recipe, baseline first, each once;
    an arm with more flags (an ablation) is not one. A new experiment that pretrains a method brings it into the zoo
    and its stage-one sweep, with no edit of repro/zoo.py."""
    from encoder_zoo.repro import zoo
    from encoder_zoo.repro.experiments import EXPERIMENTS, Arm, Experiment

    assert list(zoo.zoo_encoders()) == ["bert", "spanbert", "bert_2seq_nsp", "teams", "electra", "cloze"]
    toy = Experiment(name="toy", paper="a toy paper", arms=(
        Arm("toy", "toy objective", pretrain=("--model", "toy")),
        Arm("toy_ablation", "toy without its trick", pretrain=("--model", "toy", "--config_overrides", "trick=False")),
        Arm("bert", "BERT again", pretrain=("--model", "bert"))),
        baseline="bert", claims=(), tasks=("rotten_tomatoes",), glue_preset=None, paper_table="")
    monkeypatch.setattr(zoo, "all_experiments", lambda: {**EXPERIMENTS, "toy": toy})
    encoders = zoo.zoo_encoders()
    assert list(encoders) == ["bert", "spanbert", "bert_2seq_nsp", "teams", "electra", "cloze", "toy"]
    assert encoders["toy"] == "toy objective" and encoders["bert"] == EXPERIMENTS["spanbert"].arm("bert").description
    stage_one = {arm.name: arm.pretrain for arm in zoo.zoo_experiment().arms}
    assert stage_one["toy"] == ("--model", "toy") and "toy_ablation" not in stage_one


def test_a_task_reads_failed_only_where_its_own_run_or_a_run_it_needs_failed(tmp_path, monkeypatch):
    """A cell reads 'failed' where a run writing its score failed or was skipped for a failure upstream: a failed QA
    fine-tuning marks wiki_cloze only; a failed pretraining every task of its arm (held-out loss included); a failed
    fusion init its task's fine-tuning, not the held-out loss the fusion has no run for."""
    from encoder_zoo.repro.jobs import Sweep
    from encoder_zoo.repro.results import failed_on, failures

    tasks = ["wiki_cloze", "rotten_tomatoes", "heldout_mlm_masked"]
    sweep = Sweep(EXPERIMENTS["spanbert"].at(BUDGETS["smoke"], tasks=tasks), tmp_path)
    failing = {next(j.folder for j in sweep.jobs if j.arm == "spanbert" and j.name.startswith("wiki_cloze")),
               next(j.folder for j in sweep.jobs if j.arm == "bert" and j.kind == "pretrain")}
    monkeypatch.setattr(sweep, "execute", lambda job: "failed" if job.folder in failing else
                        write_outputs(job, 0.7) or "done")
    sweep.run(tmp_path / "cache" / "runs.jsonl")
    qa, pretraining = {"failed": failures(sweep, "spanbert")}, {"failed": failures(sweep, "bert")}
    assert failed_on(qa, "wiki_cloze") and not any(failed_on(qa, t) for t in ("rotten_tomatoes", "heldout_mlm_masked"))
    assert all(failed_on(pretraining, task) for task in tasks)
    assert not any(failed_on({"failed": failures(sweep, "span_1seq")}, task) for task in tasks)

    fusion = Sweep(EXPERIMENTS["hire"].at(BUDGETS["smoke"], tasks=["rotten_tomatoes", "heldout_mlm_masked"]),
                   tmp_path / "hire")
    init = next(j.folder for j in fusion.jobs if j.arm == "hire" and j.kind == "init")
    monkeypatch.setattr(fusion, "execute", lambda job: "failed" if job.folder == init else
                        write_outputs(job, 0.7) or "done")
    fusion.run(tmp_path / "hire" / "cache" / "runs.jsonl")
    hire = {"failed": failures(fusion, "hire")}
    assert failed_on(hire, "rotten_tomatoes") and not failed_on(hire, "heldout_mlm_masked")


# ------------------------------------------------------------------------------------- what the cache trusts
def fake_sweep(setting, out, monkeypatch, executed, value=0.7):
    """A sweep whose jobs write `value` results instead of running (`executed` collects them), run once."""
    from encoder_zoo.repro.jobs import Sweep

    sweep = Sweep(setting, out)
    monkeypatch.setattr(sweep, "execute",
                        lambda job: executed.append(job.folder) or write_outputs(job, value) or "done")
    sweep.run(out / "cache" / "runs.jsonl")
    return sweep


def test_a_fine_tuning_runs_again_once_the_export_it_read_is_retrained(tmp_path, monkeypatch, capsys):
    """A fine-tuning records the content hash of the export it read (weights and config): an export retrained to other
    weights makes it stale (its files moved aside, nothing deleted, and run again); one written again with the same
    content does not; the other fine-tunings stay cached."""
    from encoder_zoo.repro.jobs import RECORD
    from encoder_zoo.repro.provenance import code_hash, model_hash

    setting = EXPERIMENTS["teams"].at(BUDGETS["smoke"], tasks=["rotten_tomatoes"])
    executed = []
    sweep = fake_sweep(setting, tmp_path, monkeypatch, executed)
    pretrain = next(j for j in sweep.jobs if j.kind == "pretrain" and j.arm == "teams")
    finetune = next(j for j in sweep.jobs if j.kind == "finetune" and pretrain in j.needs)
    export = pretrain.folder / "export"
    read = "../../pretrain/" + pretrain.folder.name + "/export"  # relative to its folder: a moved cache keeps it
    assert json.loads((finetune.folder / RECORD).read_text()) == {"code": code_hash(),
                                                                    "inputs": {read: model_hash(export)}}
    weights = export / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # written again: the same model
    executed.clear()
    fake_sweep(setting, tmp_path, monkeypatch, executed)
    assert executed == []
    weights.write_text(json.dumps({"accuracy": 0.123}))  # retrained: other weights
    fake_sweep(setting, tmp_path, monkeypatch, executed)
    assert executed == [finetune.folder]
    assert f"the model it read, {export}, has changed since" in capsys.readouterr().err
    [aside] = finetune.folder.parent.glob(f"{finetune.folder.name}.stale-*")
    assert json.loads((aside / "seed-101.json").read_text()) == {"accuracy": 0.7}
    assert json.loads((finetune.folder / RECORD).read_text())["inputs"] == {read: model_hash(export)}


def test_a_fine_tuning_cached_before_records_is_checked_by_time_then_pinned_to_its_exports_content(tmp_path,
                                                                                                    monkeypatch):
    """An entry from before fine-tunings recorded their exports: one whose export was written after its results runs
    again; the others are kept, now with the content of their export recorded (and their code unknown)."""
    from encoder_zoo.repro.jobs import RECORD, Sweep
    from encoder_zoo.repro.provenance import model_hash

    setting = EXPERIMENTS["teams"].at(BUDGETS["smoke"], tasks=["rotten_tomatoes"])
    sweep = Sweep(setting, tmp_path)
    for job in sweep.jobs:  # an old cache: results, no records
        write_outputs(job, 0.7)
        for output in job.outputs:
            os.utime(output, ns=(10**18, 10**18))
    retrained = next(j for j in sweep.jobs if j.kind == "pretrain" and j.arm == "electra")
    os.utime(retrained.folder / "export" / "model.safetensors", ns=(10**18 + 10**9, 10**18 + 10**9))
    executed = []
    sweep = fake_sweep(setting, tmp_path, monkeypatch, executed)
    # the fine-tuning over it, and the positive control's random copy of it (which reads its config)
    stale = [j for j in sweep.jobs if retrained.folder / "export" in j.inputs]
    assert executed == [j.folder for j in stale] and [j.kind for j in stale] == ["finetune", "random_init"]
    kept = [j for j in sweep.jobs if j.kind == "finetune" and j.folder not in executed]
    assert len(kept) == 5
    for job in kept:
        assert json.loads((job.folder / RECORD).read_text()) == {
            "code": None, "inputs": {job.input_name(job.inputs[0]): model_hash(job.inputs[0])}}


def test_a_cached_export_is_complete_only_with_its_completeness_marker(tmp_path, monkeypatch):
    """An export holding config, weights and code but not the marker its export writes last is no cached export: its
    pretraining runs again."""
    from encoder_zoo.repro.jobs import Sweep
    from encoder_zoo.training.run.folders import EXPORT_MARKER, is_export

    setting = EXPERIMENTS["teams"].at(BUDGETS["smoke"], tasks=["rotten_tomatoes"])
    pretrain = next(j for j in Sweep(setting, tmp_path).jobs if j.kind == "pretrain")
    export = pretrain.folder / "export"
    export.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "modeling_teams.py"):
        (export / name).write_text("{}")
    assert not pretrain.done() and not is_export(export)
    executed = []
    fake_sweep(setting, tmp_path, monkeypatch, executed)
    assert pretrain.folder in executed
    assert is_export(export) and (export / EXPORT_MARKER) in pretrain.outputs


def test_a_report_names_its_runs_code_and_rerun_stale_retrains_the_stale_ones(tmp_path, monkeypatch):
    """Every run records the code hash it ran. A report names it in its header; runs from other code, or cached before
    runs recorded theirs, are reused and named stale (report and results.json); `--rerun_stale` retrains them, and a
    fine-tuning whose retrained export has the same content stands."""
    from encoder_zoo.repro import run as run_module
    from encoder_zoo.repro.jobs import RECORD, Sweep
    from encoder_zoo.repro.provenance import code_hash

    executed = []
    monkeypatch.setattr(Sweep, "execute", lambda self, job: executed.append(job.name) or write_outputs(job, 0.7)
                        or "done")
    argv = ["teams", "--budget", "smoke", "--tasks", "rotten_tomatoes", "--output_dir", str(tmp_path)]
    folder = tmp_path / "teams" / "smoke"
    run_module.main(argv)
    total = len(executed)  # per unit: 2 pretrainings, a random copy, 3 fine-tunings; per arm its predictions; a floor
    assert total == 2 * (2 + 1 + 3) + 3 + 1
    assert f"**Code:** every run ran this checkout's code, `{code_hash()}`" in (folder / "report.md").read_text()
    finetune = next(p.parent for p in (tmp_path / "cache" / "finetune").glob(f"teams-*/{RECORD}"))
    (finetune / RECORD).write_text(json.dumps({**json.loads((finetune / RECORD).read_text()), "code": "0123456789ab"}))
    pretrain = next(p.parent for p in (tmp_path / "cache" / "pretrain").glob(f"electra-*/{RECORD}"))
    (pretrain / RECORD).unlink()  # cached before runs recorded their code
    names = {str(e["folder"]): e["job"] for e in run_log(tmp_path)}
    executed.clear()
    run_module.main(argv)
    assert executed == []  # reused, and named
    code = json.loads((folder / "results.json").read_text())["code"]
    assert code["current"] == code_hash() and code["runs"] == {code_hash(): total - 2, "0123456789ab": 1, "unknown": 1}
    assert code["stale"] == [{"run": names[str(finetune)], "code": "0123456789ab"}]
    assert code["unknown"] == [names[str(pretrain)]]
    report = (folder / "report.md").read_text()
    assert ("**Stale:** 1 ran other code (`0123456789ab` x1) and 1 did not record their code (cached before runs "
            "did); `--rerun_stale` retrains them") in report
    run_module.main([*argv, "--rerun_stale"])
    assert sorted(executed) == sorted([names[str(finetune)], names[str(pretrain)]])  # not the electra fine-tunings
    assert json.loads((folder / "results.json").read_text())["code"]["runs"] == {code_hash(): total}
    assert len(list(finetune.parent.glob(f"{finetune.name}.stale-*"))) == 1
    assert (pretrain / "key.json").is_file()  # the entry keeps its key; its old files went aside
    assert len(list(pretrain.parent.glob(f"{pretrain.name}.stale-*/export/model.safetensors"))) == 1


def test_repro_modules_import_only_downwards():
    """repro/ in layers: provenance, budgets, statistics and the small scripts of floors, random copies and
    predictions; the task facts; the experiments; the job graph, the results, the plots, what changed since a previous
    report; the zoo and the reports; the commands. The former sweep.py is gone."""
    from test_layout import import_graph

    layers = (("budgets", "stats", "provenance", "floors", "random_init", "predict"), ("tasks",), ("experiments",),
              ("jobs", "results", "plots", "changes"), ("zoo", "report"), ("run", "summary", "tune"))
    level = {f"encoder_zoo.repro.{name}": i for i, names in enumerate(layers) for name in names}
    graph = import_graph()
    assert {m for m in graph if m.startswith("encoder_zoo.repro.")} == set(level)
    upward = [f"{m} -> {t}" for m in level for t in graph[m] if t in level and level[t] >= level[m]]
    assert not upward, upward
    assert not (REPO / "repro" / "sweep.py").exists()


def test_run_help_offers_rerun_stale(capsys):
    from encoder_zoo.repro.run import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--help"])
    assert exit_info.value.code == 0 and "--rerun_stale" in capsys.readouterr().out


def test_every_pretrained_arm_reports_its_own_held_out_token_loss_against_a_unigram_floor(tmp_path):
    """Each pretrained arm's held-out token-prediction loss is read from its pretraining, with a unigram
    floor: the MLM loss (TEAMS's and ELECTRA's generator's), and the two-tower model's own, cloze or bilm."""
    from encoder_zoo.repro.jobs import Sweep

    for name, expected in (("spanbert", {"heldout_mlm_masked"}), ("teams", {"heldout_mlm_masked"}),
                           ("cloze", {"heldout_cloze", "heldout_bilm"})):
        sweep = Sweep(EXPERIMENTS[name].at(BUDGETS["cpu"]), tmp_path / name)
        held_out = {t for t in sweep.tasks if task_facts(t).pretraining_metric}
        assert held_out == expected, name
        for arm in (a for a in sweep.arms if a.pretrain):
            logged = {t for t in held_out if sweep.logs(arm, task_facts(t).spec.logged_output)}
            assert logged, arm.name  # the cloze arm its cloze loss, the bilm arm its bilm loss, a masked LM its MLM's
            for task in held_out:
                assert ((arm.name, task) in sweep.floors) == (task in logged), (arm.name, task)
                if task in logged:
                    assert sweep.floors[(arm.name, task)].command[2] == "unigram"
                job, path = sweep.sources[(arm.name, task, 1, None)]
                assert job.kind == "pretrain" and path.name == "trainer_state.json"
    assert task_facts("heldout_cloze").metric == "eval_cloze_loss" and task_facts("heldout_bilm").metric == (
        "eval_bilm_loss")


def test_an_experiment_may_pretrain_for_fewer_steps_at_a_budget():
    """cloze at `cpu`: 2,000 steps (a two-tower run takes 19-25 minutes at 2,000), warmed up over its recipe's
    fraction of those; every other experiment the budget's 4,000."""
    cloze = [j for j in sweep_jobs("cloze") if j.kind == "pretrain"]
    assert {flag(j.command, "--max_steps") for j in cloze} == {"2000"}
    assert {flag(j.command, "--warmup_steps") for j in cloze} == {"54"}  # ceil(2,000 x 16k / 600k)
    assert EXPERIMENTS["cloze"].at(BUDGETS["cpu"]).budget.pretrain_steps == 2000
    teams = [j for j in sweep_jobs("teams") if j.kind == "pretrain"]
    assert {flag(j.command, "--max_steps") for j in teams} == {"4000"}


# --------------------------------------------------------------------------------------- since the previous report
def test_changes_name_what_changed_per_claim_and_control():
    """`repro.changes`: a HIRE report (the one of commit cfeee7b, kept as a fixture: the committed one was rerun)
    against a rerun whose bag-of-words floor rose, whose positive
    control lost its signal and so gated the primary claim, one claim unchanged, one dropped and one new: each row
    says so in one line, on the tables' scale, from the data alone."""
    from encoder_zoo.repro.changes import GONE, NEW, SAME, changes, previous_record
    from encoder_zoo.repro.stats import current_verdict

    old = json.loads(OLD_HIRE_REPORT.read_text())
    new = json.loads(json.dumps(old))
    new["floors"]["rotten_tomatoes"][1]["value"] = 0.70
    control = new["control"]["rotten_tomatoes"]
    control["verdict"] = control["decision"]["verdict"] = NO_SIGNAL
    control["decision"].update(estimate=0.01, low=-0.01, high=0.03, mdd=0.04)
    primary = new["claims"][0]
    primary["verdict"] = NO_CONTROL
    primary["decision"].update(estimate=0.03, low=0.01, high=0.05, mdd=0.02)
    dropped = new["claims"].pop()  # hire vs mean_weighting
    new["claims"].append({**new["claims"][1], "baseline": "backbone_random"})
    previous = previous_record(old, "abc1234def", "the floors changed")
    assert previous["floors"] == {"rotten_tomatoes": 0.654} and previous["code"] == old["code"]["current"]
    assert previous["controls"]["rotten_tomatoes"]["verdict"] == REPRODUCED and len(previous["claims"]) == 4
    assert set(previous["claims"][0]) == {"role", "arm", "baseline", "task", "metric", "verdict", "estimate", "low",
                                          "high", "mdd"}

    rows = changes(previous, new)
    assert [(r["role"], r["arm"], r["baseline"]) for r in rows] == [
        ("control", "backbone", "backbone_random"), ("primary", "hire", "backbone"),
        ("secondary", "hire", "without_hire"), ("secondary", "hire", "without_fusion"),
        ("secondary", "hire", "backbone_random"), ("secondary", "hire", "mean_weighting")]
    old_control = old["control"]["rotten_tomatoes"]["decision"]
    assert rows[0]["before"]["verdict"] == REPRODUCED and rows[0]["now"]["verdict"] == NO_SIGNAL
    assert rows[0]["why"].startswith("highest floor 65.4 -> 70; difference ") and "positive control" not in rows[0][
        "why"] and rows[0]["why"].endswith("-> 1.00 [-1.00, 3.00], within its MDD 4.00")  # 3 significant digits
    assert f"{100 * old_control['estimate']:.1f} [" in rows[0]["why"]
    assert rows[1]["why"] == (f"highest floor 65.4 -> 70; positive control {REPRODUCED} -> {NO_SIGNAL}; difference "
                              "-0.72 [-1.60, 0.16], within its MDD 1.25 -> 3.00 [1.00, 5.00], beyond its MDD 2.00")
    assert rows[1]["before"]["verdict"] == NOT_REPRODUCED and rows[1]["now"] == {
        "verdict": NO_CONTROL, "estimate": 0.03, "low": 0.01, "high": 0.05, "mdd": 0.02}
    assert rows[2]["why"] == rows[3]["why"] == (f"{SAME}; highest floor 65.4 -> 70; positive control {REPRODUCED} -> "
                                                f"{NO_SIGNAL}")
    assert rows[4]["why"] == NEW and rows[4]["before"] is None
    assert rows[5]["why"] == GONE and rows[5]["now"] is None
    assert rows[5]["before"]["verdict"] == current_verdict(dropped["verdict"])  # a former phrasing, reworded
    assert all(r["task"] == "rotten_tomatoes" and r["metric"] == "accuracy" for r in rows)
    assert all(r["why"] == SAME for r in changes(previous, old))


@pytest.mark.parametrize("folder", sorted(str(p.parent.relative_to(Path(__file__).resolve().parent.parent))
                                           for p in (Path(__file__).resolve().parent.parent / "repro" / "reports")
                                           .glob("*/*/results.json")))
def test_every_committed_report_plot_has_data_in_each_panel_and_one_legend_entry_per_meaning(folder, tmp_path):
    """Each committed report's figure, drawn as `summary.py --rerender` draws it: every panel draws points (no panel
    for a task nobody scored), its legend names each meaning once (floors of equal value drawn once, the unigram
    and bigram floors apart), and no title reaches outside the figure or into another panel's."""
    from encoder_zoo.repro.plots import figure_structure, paper_figure, zoo_figure
    from encoder_zoo.repro.results import name_the_gate
    from encoder_zoo.repro.summary import REPORTS, report_sweep
    from encoder_zoo.repro.tasks import FLOOR_NAMES

    results = name_the_gate(json.loads((REPORTS.parent.parent / folder / "results.json").read_text()))
    figure = (zoo_figure if results["experiment"] == "zoo" else paper_figure)(results, report_sweep(results, tmp_path))
    drawn = figure_structure(figure)
    assert drawn["panels"] and all(panel["points"] > 0 for panel in drawn["panels"]), drawn["panels"]
    assert len(drawn["legend"]) == len(set(drawn["legend"])), drawn["legend"]
    kinds = {f["kind"] for floors in results["floors"].values() for f in floors if f.get("value") is not None}
    assert {f"floor: {FLOOR_NAMES[kind]}" for kind in kinds} <= set(drawn["legend"]), (kinds, drawn["legend"])
    assert drawn["outside"] == [] and drawn["overlapping"] == []
    colours = {}
    for ax in figure.axes:
        for line in ax.get_lines():
            if line.get_label().startswith("floor: "):
                colours.setdefault((line.get_color(), line.get_linestyle()), set()).add(line.get_label())
    assert all(len(labels) == 1 for labels in colours.values()), colours  # one style, one floor


def test_a_report_with_a_previous_one_says_what_changed_and_one_without_does_not(tmp_path):
    """A re-rendered report whose results hold "previous" has the section "Since the previous report" right after
    its primary claim, before its scores: the previous commit, code and reason, then one table row per control and
    claim; without "previous", the report is the committed one, without the section."""
    import shutil

    from encoder_zoo.repro.changes import previous_record
    from encoder_zoo.repro.summary import REPORTS, rerender

    committed = REPORTS / "spanbert" / "adapt"
    shutil.copytree(committed, tmp_path / "plain")
    rerender(tmp_path / "plain")
    plain = (tmp_path / "plain" / "report.md").read_text()
    assert plain == (committed / "report.md").read_text() and "Since the previous report" not in plain

    old = json.loads((committed / "results.json").read_text())
    new = json.loads(json.dumps(old))
    new["floors"]["rotten_tomatoes"][1]["value"] = 0.65
    new["claims"][1]["verdict"] = new["claims"][1]["decision"]["verdict"] = NOT_REPRODUCED
    new["claims"][1]["decision"]["control"] = True  # the rule gives that verdict again on re-rendering
    shutil.copytree(committed, tmp_path / "since")
    (tmp_path / "since" / "results.json").write_text(
        json.dumps({**new, "previous": previous_record(old, "0123456789abcdef", "the floor was refitted.")}))
    rerender(tmp_path / "since")
    report = (tmp_path / "since" / "report.md").read_text()
    section = report.split("## Since the previous report\n\n", 1)[1]
    assert report.index("**Primary claim**") < report.index("## Since the previous report") < report.index("## Ours")
    assert section.startswith(f"This report replaces the one run at commit `{old['commit'][:7]}` (code "
                              f"`{old['code']['current']}`, kept in the repository at `0123456`), rerun because the "
                              "floor was refitted. Differences")
    rows = section.split("\n\n")[1].splitlines()
    assert rows[0] == ("| role | claim | task | before: difference [90% CI], verdict | now: difference [90% CI], "
                       "verdict | what changed |")
    assert len(rows) == 2 + 1 + len(old["claims"])  # header, rule, the control, the claims
    assert rows[2].startswith("| control | minilm vs minilm_random |") and rows[2].endswith(
        "| same verdict; highest floor 61.8 -> 65 |")
    assert rows[3].endswith("| same verdict; highest floor 61.8 -> 65 |") and "| 1.76 [" in rows[3]
    assert rows[4].endswith(f", {NOT_REPRODUCED} | highest floor 61.8 -> 65; difference unchanged, 0.96 [-0.14, "
                            "2.06], within its MDD 1.57 |")
    assert json.loads((tmp_path / "since" / "results.json").read_text())["previous"]["commit"] == "0123456789abcdef"


def test_summary_since_stores_the_previous_report_and_rerenders_the_same_files_twice(tmp_path):
    """`repro/summary.py --since COMMIT --because TEXT FOLDER`, end to end in a scratch repository whose commit holds
    the committed SpanBERT adapt report: the rerun's results.json keeps it in short under "previous" (the full
    commit, its code), its report.md says what changed; a second run writes the same bytes; an unknown commit, a
    folder the commit lacks, and a report the budget cannot re-render (HIRE at cpu, made at other settings) are
    refused in one line, its results.json left as it was; the committed reports are not touched."""
    import hashlib
    import shutil

    from encoder_zoo.repro.summary import REPORTS, main

    def git(*args, cwd=tmp_path):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
                               *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()

    def digest(folder):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}

    committed = {name: digest(REPORTS / name) for name in ("spanbert/adapt", "hire/cpu")}
    folder, hire = tmp_path / "repro/reports/spanbert/adapt", tmp_path / "repro/reports/hire/cpu"
    shutil.copytree(REPORTS / "spanbert" / "adapt", folder)
    shutil.copytree(REPORTS / "hire" / "cpu", hire)
    (folder / "results.json").write_text(git("show", "HEAD:repro/reports/spanbert/adapt/results.json", cwd=REPO))
    shutil.copy(OLD_HIRE_REPORT, hire / "results.json")  # made at other cpu settings than the budget's now
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "the previous reports")
    head = git("rev-parse", "HEAD")
    rerun = json.loads((folder / "results.json").read_text())
    # as if the adaptation control had passed: the rule gives the verdict again from the decision on re-rendering
    rerun["claims"][0]["verdict"] = rerun["claims"][0]["decision"]["verdict"] = REPRODUCED
    rerun["claims"][0]["control"] = rerun["claims"][0]["decision"]["control"] = True
    rerun["claims"][0]["decision"]["reason"] = None
    (folder / "results.json").write_text(json.dumps(rerun, indent=2))

    done = subprocess.run([sys.executable, "repro/summary.py", "--since", "HEAD", "--because", "the masking changed",
                           str(folder)], cwd=REPO, env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    results = json.loads((folder / "results.json").read_text())
    assert results["previous"]["commit"] == head and results["previous"]["because"] == "the masking changed"
    assert results["previous"]["code"] == rerun["code"]["current"]
    assert {k: v for k, v in results.items() if k not in ("previous", "budget")} == {
        k: v for k, v in rerun.items() if k != "budget"}
    report = (folder / "report.md").read_text()
    assert f"kept in the repository at `{head[:7]}`" in report and "rerun because the masking changed." in report
    assert f", {REPRODUCED} | difference unchanged, 1.76 [0.60, 2.92], beyond its MDD 1.65 |" in report
    first = digest(folder)
    main(["--since", "HEAD", str(folder), "--because", "the masking changed"])
    assert digest(folder) == first

    other = tmp_path / "other"  # not in the commit
    shutil.copytree(folder, other)
    for commit, where, message in (("HEAD~3", folder, "git knows no commit 'HEAD~3'"),
                                   ("HEAD", other, "commit HEAD has no other/results.json"),
                                   ("HEAD", hire, "made at other cpu settings")):
        before = digest(where)
        with pytest.raises(ValueError, match=message) as refused:  # summary.py's cli: one line, exit 2
            main(["--since", commit, "--because", "x", str(where)])
        assert "\n" not in str(refused.value) and str(refused.value).startswith("--since: ")
        assert digest(where) == before
    with pytest.raises(SystemExit):
        main(["--since", "HEAD", str(folder)])  # no --because
    assert {name: digest(REPORTS / name) for name in committed} == committed


@pytest.mark.parametrize("what, named", [("missing", "does not exist: give a report folder"),
                                         ("file", "is a file, not a report folder"),
                                         ("empty", "has no results.json"),
                                         ("damaged", "results.json is damaged")])
def test_summary_names_what_it_was_given_instead_of_a_report_folder(tmp_path, monkeypatch, capsys, what, named):
    import sys

    from encoder_zoo.repro.summary import cli

    target = tmp_path / "report"
    if what == "file":
        target.write_text("x")
    elif what in ("empty", "damaged"):
        target.mkdir()
        if what == "damaged":
            (target / "results.json").write_text("{")
    for argv in (["--rerender", str(target)], ["--since", "HEAD", "--because", "x", str(target)]):
        monkeypatch.setattr(sys, "argv", ["summary.py", *argv])
        with pytest.raises(SystemExit) as stopped:
            cli()
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith("summary.py: error: ") and named in err
