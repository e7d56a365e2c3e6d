"""SQuAD v1.1 / v2.0 exact match and F1, identical to the official scripts on every input, as a local `evaluate`
module (the Hub's `squad`/`squad_v2` scripts are unreachable offline and transformers 5 ships none):
`evaluate.load("qa/metrics/squad_zoo", "v2")`.

Answers are normalised as the official scripts do (lower case, no punctuation, no articles a/an/the, single
spaces); each prediction scores the max over its gold answers. The two scripts differ on gold answers that
normalise to nothing ("the", "."), and each configuration follows its own:
- v1 (`evaluate-v1.1.py`): every gold answer counts, as written. Exact match compares normalised strings (so "" vs
  "." is a match); F1 is 0 whenever no token is shared, so two empty answers score F1 0.
- v2 (`evaluate-v2.0.py`): gold answers that normalise to nothing are dropped, and a question left with none is
  scored against "" (F1 1 when both are empty). A question is HasAns when its raw gold list is non-empty, even if
  every answer in it normalises to nothing.
v2 adds the HasAns/NoAns breakdown and the official best-threshold search (`best_exact`, `best_f1` and their
thresholds) over the no-answer scores.

Inputs are those of the `evaluate` metrics `squad` and `squad_v2`, so code written for them gives the same numbers:
predictions: [{"id", "prediction_text", "no_answer_probability" (v2)}]
references: [{"id", "answers": {"text": [...], "answer_start": [...]}}] (v2: an empty text list = unanswerable)
v2's `compute(..., no_answer_threshold=1.0)`: a question is predicted unanswerable when its
`no_answer_probability` exceeds the threshold (the default 1.0, for probabilities, never does). `qa/run_qa.py`
passes null odds (null score minus best span score) with threshold 0 instead.
A question without a prediction is an error here (v1.1 scores it 0 with a warning; v2.0 cannot score it).
"""

import collections
import math
import re
import string

import datasets
import evaluate

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text):
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_score(prediction, gold):
    return int(normalize_answer(prediction) == normalize_answer(gold))


def _token_f1(prediction_tokens, gold_tokens):
    common = collections.Counter(prediction_tokens) & collections.Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0
    precision, recall = overlap / len(prediction_tokens), overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score_v1(prediction, gold):
    """evaluate-v1.1.py's f1_score: 0 without a shared token, even when both answers normalise to nothing."""
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def f1_score_v2(prediction, gold):
    """evaluate-v2.0.py's compute_f1: when either side is empty, 1 if both are, else 0."""
    prediction_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not prediction_tokens or not gold_tokens:
        return int(prediction_tokens == gold_tokens)
    return _token_f1(prediction_tokens, gold_tokens)


def best_threshold(scores, no_answer_scores, has_answer, predicted_text):
    """The official find_best_thresh: start from predicting null everywhere, then answer the questions in increasing
    order of their no-answer score and keep the best running total.

    Two fixes keep the returned threshold the one that scores the returned best (null when score > threshold): when
    predicting null everywhere wins, the threshold lies just below the lowest score (the official script says 0.0),
    and questions with tied scores are answered together, as a threshold must."""
    ranked = sorted((q for q in no_answer_scores if q in scores), key=lambda q: no_answer_scores[q])
    score = best = sum(1 for q in has_answer if not has_answer[q])
    threshold = math.nextafter(no_answer_scores[ranked[0]], -math.inf) if ranked else 0.0
    for i, qid in enumerate(ranked):
        if has_answer[qid]:
            score += scores[qid]
        else:
            score += -1 if predicted_text[qid] else 0
        tied_with_next = i + 1 < len(ranked) and no_answer_scores[ranked[i + 1]] == no_answer_scores[qid]
        if score > best and not tied_with_next:
            best, threshold = score, no_answer_scores[qid]
    return 100.0 * best / len(scores), threshold


def _mean(scores, qids):
    return 100.0 * sum(scores[q] for q in qids) / len(qids)


class SquadZoo(evaluate.Metric):
    def _info(self):
        if self.config_name not in ("v1", "v2"):
            raise KeyError("Use the configuration 'v1' (SQuAD 1.1) or 'v2' (SQuAD 2.0).")
        prediction = {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")}
        if self.config_name == "v2":
            prediction["no_answer_probability"] = datasets.Value("float32")
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Rajpurkar et al. 2016, 2018 (SQuAD 1.1, 2.0).",
            inputs_description=__doc__,
            features=datasets.Features({
                "predictions": prediction,
                "references": {"id": datasets.Value("string"),
                               "answers": datasets.Sequence({"text": datasets.Value("string"),
                                                             "answer_start": datasets.Value("int32")})},
            }),
        )

    def _compute(self, predictions, references, no_answer_threshold=1.0):
        predicted = {p["id"]: p["prediction_text"] for p in predictions}
        missing = [r["id"] for r in references if r["id"] not in predicted]
        if missing:
            raise ValueError(f"No prediction for {len(missing)} questions, e.g. {missing[:3]}.")
        if self.config_name == "v1":
            return self._compute_v1(predicted, references)
        return self._compute_v2(predicted, {p["id"]: p["no_answer_probability"] for p in predictions}, references,
                                no_answer_threshold)

    @staticmethod
    def _compute_v1(predicted, references):
        unanswerable = [r["id"] for r in references if not r["answers"]["text"]]
        if unanswerable:
            raise ValueError(f"{len(unanswerable)} questions have no gold answer (e.g. {unanswerable[:3]}): SQuAD 1.1 "
                             "scoring needs one; use the 'v2' configuration for unanswerable questions.")
        exact = sum(max(exact_score(predicted[r["id"]], g) for g in r["answers"]["text"]) for r in references)
        f1 = sum(max(f1_score_v1(predicted[r["id"]], g) for g in r["answers"]["text"]) for r in references)
        return {"exact_match": 100.0 * exact / len(references), "f1": 100.0 * f1 / len(references),
                "total": len(references)}

    @staticmethod
    def _compute_v2(predicted, no_answer_scores, references, no_answer_threshold):
        has_answer = {r["id"]: bool(r["answers"]["text"]) for r in references}
        exact, f1 = {}, {}
        for r in references:
            gold = [t for t in r["answers"]["text"] if normalize_answer(t)] or [""]
            exact[r["id"]] = max(exact_score(predicted[r["id"]], g) for g in gold)
            f1[r["id"]] = max(f1_score_v2(predicted[r["id"]], g) for g in gold)

        def thresholded(scores):
            # Predicting null scores 1 exactly where the raw gold list is empty.
            return {q: float(not has_answer[q]) if no_answer_scores[q] > no_answer_threshold else s
                    for q, s in scores.items()}

        exact_t, f1_t = thresholded(exact), thresholded(f1)
        result = {"exact": _mean(exact_t, exact_t), "f1": _mean(f1_t, f1_t), "total": len(exact_t)}
        for name, keep in (("HasAns", True), ("NoAns", False)):
            subset = [q for q in has_answer if has_answer[q] == keep]
            if subset:
                result.update({f"{name}_exact": _mean(exact_t, subset), f"{name}_f1": _mean(f1_t, subset),
                               f"{name}_total": len(subset)})
        result["best_exact"], result["best_exact_thresh"] = best_threshold(exact, no_answer_scores, has_answer,
                                                                           predicted)
        result["best_f1"], result["best_f1_thresh"] = best_threshold(f1, no_answer_scores, has_answer, predicted)
        return result
