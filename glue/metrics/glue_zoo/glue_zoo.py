"""GLUE metrics as the papers report them, as a local `evaluate` module (the Hub's `glue` script is unreachable
offline): `evaluate.load("glue/metrics/glue_zoo", "mrpc")`.

cola: Matthews correlation; sst2, mnli, qnli, rte, wnli: accuracy; mrpc, qqp: F1 and accuracy;
stsb: Pearson and Spearman. Scores are fractions (multiply by 100 for the papers' tables).
"""

import datasets
import evaluate
import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

_REGRESSION = ("stsb", "movie_sentiment_regression", "regression")
_F1 = ("mrpc", "qqp", "binary")
_MATTHEWS = ("cola",)
_ACCURACY = ("sst2", "mnli", "mnli_matched", "mnli_mismatched", "qnli", "rte", "wnli", "rotten_tomatoes", "accuracy")


class GlueZoo(evaluate.Metric):
    def _info(self):
        if self.config_name not in _REGRESSION + _F1 + _MATTHEWS + _ACCURACY:
            raise KeyError(f"Unknown GLUE task {self.config_name!r}; use one of "
                           f"{_REGRESSION + _F1 + _MATTHEWS + _ACCURACY}.")
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
        if self.config_name in _F1:
            return {"accuracy": float(accuracy_score(references, predictions)),
                    "f1": float(f1_score(references, predictions))}
        return {"accuracy": float(accuracy_score(references, predictions))}
