"""Open-domain QA data: each question with several retrieved passages and its answer strings.

Schema, one row per question: `id`, `question`, `answers` (list of strings), `passages` (list of strings).

Sources:
- `wiki_open` (embedded, offline): derived from the real Wikipedia text of `wiki_cloze` (qa/data.py); see
  `build_wiki_open` and qa/README.md.
- `search_qa` (online): SearchQA (Dunn et al., 2017) from the Hub (`kyunghyuncho/search_qa`, configuration
  `train_test_val`): each Jeopardy! question with the Google snippets retrieved for it.
- local JSON / JSON Lines files in the schema above (`--train_file`, `--validation_file`), e.g. Quasar-T or SearchQA
  as preprocessed by Lin et al. (2018), the splits the BERTAC paper uses, converted to these four fields.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
from pathlib import Path

import datasets
from tqdm.auto import tqdm

from encoder_zoo.training.run import split_sentences

logger = logging.getLogger(__name__)
EMBEDDED_OPEN = ("wiki_open",)
HUB_OPEN = {"search_qa": ("kyunghyuncho/search_qa", "train_test_val")}
FIELDS = ("id", "question", "answers", "passages")


def answer_position(passage: str, answers: list[str]) -> tuple[str, int] | None:
    """The first whole-word, case-insensitive occurrence of any answer in a passage (distant supervision, as Lin et
    al. label their passages): `(text as written in the passage, character offset)`, or None."""
    best = None
    for answer in answers:
        if not answer.strip():
            continue
        match = re.search(rf"(?<!\w){re.escape(answer.strip())}(?!\w)", passage, flags=re.IGNORECASE)
        if match and (best is None or match.start() < best[1]):
            best = (match.group(0), match.start())
    return best


def build_wiki_open(cloze: datasets.DatasetDict, num_passages: int = 10, sentences_per_passage: int = 2,
                    seed: int = 0) -> datasets.DatasetDict:
    """A multi-passage set from `wiki_cloze` questions (real Wikipedia lead sections, cloze questions).

    Per question: its article (without the question's own sentence) is cut into passages of
    `sentences_per_passage` consecutive sentences; the passage that holds the answer's first occurrence is kept, and
    so are the article's other passages (topical distractors, as a retriever returns); passages of other articles of
    the same split, drawn at random (seeded by the question), fill up to `num_passages`; the passages are then
    shuffled. Labels come later, by string match, so a distractor that happens to hold the answer counts as positive.
    """
    splits = {}
    for split, questions in cloze.items():
        passages_of = {}
        for title, context in zip(questions["title"], questions["context"]):
            sentences = split_sentences(context)
            passages_of[title] = [" ".join(sentences[i : i + sentences_per_passage])
                                  for i in range(0, len(sentences), sentences_per_passage)]
        pool = [(title, passage) for title, passages in passages_of.items() for passage in passages]
        rows = {field: [] for field in FIELDS}
        for record in tqdm(questions, desc=f"Building wiki_open {split}", leave=False):
            answers = record["answers"]["text"]
            own = passages_of[record["title"]]
            if not answers or not any(answer_position(p, answers) for p in own):
                continue  # the sentence split moved the answer across passages: no gold passage
            rng = random.Random(int(hashlib.md5(f"{seed}|{record['id']}".encode()).hexdigest(), 16))
            chosen = list(own[:num_passages])
            others = [p for title, p in pool if title != record["title"]]
            chosen += rng.sample(others, min(num_passages - len(chosen), len(others)))
            rng.shuffle(chosen)
            rows["id"].append(record["id"])
            rows["question"].append(record["question"])
            rows["answers"].append(list(answers))
            rows["passages"].append(chosen)
        splits[split] = datasets.Dataset.from_dict(rows)
    return datasets.DatasetDict(splits)


def load_open_file(path: str | Path) -> datasets.Dataset:
    """A local JSON list or JSON Lines file of {id, question, answers, passages} records."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Open-domain QA file {path} does not exist.")
    text = path.read_text(encoding="utf-8")
    try:
        records = (json.loads(text) if text.lstrip().startswith("[")
                   else [json.loads(line) for line in text.splitlines() if line.strip()])
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is neither a JSON list nor JSON Lines: {error}") from error
    if not isinstance(records, list) or not records:
        raise ValueError(f"{path} holds no records; it needs a JSON list, or one JSON object per line, of records with "
                         "question, answers (a list of strings) and passages (a list of strings), and optionally id.")
    wrapped = []
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"{path}, record {index}: {_short(record)} is not an object with question, answers and "
                             "passages.")
        missing = [field for field in ("question", "answers", "passages") if field not in record]
        if missing:
            raise ValueError(f"{path}, record {index}: missing {missing}; its keys are {sorted(record)}. Each record "
                             "needs question, answers (a list of strings) and passages (a list of strings), and "
                             "optionally id.")
        if isinstance(record["answers"], str):  # one answer given bare: a list of one, not a list of its letters
            record["answers"] = [record["answers"]]
            wrapped.append(index)
        for field in ("answers", "passages"):
            values = record[field]
            if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
                raise ValueError(f"{path}, record {index}: {field} is {_short(values)}; it must be a list of strings. "
                                 "Fix that record.")
        if not isinstance(record["question"], str):
            raise ValueError(f"{path}, record {index}: question is {_short(record['question'])} "
                             f"({type(record['question']).__name__}), not text. Fix that record.")
        record.setdefault("id", f"{path.stem}-{index}")
        record["id"] = str(record["id"])
    if wrapped:
        logger.info("%s: %d records give their answer as a string, not a list (records %s); each is read as a list "
                    "of that one answer.", path, len(wrapped),
                    ", ".join(map(str, wrapped[:5])) + (", ..." if len(wrapped) > 5 else ""))
    return datasets.Dataset.from_list([{field: record[field] for field in FIELDS} for record in records])


