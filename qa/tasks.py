"""The QA sets known by name (run_qa.py's --dataset), each declared once (`QATaskSpec`): whether it is scored as SQuAD
2.0 (some questions have no answer), and how a comparison of models scores it (`Scoring`, which repro/ reads)."""

from __future__ import annotations

from dataclasses import dataclass

from encoder_zoo.glue.tasks import Scoring


@dataclass(frozen=True)
class QATaskSpec:
    name: str
    version_2: bool  # SQuAD 2.0-style: unanswerable questions, scored with the v2 metric (no-answer threshold)
    scoring: Scoring | None = None  # None: no comparison of repro/ scores this set
    num_labels = None  # extractive QA has no classes (a class attribute, as every task spec answers it)


# SQuAD F1 as qa_results.json stores it (0-100: one point is 1.0), floored by the best first-k-words answer; no
# chance level.
QA_TASKS: dict[str, QATaskSpec] = {
    "squad": QATaskSpec("squad", version_2=False),
    "squad_v2": QATaskSpec("squad_v2", version_2=True),
    "mrqa": QATaskSpec("mrqa", version_2=False),
    # Embedded offline sets of cloze questions from real Wikipedia text (qa/data.py).
    "wiki_cloze": QATaskSpec("wiki_cloze", version_2=False, scoring=Scoring(
        "f1", "wiki_cloze (SQuAD 1.1-style) F1", "qa", point=1.0, floor="trivial_answer")),
    "wiki_cloze_v2": QATaskSpec("wiki_cloze_v2", version_2=True, scoring=Scoring(
        "f1", "wiki_cloze_v2 (SQuAD 2.0-style) F1", "qa", point=1.0, floor="trivial_answer")),
}


def get_qa_task(name: str) -> QATaskSpec:
    if name not in QA_TASKS:
        raise ValueError(f"Unknown QA set {name!r}: choose one of {', '.join(QA_TASKS)}.")
    return QA_TASKS[name]
