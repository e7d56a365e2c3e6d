"""Entity-level precision, recall and F1 of tagged sentences as conlleval computes them, through seqeval (its default
mode is conlleval's chunking: an I- tag after O or after another type starts an entity, so IOB1 and BIO/IOB2 are
both read), as a local `evaluate` module (the Hub's `seqeval` script is unreachable offline):
`evaluate.load("glue/metrics/ner_zoo")`.

Inputs: `predictions` and `references`, one list of string tags per sentence. Output: overall `precision`, `recall`,
`f1` (micro over entities) and token `accuracy`, and each entity type's precision, recall, F1 and count under its
name. Scores are fractions (multiply by 100 for the papers' tables).
"""

import warnings

import datasets
import evaluate
from seqeval.metrics import accuracy_score, classification_report


class NerZoo(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Tjong Kim Sang and De Meulder, 2003. Introduction to the CoNLL-2003 Shared Task (conlleval); "
                     "Nakayama, 2018. seqeval.",
            inputs_description="predictions and references: a list of tags (strings) per sentence.",
            features=datasets.Features({"predictions": datasets.Sequence(datasets.Value("string")),
                                        "references": datasets.Sequence(datasets.Value("string"))}),
        )

    def _compute(self, predictions, references):
        with warnings.catch_warnings():  # numpy's empty-mean warnings where no entity was tagged or predicted
            warnings.simplefilter("ignore", RuntimeWarning)
            report = classification_report(references, predictions, output_dict=True, zero_division=0)
        overall = report.pop("micro avg")
        for average in ("macro avg", "weighted avg"):
            report.pop(average, None)
        scores = {name: {"precision": float(row["precision"]), "recall": float(row["recall"]),
                         "f1": float(row["f1-score"]), "number": int(row["support"])} for name, row in report.items()}
        return {**scores, "precision": float(overall["precision"]), "recall": float(overall["recall"]),
                "f1": float(overall["f1-score"]), "accuracy": float(accuracy_score(references, predictions))}
