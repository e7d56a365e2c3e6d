"""The floors a report reads every score against: what a trivial model scores on the same rows. A verdict whose two
arms both sit at or under their floor reads "no signal" (repro/stats.py). One cheap job each (repro/jobs.py), cached:

    python repro/floors.py bag_of_words --task rotten_tomatoes --max_train_samples 2000 --max_eval_samples 500 \
        --output F
    python repro/floors.py trivial_answer --task wiki_cloze --max_train_samples 2000 --max_eval_samples 500 \
        --output F
    python repro/floors.py unigram --export PRETRAINING/export --output F -- PRETRAINING_FLAGS

- bag_of_words (classification and regression; glue/baselines.py's model, which run_glue.py prints beside
  regression runs): TF-IDF of word unigrams and bigrams (sublinear tf), fitted on the training rows the
  fine-tunings read, with scikit-learn's LogisticRegression (C 1, classification) or Ridge (alpha 1, regression),
  scored on the same evaluation rows by the metric the task's spec scores it by (`Scoring.metric`; without one,
  accuracy or Pearson). Fixed settings, chosen before any result and never tuned.
- trivial_answer (extractive QA F1): every question answered with the context's first k words, k (0: no answer)
  the length whose answers score the best F1 on the training rows; scored with run_qa.py's own metric on its
  evaluation rows. It reads neither question nor answer type: a model under it has not learned to read the question.
- unigram (held-out MLM loss): the cross-entropy, in nats per token, of a unigram model of the pretraining's own
  training examples (token counts under its own tokenizer, plus one for every non-special token: Laplace) on its
  held-out examples, every non-special token counted. The examples are the pretraining's own (its flags read again:
  the same corpus, split, tokenizer and blocks). The MLM loss is the mean cross-entropy at masked positions, which
  the masking draws among the non-special tokens without regard to their identity, so the unigram loss over every
  non-special held-out token is what a model that learned only token frequencies scores there (span masking draws
  whole words, close to the same; Trainer also averages per batch, not per token).
  Beside it, under "bigram", the same tokens scored by a bigram count model of the same training examples that reads
  both neighbours of each target (`bigram_loss`): where an encoder sits between token frequencies and local context.
  It reads the neighbours as the text has them, which a masked model does not always see (a neighbour in the same
  masked span): a reference, not a gate; the unigram loss stays the floor an arm must clear.
Each writes `{"kind", "value", "metric", "description", ...}` to --output.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

KINDS = ("bag_of_words", "trivial_answer", "unigram")


def bag_of_words(task: str, max_train: int | None, max_eval: int | None, seed: int) -> dict:
    import numpy as np

    from encoder_zoo.glue.baselines import fit_bag_of_words, score
    from encoder_zoo.glue.tasks import first_samples, load_task

    spec, raw = load_task(task)
    raw = first_samples(raw, spec, max_train, max_eval)
    train, scored = raw["train"], raw[spec.validation_splits[0]]
    predict, model = fit_bag_of_words(spec, train, seed)  # run_glue.py prints it beside regression runs too
    metric = spec.scoring.metric if spec.scoring else "pearson" if spec.is_regression else "accuracy"
    value = score(metric, predict(scored), np.asarray(scored["label"]))
    return {"kind": "bag_of_words", "value": value, "metric": metric, "train_rows": len(train),
            "eval_rows": len(scored), "seed": seed,
            "description": f"{model} on {len(train)} training rows, {len(scored)} scored"}


def trivial_answer(task: str, max_train: int | None, max_eval: int | None) -> dict:
    from encoder_zoo.qa.data import load_qa, validate
    from encoder_zoo.qa.run_qa import MAX_ANSWER_WORDS, first_words_floor
    from encoder_zoo.qa.tasks import get_qa_task

    version_2 = get_qa_task(task).version_2
    raw = load_qa(task, None, None)
    rows = {}
    for split, limit in (("train", max_train), ("validation", max_eval)):
        records, _ = validate(raw[split], "error", f"{task} {split}")
        rows[split] = records.select(range(min(limit, len(records)))) if limit else records
    floor = first_words_floor(rows["train"], rows["validation"], version_2, limit=None)  # run_qa.py prints it too
    k = floor["words"]
    answer = "no answer" if k == 0 else f"the context's first {k} word{'s' * (k != 1)}"
    return {"kind": "trivial_answer", "value": floor["f1"], "metric": "f1", "words": k,
            "train_f1": floor["train_f1"], "train_rows": floor["train_questions"], "eval_rows": len(rows["validation"]),
            "description": f"{answer} for every question (k = {k} of 0-{MAX_ANSWER_WORDS} words, the best F1 on "
                           f"{floor['train_questions']} training questions)"}


def unigram(export: str, pretrain_flags: list[str]) -> dict:
    from transformers import AutoTokenizer

    from encoder_zoo.training import pretrain
    from encoder_zoo.training.run.export import unigram_loss

    args, training_args = pretrain.parse_args(pretrain_flags)
    recipe, _ = pretrain.check_recipe_arguments(args)
    text = pretrain.read_training_text(recipe, args, training_args)
    if text.validation_docs is None:
        raise ValueError(f"the pretraining flags hold no document out (--validation_documents): {pretrain_flags}")
    tokenizer = AutoTokenizer.from_pretrained(export)
    train, held_out = recipe.build_examples(text.train_docs, tokenizer, args), recipe.build_examples(
        text.validation_docs, tokenizer, args)
    size, special = len(tokenizer), sorted(set(tokenizer.all_special_ids))
    value, train_tokens, eval_tokens = unigram_loss(train, held_out, size, special)  # pretrain.py prints it too
    documents = (f"the {len(text.train_docs)} training documents' {{}} on the {len(text.validation_docs)} held-out "
                 "documents")
    bigram = bigram_loss(sequences(train), sequences(held_out), size, special)
    return {"kind": "unigram", "value": value, "metric": "eval_mlm_loss", "train_tokens": train_tokens,
            "eval_tokens": eval_tokens, "vocabulary": size,
            "description": f"unigram cross-entropy (nats/token) of {documents.format('token frequencies')}, same "
                           "tokenizer and examples",
            "bigram": {"kind": "bigram", "value": bigram, "description": (
                f"cross-entropy (nats/token) of {documents.format('bigram counts')}, each target read from both "
                "neighbours (P(w | left) P(right | w), each Witten-Bell interpolated with the unigram), same "
                "tokenizer, examples and targets")}}


def sequences(examples):
    for batch in examples.iter(batch_size=2048):
        yield from batch["input_ids"]


def bigram_loss(train, held_out, size: int, special) -> float:
    """Cross-entropy, nats per target, of a bigram count model of the `train` sequences (lists of token ids under a
    vocabulary of `size`) at every non-special token of the `held_out` sequences, given both its neighbours:

        P(w | l, r) = P(w | l) P(r | w) / sum over non-special w' of P(w' | l) P(r | w')

    the target's probability under a bigram chain that emits l, w, r. Each factor is Witten-Bell interpolated with a
    Laplace unigram, so no count is tuned: P(w | l) = (c(l, w) + n(l) u(w)) / (c(l) + n(l)), where c(l, w) counts
    l followed by the non-special w, c(l) their sum and n(l) the distinct w seen after l (an unseen l: u(w)); u is
    the unigram floor's law (non-special tokens, counts + 1). P(r | w) likewise over every following id r, with a
    Laplace law v over every id. A sequence's two ends read a boundary id of their own (`size`)."""
    import numpy as np
    from scipy import sparse

    boundary, ids = size, size + 1
    special = np.asarray(sorted(set(special)), dtype=np.int64)

    def pairs(rows):
        left, right = [], []
        for row in rows:
            row = np.concatenate([[boundary], np.asarray(row, dtype=np.int64), [boundary]])
            left.append(row[:-1])
            right.append(row[1:])
        return (np.concatenate(left), np.concatenate(right)) if left else (np.zeros(0, np.int64),) * 2

    left, right = pairs(train)
    counts = sparse.csr_matrix((np.ones(left.size), (left, right)), shape=(ids, ids))
    counts.sum_duplicates()
    target = np.ones(ids, dtype=bool)
    target[special], target[boundary] = False, False
    tokens = np.bincount(right, minlength=ids).astype(np.float64)  # each training token once (as a right neighbour)
    tokens[boundary] = 0
    unigram = np.where(target, tokens + 1.0, 0.0)
    unigram /= unigram.sum()
    every = tokens + 1.0
    every /= every.sum()

    def witten_bell(matrix):
        """Rows scaled by 1 / (c + n) and the weight of the unigram, n / (c + n) (1 for an unseen row)."""
        seen = np.asarray(matrix.sum(axis=1)).ravel()
        distinct = np.diff(matrix.indptr).astype(np.float64)
        scale = np.divide(1.0, seen + distinct, out=np.zeros(ids), where=seen > 0)
        return sparse.diags(scale) @ matrix, np.where(seen > 0, distinct * scale, 1.0)

    to_targets = (counts @ sparse.diags(target.astype(np.float64))).tocsr()
    to_targets.eliminate_zeros()
    follows, back_left = witten_bell(to_targets)  # follows[l, w]: P(w | l) without its unigram share
    precedes, back_right = witten_bell(counts)  # precedes[w, r]: P(r | w) without its unigram share
    follows, precedes = follows.tocsr(), precedes.tocsr()
    by_right = precedes.T.tocsr()  # row r: column r of precedes
    # sum over w of P(w | l) P(r | w), expanded: both counted parts, each count against the other's unigram share,
    # and both unigram shares.
    share_right = follows @ back_right  # [l]: sum_w follows[l, w] back_right[w]
    unigram_left = precedes.T @ unigram  # [r]: sum_w u(w) precedes[w, r]
    both_unigram = float(unigram @ back_right)

    left, right = pairs(held_out)
    at = np.flatnonzero(target[right[:-1]])  # right[at] is a target; left[at] its left, right[at + 1] its right
    w, lefts, rights = right[at], left[at], right[at + 1]
    total = 0.0
    for start in range(0, w.size, 4096):
        part = slice(start, start + 4096)
        before, t, r = lefts[part], w[part], rights[part]
        counted = np.asarray(follows[before].multiply(by_right[r]).sum(axis=1)).ravel()
        norm = (counted + every[r] * share_right[before] + back_left[before] * unigram_left[r]
                + back_left[before] * every[r] * both_unigram)
        p_left = np.asarray(follows[before, t]).ravel() + back_left[before] * unigram[t]
        p_right = np.asarray(precedes[t, r]).ravel() + back_right[t] * every[r]
        total -= np.log(p_left * p_right / norm).sum()
    return float(total / max(w.size, 1))


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--task", help="bag_of_words: a GLUE-style task; trivial_answer: a QA set (wiki_cloze...).")
    parser.add_argument("--max_train_samples", type=int, help="The first N training rows (default: all).")
    parser.add_argument("--max_eval_samples", type=int, help="The first N evaluation rows (default: all).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--export", help="unigram: the pretraining's export (its tokenizer).")
    parser.add_argument("--output", required=True, help="The JSON file to write.")
    own, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser.parse_args(own)
    args.pretrain_flags = rest
    if args.kind == "unigram" and not (args.export and rest):
        parser.error("unigram needs --export and the pretraining's flags after --")
    if args.kind != "unigram" and not args.task:
        parser.error(f"{args.kind} needs --task")
    return args


def main(argv=None) -> dict:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.kind == "bag_of_words":
        floor = bag_of_words(args.task, args.max_train_samples, args.max_eval_samples, args.seed)
    elif args.kind == "trivial_answer":
        floor = trivial_answer(args.task, args.max_train_samples, args.max_eval_samples)
    else:
        floor = unigram(args.export, args.pretrain_flags)
    if not math.isfinite(floor["value"]):
        raise ValueError(f"the {args.kind} floor came out {floor['value']} (constant predictions?)")
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    staged = output.with_name(f".{output.name}.{os.getpid()}")  # whole or not at all
    staged.write_text(json.dumps(floor, indent=1))
    os.replace(staged, output)
    print(json.dumps({k: v for k, v in floor.items() if k != "train_f1"}))
    return floor


def cli() -> None:
    from encoder_zoo.training.run.entry import run_cli

    run_cli(main, "floors.py")


if __name__ == "__main__":
    cli()
