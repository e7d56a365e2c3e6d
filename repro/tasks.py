"""What repro knows of a task, read from the task's own declaration and from nowhere else: `task_facts(name)`.

A task declares how a comparison scores it (`glue.tasks.Scoring`: its metric, direction, description, scale, chance
level, floor and the script that fine-tunes it) in its spec: a sentence task's `TaskSpec` (glue/tasks.py), a QA
set's `QATaskSpec` (qa/tasks.py), or a pretraining metric's `PretrainingTask` (here: what the pretraining logs on
its held-out documents). A task whose spec declares no scoring is no task of repro's.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from encoder_zoo.glue.tasks import Scoring
from encoder_zoo.repro.floors import KINDS as FLOOR_KINDS

MAJORITY_CLASS, NO_CORRELATION = "majority_class", "no_correlation"
# The script that fine-tunes a task -> the floors that read its rows (None: a pretraining metric's, which reads the
# pretraining's own held-out documents).
FLOORS_OF = {"glue": ("bag_of_words",), "qa": ("trivial_answer",), None: ("unigram",)}


@dataclass(frozen=True)
class PretrainingTask:
    """A score each pretrained arm's pretraining logs on its held-out documents (its trainer_state.json's last
    evaluation), read with no fine-tuning."""

    name: str
    scoring: Scoring
    # The recipe output (`Recipe.logs`) the score is the held-out mean of: an arm whose recipe logs no such
    # output (the cloze model's loss is no MLM loss) gets no floor for it.
    logged_output: str
    num_labels = None  # no classes (a class attribute, as every task spec answers it)


def heldout_loss(name: str, output: str, what: str, metric: str | None = None) -> PretrainingTask:
    """The held-out mean of a token-prediction loss in nats (`metric`, by default `eval_<output>`) of an arm whose
    recipe logs `output`, against the unigram floor (with the bigram floor beside it)."""
    return PretrainingTask(name, Scoring(
        metric or f"eval_{output}", f"held-out {what}, nats (pretraining eval)", None, higher_is_better=False,
        point=1.0, unit="nats", floor="unigram"), logged_output=output)


PRETRAINING_TASKS: dict[str, PretrainingTask] = {
    # The masked LMs' headline: the MLM loss at the targets replaced by [MASK], which the model predicts
    # without seeing them (training.run.trainer's add_masked_only; TEAMS's and ELECTRA's is their generator's).
    "heldout_mlm_masked": heldout_loss("heldout_mlm_masked", "mlm_loss", "MLM loss at [MASK] targets only",
                                       metric="eval_mlm_masked_loss"),
    # The model's own mlm_loss: every 80/10/10 target, a tenth of them left unchanged and copied from the input. What
    # the reports made before the masked-only loss show.
    "heldout_mlm": heldout_loss("heldout_mlm", "mlm_loss", "MLM loss over all 80/10/10 targets"),
    # The two-tower model's token-prediction losses: the cloze loss (every token from both sides, never seen: there
    # is no [MASK] to score apart) of a cloze arm, the bilm loss (each tower's next token, averaged) of a bilm arm; an
    # arm logs the one its loss_type trains.
    "heldout_cloze": heldout_loss("heldout_cloze", "cloze_loss", "cloze loss (every token unseen)"),
    "heldout_bilm": heldout_loss("heldout_bilm", "bilm_loss", "bilm loss (every token unseen)"),
}


@dataclass(frozen=True)
class TaskFacts(Scoring):
    """A task's `Scoring` with its name, its number of labels (1: regression; None: no classes) and the spec that
    declares them (`spec`: for what only its kind has, as a sentence task's data or a pretraining metric's
    `logged_output`)."""

    name: str = ""
    num_labels: int | None = None
    spec: object = None

    @property
    def display_scale(self) -> float:
        """The factor from what results.json and the cache store to what every report, plot and README table shows:
        percent points (0-100, as GLUE and SQuAD print them, the papers' scale) for scores, nats for a loss. Linear,
        so differences, intervals, MDDs, floors and margins scale with the scores; the statistics are computed
        unscaled."""
        return 1.0 / self.point

    @property
    def pretraining_metric(self) -> bool:
        """Logged by the pretraining itself (no fine-tuning; no random-initialisation control, no paper's claim)."""
        return self.finetuned_by is None


def specs() -> list:
    """Every declared task spec, sentence tasks first, then QA sets, then pretraining metrics."""
    from encoder_zoo.glue.tasks import TASKS
    from encoder_zoo.qa.tasks import QA_TASKS

    return [*TASKS.values(), *QA_TASKS.values(), *PRETRAINING_TASKS.values()]


def scored_tasks() -> list[str]:
    """The name of every task whose spec declares how it is scored: every task repro can run."""
    return [spec.name for spec in specs() if spec.scoring is not None]


def task_facts(name: str) -> TaskFacts:
    """What the spec of task `name` declares (`TaskFacts`); a ValueError for a task no spec scores, or one whose
    scoring names a chance level, floor or script repro does not know."""
    spec = next((s for s in specs() if s.name == name and s.scoring is not None), None)
    if spec is None:
        raise ValueError(f"unknown task {name!r}: no task spec declares how to score it (glue/tasks.py, qa/tasks.py, "
                         f"repro/tasks.py); choose from {', '.join(scored_tasks())}")
    facts = TaskFacts(**asdict(spec.scoring), name=name, num_labels=spec.num_labels, spec=spec)
    check(facts)
    return facts


def check(facts: TaskFacts) -> None:
    where = f"task {facts.name}'s Scoring"
    if facts.finetuned_by not in FLOORS_OF:
        raise ValueError(f"{where}: finetuned_by={facts.finetuned_by!r}; use 'glue', 'qa' or None (a pretraining "
                         "metric)")
    if facts.floor is not None and facts.floor not in FLOORS_OF[facts.finetuned_by]:
        why = ("does not fit" if facts.floor in FLOOR_KINDS else
               f"is no floor of repro/floors.py ({', '.join(FLOOR_KINDS)}), nor fits")
        raise ValueError(f"{where}: floor={facts.floor!r} {why} a task with finetuned_by={facts.finetuned_by!r}; use "
                         f"{' or '.join(FLOORS_OF[facts.finetuned_by])}, or None")
    if facts.chance not in (None, MAJORITY_CLASS, NO_CORRELATION):
        raise ValueError(f"{where}: chance={facts.chance!r}; use {MAJORITY_CLASS!r}, {NO_CORRELATION!r} or None")
    if facts.chance == MAJORITY_CLASS and not (facts.finetuned_by == "glue" and facts.metric == "accuracy"
                                               and (facts.num_labels or 0) > 1):
        raise ValueError(f"{where}: chance={MAJORITY_CLASS!r} is the accuracy of one constant label: it needs a "
                         "classification task of run_glue.py scored by accuracy")


def display_scale(task: str) -> float:
    """`TaskFacts.display_scale` of `task`."""
    return task_facts(task).display_scale


def shown(x: float | None, task: str) -> str:
    """A value of `task` (a score, difference, interval end, MDD, floor or margin) on the tables' scale
    (`display_scale`), to 4 significant digits; "—" for none."""
    return "—" if x is None else f"{x * display_scale(task):.4g}"


# What each kind of floor is called in the tables and the plots' legends.
FLOOR_NAMES = {"chance": "chance", "bag_of_words": "bag-of-words", "trivial_answer": "trivial answer",
               "unigram": "unigram", "bigram": "bigram"}


def decimals(largest: float, digits: int = 3) -> int:
    """The decimals that give `largest` (its magnitude) `digits` significant digits; never negative."""
    import math

    if not largest:
        return digits - 1
    places = digits - 1 - math.floor(math.log10(abs(largest)))
    if abs(round(largest, places)) >= 10 ** (digits - places):  # 9.996 rounds to 10.00: one decimal fewer
        places -= 1
    return max(0, places)


def significant(x: float | None, task: str, digits: int = 3) -> str:
    """A difference or MDD of `task` on the tables' scale to `digits` significant digits, never in exponent form
    (12.0, 0.827); "—" for none."""
    if x is None:
        return "—"
    value = x * display_scale(task)
    return f"{value:.{decimals(value, digits)}f}"


def shown_difference(estimate: float | None, low: float | None, high: float | None, task: str) -> str:
    """A difference and its interval on the tables' scale, all three to the decimals that give the largest of them
    3 significant digits: -10.4 [-16.5, -4.4], 0.59 [0.01, 1.17]."""
    if estimate is None:
        return "— [—, —]"
    scale = display_scale(task)
    values = [v * scale if v is not None else None for v in (estimate, low, high)]
    places = decimals(max(abs(v) for v in values if v is not None))
    e, lo, hi = ("—" if v is None else f"{round(v, places) + 0.0:.{places}f}" for v in values)  # no "-0.0"
    return f"{e} [{lo}, {hi}]"


def pretraining_text(tasks: tuple[str, ...], folder: Path) -> Path:
    """The training sentences of the sentence `tasks` (labels unused, evaluation rows never), one document per row
    (a pair's texts as one), as a text file under `folder` (blank-line-separated documents, what `pretrain.py
    --dataset FILE.txt` reads): task-adaptive pretraining's text. Named by its content's hash and written only when
    absent: a sweep's pretraining cache keys name it (`Sweep.dataset_key`), and its time stays put."""
    import hashlib

    from encoder_zoo.glue.tasks import load_task

    documents = []
    for name in tasks:
        if task_facts(name).finetuned_by != "glue":
            raise ValueError(f"task {name!r} is no sentence task: only a sentence task's training text is read")
        spec, raw = load_task(name)
        documents += [" ".join(" ".join(str(part).split()) for part in row)
                      for row in zip(*(raw["train"][column] for column in spec.text_columns))]
    text = "\n\n".join(d for d in documents if d) + "\n"
    path = folder / f"{'+'.join(tasks)}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.txt"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}")
        staged.write_text(text, encoding="utf-8")
        os.replace(staged, path)
    return path
