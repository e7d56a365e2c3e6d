"""Task facts: every task repro scores is declared in its own spec (glue/tasks.py, qa/tasks.py, repro/tasks.py), and
repro reads a task only through `repro.tasks.task_facts`. Toy tasks registered here, in no library file, are read
like the shipped ones: metric, direction, scale, chance level, floor, labels and the jobs that run them."""

from __future__ import annotations

import dataclasses
import json

import datasets
import pytest

from encoder_zoo.glue import tasks as glue_tasks
from encoder_zoo.glue.tasks import Scoring, TaskSpec
from encoder_zoo.qa import tasks as qa_tasks
from encoder_zoo.qa.tasks import QATaskSpec
from encoder_zoo.repro import tasks as repro_tasks
from encoder_zoo.repro.budgets import ALL_TASKS, BUDGETS
from encoder_zoo.repro.experiments import EXPERIMENTS, ZOO_TASKS
from encoder_zoo.repro.tasks import PretrainingTask, scored_tasks, task_facts

WORDS = {1: ["great", "lovely", "fine", "superb"], 0: ["awful", "dull", "bad", "grim"]}


def toy_rows(n: int, offset: int = 0) -> dict:
    labels = [int(i % 3 != 0) for i in range(offset, offset + n)]  # two thirds positive: a majority to find
    return {"sentence": [f"a {WORDS[y][i % 4]} film number {i}" for i, y in enumerate(labels, offset)],
            "label": labels}


def toy_data() -> datasets.DatasetDict:
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict(toy_rows(30)),
                                 "validation": datasets.Dataset.from_dict(toy_rows(12, offset=30))})


@pytest.fixture
def toy_tasks(monkeypatch):
    """A sentence task scored by F1 over its own data, one scored by accuracy against the majority class, a QA set
    and a pretraining metric: each registered in its kind's registry for this test only."""
    specs = {
        "toy_f1": TaskSpec("toy_f1", ("sentence",), 2, ("accuracy", "f1"), loader=toy_data,
                           scoring=Scoring("f1", "toy F1", "glue", floor="bag_of_words")),
        "toy_accuracy": TaskSpec("toy_accuracy", ("sentence",), 2, ("accuracy",), loader=toy_data,
                                 scoring=Scoring("accuracy", "toy accuracy", "glue", chance="majority_class",
                                                 floor="bag_of_words")),
    }
    for name, spec in specs.items():
        monkeypatch.setitem(glue_tasks.TASKS, name, spec)
    monkeypatch.setitem(qa_tasks.QA_TASKS, "toy_qa", QATaskSpec("toy_qa", version_2=True, scoring=Scoring(
        "exact", "toy exact match", "qa", point=1.0, floor="trivial_answer")))
    monkeypatch.setitem(repro_tasks.PRETRAINING_TASKS, "toy_loss", PretrainingTask("toy_loss", Scoring(
        "eval_toy_loss", "toy loss", None, higher_is_better=False, point=1.0, unit="nats", floor="unigram"),
        logged_output="toy_loss"))


def test_a_task_declared_only_in_its_spec_is_read_by_repro(toy_tasks):
    from encoder_zoo.repro.results import chance_level

    f1, accuracy, qa, loss = (task_facts(name) for name in ("toy_f1", "toy_accuracy", "toy_qa", "toy_loss"))
    assert (f1.metric, f1.finetuned_by, f1.floor, f1.chance, f1.num_labels) == ("f1", "glue", "bag_of_words", None, 2)
    assert f1.higher_is_better and f1.display_scale == 100 and f1.description == "toy F1" and f1.unit == "points"
    assert (qa.metric, qa.finetuned_by, qa.floor, qa.num_labels, qa.display_scale) == (
        "exact", "qa", "trivial_answer", None, 1.0)
    assert (loss.metric, loss.floor, loss.unit, loss.higher_is_better, loss.pretraining_metric) == (
        "eval_toy_loss", "unigram", "nats", False, True)
    assert loss.spec.logged_output == "toy_loss" and not accuracy.pretraining_metric
    # chance as declared: none for F1, QA and a loss; the scored rows' majority class for accuracy (8 of 12 positive)
    budget = BUDGETS["smoke"]
    assert [chance_level(t, budget) for t in ("toy_f1", "toy_qa", "toy_loss")] == [None, None, None]
    assert chance_level("toy_accuracy", budget) == pytest.approx(8 / 12)
    assert {"toy_f1", "toy_accuracy", "toy_qa", "toy_loss"} <= set(scored_tasks())


