"""Windows over long contexts and the post-processing of start/end logits back to answer text."""

from __future__ import annotations

import collections

import numpy as np


def check_doc_stride(args, text: str) -> None:
    """Refuse a --doc_stride that leaves a window no new `text` (context, passage text) after the overlap."""
    room = args.max_seq_length - args.max_question_length - 3  # [CLS] question [SEP] context [SEP]
    if args.doc_stride >= room:
        raise ValueError(f"--doc_stride {args.doc_stride} leaves no new {text} per window: it must be below "
                         f"--max_seq_length - --max_question_length - 3 = {room}.")


def truncate_questions(questions, tokenizer, max_question_length: int) -> list[str]:
    """Cut questions longer than `max_question_length` tokens, so every window keeps room for the context."""
    encoded = tokenizer([q.lstrip() for q in questions], add_special_tokens=False, return_offsets_mapping=True)
    return [q.lstrip()[: offsets[max_question_length - 1][1]] if len(offsets) > max_question_length else q.lstrip()
            for q, offsets in zip(questions, encoded["offset_mapping"])]


def encode_windows(examples, tokenizer, max_seq_length: int, doc_stride: int, max_question_length: int,
                   extra_inputs=None):
    """`extra_inputs`: inputs a model needs beyond the tokenizer's (training/run/task_inputs.py), added per window."""
    pad_right = tokenizer.padding_side == "right"
    questions = truncate_questions(examples["question"], tokenizer, max_question_length)
    texts = (questions, examples["context"]) if pad_right else (examples["context"], questions)
    encoded = tokenizer(*texts, truncation="only_second" if pad_right else "only_first", max_length=max_seq_length,
                        stride=doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True)
    if extra_inputs is not None:
        encoded.update(extra_inputs(encoded, texts))
    return encoded, (1 if pad_right else 0)


def prepare_train_features(examples, tokenizer, max_seq_length: int, doc_stride: int, max_question_length: int = 64,
                           extra_inputs=None):
    """Question + context windows (`doc_stride` overlap) with start/end token labels; an answer outside a window,
    and an unanswerable question, point at the null position ([CLS], index 0)."""
    encoded, context_id = encode_windows(examples, tokenizer, max_seq_length, doc_stride, max_question_length,
                                         extra_inputs)
    sample_map = encoded.pop("overflow_to_sample_mapping")
    starts, ends = [], []
    for index, offsets in enumerate(encoded["offset_mapping"]):
        cls_index = (encoded["input_ids"][index].index(tokenizer.cls_token_id)
                     if tokenizer.cls_token_id in encoded["input_ids"][index] else 0)
        answers = examples["answers"][sample_map[index]]
        sequence_ids = encoded.sequence_ids(index)
        if not answers["answer_start"]:
            starts.append(cls_index), ends.append(cls_index)
            continue
        start_char = answers["answer_start"][0]
        end_char = start_char + len(answers["text"][0])
        context_tokens = [i for i, s in enumerate(sequence_ids) if s == context_id]
        first, last = context_tokens[0], context_tokens[-1]
        if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
            starts.append(cls_index), ends.append(cls_index)  # the answer is not inside this window
            continue
        token_start = first
        while token_start <= last and offsets[token_start][1] <= start_char:
            token_start += 1
        token_end = last
        while token_end >= first and offsets[token_end][0] >= end_char:
            token_end -= 1
        starts.append(token_start), ends.append(token_end)
    encoded["start_positions"], encoded["end_positions"] = starts, ends
    encoded.pop("offset_mapping")
    return encoded


def prepare_validation_features(examples, tokenizer, max_seq_length: int, doc_stride: int,
                                max_question_length: int = 64, extra_inputs=None):
    """Windows plus `example_id` and offsets that are None outside the context, for post-processing."""
    encoded, context_id = encode_windows(examples, tokenizer, max_seq_length, doc_stride, max_question_length,
                                         extra_inputs)
    sample_map = encoded.pop("overflow_to_sample_mapping")
    encoded["example_id"] = []
    for index in range(len(encoded["input_ids"])):
        sequence_ids = encoded.sequence_ids(index)
        encoded["example_id"].append(examples["id"][sample_map[index]])
        encoded["offset_mapping"][index] = [o if sequence_ids[k] == context_id else None
                                            for k, o in enumerate(encoded["offset_mapping"][index])]
    return encoded


def postprocess_predictions(examples, features, start_logits, end_logits, n_best_size: int = 20,
                            max_answer_length: int = 30, version_2: bool = False):
    """Best span per example over all its windows, mapped back to the context text.

    Returns (predictions: id -> best non-null answer text, nbest: id -> list of candidates, null_odds: id -> null
    score minus best span score; > threshold means "no answer" in SQuAD 2.0).
    """
    features_per_example = collections.defaultdict(list)
    for index, example_id in enumerate(features["example_id"]):
        features_per_example[example_id].append(index)
    predictions, nbest, null_odds = {}, {}, {}
    for example in examples:
        context = example["context"]
        candidates, null_score = [], None
        for index in features_per_example[example["id"]]:
            starts, ends, offsets = start_logits[index], end_logits[index], features["offset_mapping"][index]
            feature_null = float(starts[0] + ends[0])
            null_score = feature_null if null_score is None else min(null_score, feature_null)
            for s in np.argsort(starts)[-1 : -n_best_size - 1 : -1].tolist():
                for e in np.argsort(ends)[-1 : -n_best_size - 1 : -1].tolist():
                    if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                        continue
                    if e < s or e - s + 1 > max_answer_length:
                        continue
                    candidates.append({"text": context[offsets[s][0] : offsets[e][1]],
                                       "score": float(starts[s] + ends[e]),
                                       "start_logit": float(starts[s]), "end_logit": float(ends[e]),
                                       "offsets": (offsets[s][0], offsets[e][1])})
        candidates = sorted(candidates, key=lambda c: c["score"], reverse=True)[:n_best_size]
        if not candidates:
            candidates = [{"text": "", "score": 0.0, "start_logit": 0.0, "end_logit": 0.0, "offsets": (0, 0)}]
        scores = np.array([c["score"] for c in candidates])
        probabilities = np.exp(scores - scores.max())
        for candidate, probability in zip(candidates, probabilities / probabilities.sum()):
            candidate["probability"] = float(probability)
        predictions[example["id"]] = candidates[0]["text"]
        nbest[example["id"]] = candidates
        null_odds[example["id"]] = (null_score if null_score is not None else 0.0) - candidates[0]["score"]
    return predictions, nbest, null_odds
