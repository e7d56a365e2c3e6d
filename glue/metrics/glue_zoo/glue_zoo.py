"""GLUE metrics as the papers report them, as a local `evaluate` module (the Hub's `glue` script is unreachable
offline): `evaluate.load("glue/metrics/glue_zoo", "mrpc")`.

cola: Matthews correlation; sst2, mnli, qnli, rte, wnli: accuracy; mrpc, qqp: F1 and accuracy;
stsb: Pearson and Spearman; tacred: micro precision, recall and F1 over the relations other than no_relation (id 0),
as the SpanBERT authors' run_tacred.py computes them (`compute_f1`). Scores are fractions (multiply by 100 for the
papers' tables).
"""

import datasets
import evaluate
import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

_REGRESSION = ("stsb", "movie_sentiment_regression", "regression")
_F1 = ("mrpc", "qqp", "binary")
_MATTHEWS = ("cola",)
_RELATIONS = ("tacred",)  # class 0 is the negative relation
_ACCURACY = ("sst2", "mnli", "mnli_matched", "mnli_mismatched", "qnli", "rte", "wnli", "rotten_tomatoes", "accuracy")


class GlueZoo(evaluate.Metric):
    def _info(self):
        if self.config_name not in _REGRESSION + _F1 + _MATTHEWS + _RELATIONS + _ACCURACY:
            raise KeyError(f"Unknown GLUE task {self.config_name!r}; use one of "
                           f"{_REGRESSION + _F1 + _MATTHEWS + _RELATIONS + _ACCURACY}.")
        value = datasets.Value("float32" if self.config_name in _REGRESSION else "int64")
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Wang et al., 2019. GLUE: A Multi-Task Benchmark and Analysis Platform for Natural Language "
                     "Understanding.",
            inputs_description="predictions and references: class ids, or floats for regression tasks.",
            features=datasets.Features({"predictions": value, "references": value}),
        )

    def _compute(self, predictions, references):
        predictions, references = np.asarray(predictions), np.asarray(references)
        if self.config_name in _REGRESSION:
            return {"pearson": float(pearsonr(predictions, references)[0]),
                    "spearmanr": float(spearmanr(predictions, references)[0])}
        if self.config_name in _MATTHEWS:
            return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}
        if self.config_name in _RELATIONS:
            return relation_scores(predictions, references)
        if self.config_name in _F1:
            return {"accuracy": float(accuracy_score(references, predictions)),
                    "f1": float(f1_score(references, predictions))}
        return {"accuracy": float(accuracy_score(references, predictions))}


def relation_scores(predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
    """TACRED's score: a prediction counts when it is not class 0; it is correct when it also equals a reference that
    is not class 0. Precision over predictions, recall over references, F1 their harmonic mean; all 0 when nothing is
    correct."""
    predicted, gold = predictions != 0, references != 0
    correct = int(np.sum(predicted & gold & (predictions == references)))
    if correct == 0:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    precision, recall = correct / int(predicted.sum()), correct / int(gold.sum())
    return {"precision": precision, "recall": recall, "f1": 2 * precision * recall / (precision + recall)}
