"""SQuAD v1.1 / v2.0 exact match and F1 with the official definitions, as a local `evaluate` module (the Hub's
`squad`/`squad_v2` scripts are unreachable offline and transformers 5 ships none):
`evaluate.load("qa/metrics/squad_zoo", "v2")`.

Answers are normalised as the official script does (lower case, no punctuation, no articles a/an/the, single
spaces); each prediction scores the max over its gold answers. v2 adds the HasAns/NoAns breakdown and the
best-threshold search over the null odds (`best_exact`, `best_f1` and their thresholds), so the no-answer threshold
is tuned on the dev set instead of fixed at 0.

predictions: [{"id", "prediction_text", "no_answer_probability" (v2: null odds, higher = more likely null)}]
references: [{"id", "answers": {"text": [...], "answer_start": [...]}}] (an empty text list = unanswerable)
"""

import collections
import re
import string

import datasets
import evaluate


def normalize_answer(text):
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_score(prediction, gold):
    return int(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction, gold):
    prediction_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not prediction_tokens or not gold_tokens:
        return float(prediction_tokens == gold_tokens)  # both empty (no answer) scores 1, else 0
    common = collections.Counter(prediction_tokens) & collections.Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(prediction_tokens), overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def best_threshold(scores, null_odds, has_answer, predicted_text):
    """The official find_best_thresh: sweep thresholds over the sorted null odds."""
    score = best = sum(1 for q in scores if not has_answer[q])
    threshold = 0.0
    for qid in sorted(scores, key=lambda q: null_odds[q]):
        if has_answer[qid]:
            score += scores[qid]
        else:
            score += -1 if predicted_text[qid] else 0
        if score > best:
            best, threshold = score, null_odds[qid]
    return 100.0 * best / len(scores), threshold


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
                               "answers": datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")})},
            }),
        )

    def _compute(self, predictions, references, null_threshold=0.0):
        gold = {r["id"]: [t for t in r["answers"]["text"] if normalize_answer(t)] for r in references}
        predicted = {p["id"]: p["prediction_text"] for p in predictions}
        missing = sorted(set(gold) - set(predicted))
        if missing:
            raise ValueError(f"No prediction for {len(missing)} questions, e.g. {missing[:3]}.")
        has_answer = {q: bool(answers) for q, answers in gold.items()}
        exact = {q: max(exact_score(predicted[q], g) for g in (gold[q] or [""])) for q in gold}
        f1 = {q: max(f1_score(predicted[q], g) for g in (gold[q] or [""])) for q in gold}
        if self.config_name == "v1":
            return {"exact_match": 100.0 * sum(exact.values()) / len(exact), "f1": 100.0 * sum(f1.values()) / len(f1),
                    "total": len(exact)}
        odds = {p["id"]: p["no_answer_probability"] for p in predictions}

        def thresholded(scores):
            # Predicting null scores 1 exactly where there is no gold answer.
            return {q: float(not has_answer[q]) if odds[q] > null_threshold else s for q, s in scores.items()}

        exact_t, f1_t = thresholded(exact), thresholded(f1)
        result = {"exact": 100.0 * sum(exact_t.values()) / len(exact_t), "f1": 100.0 * sum(f1_t.values()) / len(f1_t),
                  "total": len(exact_t)}
        for name, keep in (("HasAns", True), ("NoAns", False)):
            subset = [q for q in gold if has_answer[q] == keep]
            if subset:
                result[f"{name}_exact"] = 100.0 * sum(exact_t[q] for q in subset) / len(subset)
                result[f"{name}_f1"] = 100.0 * sum(f1_t[q] for q in subset) / len(subset)
                result[f"{name}_total"] = len(subset)
        result["best_exact"], result["best_exact_thresh"] = best_threshold(exact, odds, has_answer, predicted)
        result["best_f1"], result["best_f1_thresh"] = best_threshold(f1, odds, has_answer, predicted)
        return result
