"""The QA sets known by name (run_qa.py's --dataset), each declared once (`QATaskSpec`): whether it is scored as SQuAD
2.0 (some questions have no answer), and how a comparison of models scores it (`Scoring`, which repro/ reads)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from encoder_zoo.glue.tasks import Scoring, with_plugins


@dataclass(frozen=True)
class QATaskSpec:
    name: str
    version_2: bool  # SQuAD 2.0-style: unanswerable questions, scored with the v2 metric (no-answer threshold)
    scoring: Scoring | None = None  # None: no comparison of repro/ scores this set
    num_labels = None  # extractive QA has no classes (a class attribute, as every task spec answers it)


# SQuAD F1 as qa_results.json stores it (0-100: one point is 1.0), floored by the best first-k-words answer; no
# chance level.
BUILT_IN_QA_TASKS: dict[str, QATaskSpec] = {
    "squad": QATaskSpec("squad", version_2=False),
    "squad_v2": QATaskSpec("squad_v2", version_2=True),
    "mrqa": QATaskSpec("mrqa", version_2=False),
    # Embedded offline sets of cloze questions from real Wikipedia text (qa/data.py).
    "wiki_cloze": QATaskSpec("wiki_cloze", version_2=False, scoring=Scoring(
        "f1", "wiki_cloze (SQuAD 1.1-style) F1", "qa", point=1.0, floor="trivial_answer")),
    "wiki_cloze_v2": QATaskSpec("wiki_cloze_v2", version_2=True, scoring=Scoring(
        "f1", "wiki_cloze_v2 (SQuAD 2.0-style) F1", "qa", point=1.0, floor="trivial_answer")),
}


def __getattr__(name: str):
    """`QA_TASKS` (the built-in sets and the plugins', `glue.tasks.with_plugins`), read on first use: a plugin
    module imports this one's spec class, so it can only be loaded once this module is."""
    if name == "QA_TASKS":
        globals()["QA_TASKS"] = with_plugins(BUILT_IN_QA_TASKS, "QA_TASKS", "qa/tasks.py")
        return globals()["QA_TASKS"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_qa_task(name: str) -> QATaskSpec:
    tasks = sys.modules[__name__].QA_TASKS
    if name not in tasks:
        raise ValueError(f"Unknown QA set {name!r}: choose one of {', '.join(tasks)}.")
    return tasks[name]