def _short(value, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def load_open_qa(dataset: str | None, train_file: str | None = None, validation_file: str | None = None,
                 cache_dir: str | None = None, num_passages: int = 10,
                 wiki_articles: int = 4000) -> datasets.DatasetDict:
    if train_file or validation_file:
        return datasets.DatasetDict({split: load_open_file(path) for split, path in
                                     (("train", train_file), ("validation", validation_file)) if path})
    if dataset in EMBEDDED_OPEN:
        from encoder_zoo.qa.data import build_wiki_cloze

        return build_wiki_open(build_wiki_cloze(articles=wiki_articles, cache_dir=cache_dir), num_passages=num_passages)
    if dataset not in HUB_OPEN:
        raise ValueError(f"Unknown --dataset {dataset!r}: use {', '.join([*EMBEDDED_OPEN, *HUB_OPEN])} or "
                         "--train_file/--validation_file (JSON records with question, answers, passages).")
    from encoder_zoo.glue.tasks import load_hub_dataset

    hub_id, config = HUB_OPEN[dataset]
    raw = load_hub_dataset(hub_id, config, f"--dataset {dataset}",
                           "Offline, use the embedded set (--dataset wiki_open), "
                           "or local records (--train_file/--validation_file: JSON with question, answers, passages).")
    columns = set(raw["train"].column_names)
    if not {"question", "answer", "search_results"} <= columns:
        raise ValueError(f"{hub_id} has the columns {sorted(columns)}, not question/answer/search_results; convert it "
                         "to JSON records with question, answers and passages and pass --train_file/--validation_file.")
    convert = lambda record, index: {"id": f"{dataset}-{index}", "question": record["question"],  # noqa: E731
                                     "answers": [record["answer"]],
                                     "passages": [s for s in record["search_results"]["snippets"] if s]}
    return datasets.DatasetDict({split: raw[split].map(convert, with_indices=True,
                                                       remove_columns=raw[split].column_names,
                                                       desc=f"Converting {dataset} {split}")
                                 for split in ("train", "validation") if split in raw})


def check_unique_ids(questions: datasets.Dataset, source: str) -> None:
    """Refuse a repeated question id as `run_qa.py` does (`qa.data.validate`): the selector's and the reader's
    scores are combined per question id, so two questions with one id would silently merge."""
    from encoder_zoo.qa.data import MalformedRecordError, duplicate_id

    seen: dict = {}
    for index, question_id in enumerate(questions["id"]):
        problem = duplicate_id(question_id, seen)
        if problem:
            raise MalformedRecordError(f"{source}: record {question_id!r} (row {index}): {problem}. Fix it.")
        seen[question_id] = index


def passage_pairs(questions: datasets.Dataset) -> datasets.Dataset:
    """One SQuAD-schema row per (question, passage): id `qid|i`, the passage as context, and as answer the first
    occurrence of a gold answer in it (none: the passage is a negative)."""
    rows = {"id": [], "question_id": [], "question": [], "context": [], "answers": []}
    for record in questions:
        for index, passage in enumerate(record["passages"]):
            found = answer_position(passage, record["answers"])
            rows["id"].append(f"{record['id']}|{index}")
            rows["question_id"].append(record["id"])
            rows["question"].append(record["question"])
            rows["context"].append(passage)
            rows["answers"].append({"text": [found[0]] if found else [], "answer_start": [found[1]] if found else []})
    return datasets.Dataset.from_dict(rows)
