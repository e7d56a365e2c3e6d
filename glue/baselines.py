"""Trivial models to read fine-tuning scores against, fitted on the rows a run trains on and scored on the rows it is
scored on. run_glue.py prints the bag-of-words model beside a regression task's runs (a constant answer has no
correlation, so a majority class says nothing there); repro/floors.py makes it the floor of its comparisons.

- bag of words: TF-IDF of word unigrams and bigrams (sublinear tf; a pair's two texts as one bag) with
  scikit-learn's LogisticRegression (C 1, classification) or Ridge (alpha 1, regression). Fixed settings, chosen
  before any result and never tuned.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def score(metric: str, predicted, labels) -> float:
    """`predicted` against `labels` by `metric`, as glue/metrics/glue_zoo computes it (0-1)."""
    from scipy import stats
    from sklearn.metrics import f1_score, matthews_corrcoef

    predicted, labels = np.asarray(predicted), np.asarray(labels)
    scorers = {"accuracy": lambda: np.mean(predicted == labels),
               "pearson": lambda: stats.pearsonr(predicted, labels)[0],
               "spearmanr": lambda: stats.spearmanr(predicted, labels)[0],
               "f1": lambda: f1_score(labels, predicted),
               "matthews_correlation": lambda: matthews_corrcoef(labels, predicted)}
    if metric not in scorers:
        raise ValueError(f"the bag-of-words baseline scores by {', '.join(scorers)}, not {metric!r}")
    return float(scorers[metric]())


def fit_bag_of_words(task, train, seed: int = 0) -> tuple[Callable, str]:
    """The bag-of-words model of `task` (a `TaskSpec`: its text columns, regression or not) fitted on the `train`
    rows (their "label" column): a function from rows to predictions, and the model's name."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression, Ridge

    def texts(rows):  # a pair's two texts as one bag
        return [" ".join(parts) for parts in zip(*(rows[column] for column in task.text_columns))]

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    features = vectorizer.fit_transform(texts(train))
    if task.is_regression:
        model, name = Ridge(alpha=1.0, random_state=seed), "Ridge(alpha=1)"
    else:
        model, name = LogisticRegression(C=1.0, max_iter=1000, random_state=seed), "LogisticRegression(C=1)"
    model.fit(features, train["label"])
    return lambda rows: model.predict(vectorizer.transform(texts(rows))), f"TF-IDF word 1-2-grams + {name}"