def test_a_toy_tasks_jobs_floor_and_score_follow_its_spec(toy_tasks, tmp_path):
    from encoder_zoo.repro import floors
    from encoder_zoo.repro.jobs import Sweep
    from encoder_zoo.repro.results import values
    from encoder_zoo.repro.run import parse_args

    assert parse_args(["hire", "--tasks", "toy_f1"]).tasks == ["toy_f1"]
    experiment = dataclasses.replace(EXPERIMENTS["hire"], tasks=("toy_f1",), budget_tasks={}, primary=None)
    budget = dataclasses.replace(BUDGETS["smoke"], tasks=("toy_f1",))
    setting = experiment.at(budget)
    assert setting.tasks == ["toy_f1"] and setting.num_labels == {"toy_f1": 2}
    sweep = Sweep(setting, tmp_path)
    finetune = [j for j in sweep.jobs if j.kind == "finetune"]
    assert finetune and all(j.command[1].endswith("run_glue.py") and "toy_f1" in j.command for j in finetune)
    assert {j.kind for j in sweep.jobs} >= {"init", "finetune", "predict", "floor"}
    floor_jobs = {job.command[2] for job in sweep.floors.values()}
    assert floor_jobs == {"bag_of_words"} and set(sweep.floors) == {(a.name, "toy_f1") for a in sweep.arms}
    # the bag-of-words floor is scored by the task's own metric
    floor = floors.main(["bag_of_words", "--task", "toy_f1", "--output", str(tmp_path / "floor.json")])
    assert floor["metric"] == "f1" and 0 <= floor["value"] <= 1 and floor["train_rows"] == 30
    # a run's score is read under the metric's key its spec declares
    arm = sweep.arms[0].name
    (job, path) = next(v for k, v in sweep.sources.items() if k[:2] == (arm, "toy_f1"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"accuracy": 0.5, "f1": 0.75}))
    assert list(values(sweep, arm, "toy_f1").values()) == [0.75]


@pytest.mark.parametrize("scoring, match", [
    (Scoring("accuracy", "x", "glue", floor="unigram"), "floor='unigram' does not fit"),
    (Scoring("accuracy", "x", "glue", floor="coin_flip"), "floor='coin_flip' is no floor of repro/floors.py"),
    (Scoring("accuracy", "x", "svm"), "finetuned_by='svm'"),
    (Scoring("accuracy", "x", "glue", chance="coin"), "chance='coin'"),
])
def test_a_scoring_repro_cannot_read_is_refused_naming_the_task_and_field(monkeypatch, scoring, match):
    monkeypatch.setitem(glue_tasks.TASKS, "toy_bad", TaskSpec("toy_bad", ("sentence",), 2, ("accuracy", "f1"),
                                                              scoring=scoring))
    with pytest.raises(ValueError, match=f"toy_bad's Scoring: {match}"):
        task_facts("toy_bad")


def test_an_undeclared_task_and_a_metric_the_script_does_not_compute_are_refused():
    with pytest.raises(ValueError, match="unknown task 'cola': no task spec declares how to score it"):
        task_facts("cola")  # a GLUE task, but no comparison of repro scores it
    with pytest.raises(ValueError, match="majority_class.*scored by accuracy"):
        repro_tasks.check(dataclasses.replace(task_facts("rotten_tomatoes"), metric="f1"))
    with pytest.raises(ValueError, match="its scoring metric 'f1' is none of the metrics"):
        TaskSpec("toy", ("sentence",), 2, ("accuracy",), scoring=Scoring("f1", "toy F1", "glue"))


def test_every_task_the_budgets_and_experiments_name_is_declared_by_a_spec():
    assert list(ALL_TASKS) == scored_tasks()  # the gpu budget allows every declared task
    named = {*ZOO_TASKS, *(t for e in EXPERIMENTS.values() for t in e.tasks),
             *(t for b in BUDGETS.values() for t in b.tasks)}
    assert all(task_facts(task).name == task for task in named)
    assert glue_tasks.EMBEDDED_TASKS == ("rotten_tomatoes", "movie_sentiment_regression")
