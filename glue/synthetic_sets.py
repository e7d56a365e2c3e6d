"""Tiny synthetic NER and TACRED sets in the formats users bring, for a first run of glue/run_ner.py and
`glue/run_glue.py --task_name tacred` (no labelled NER or relation data ships with any installable package).

    python -m encoder_zoo.glue.synthetic_sets ner --output_dir runs/small/ner-data     # train/dev .jsonl and .txt
    python -m encoder_zoo.glue.synthetic_sets tacred --output_dir runs/small/tacred-data   # train.json, dev.json

Sentences come from a few templates with names drawn from short lists: a model that learns them shows the pipeline
works, nothing more. NER: the same sentences as JSON lines (`tokens`, string `ner_tags`, BIO) and as CoNLL-2003
files (word POS chunk NER, `-DOCSTART-`, blank lines). TACRED: its released JSON layout (one list per file, the
Stanford CoreNLP columns included).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

PEOPLE = ["John Smith", "Mary Jones", "Ali Khan", "Wei Chen", "Anna Berg", "Tom Hardy", "Sara Lee", "Omar Said", "Mary",
          "Omar"]
PLACES = ["Paris", "New York", "Lagos", "Kyoto", "Buenos Aires", "Oslo", "Cairo", "Perth"]
ORGS = ["Acme Corp", "Globex", "Initech", "Umbrella Inc", "Hooli", "Vandelay Industries"]
NER_TEMPLATES = ["{PER} flew to {LOC} on Monday .", "{PER} joined {ORG} last year .",
                 "The office of {ORG} in {LOC} closed .", "{PER} met {PER} in {LOC} .",
                 "Shares of {ORG} rose sharply .", "It rained all day ."]
TACRED_TEMPLATES = [  # relation, the object's type, the sentence ({S}: subject, {O}: object)
    ("per:city_of_birth", "CITY", "{S} was born in {O} in 1970 ."),
    ("per:city_of_birth", "CITY", "Born in {O} -LRB- then a town -RRB- , {S} later moved away ."),
    ("per:employee_of", "ORGANIZATION", "{S} works for {O} as an engineer ."),
    ("per:employee_of", "ORGANIZATION", "{O} hired {S} last year ."),
    ("no_relation", "CITY", "{S} visited {O} for a week ."),
    ("no_relation", "ORGANIZATION", "{S} read about {O} in the paper ."),
]
NAMES = {"PER": PEOPLE, "LOC": PLACES, "ORG": ORGS}


def tagged_sentence(rng: random.Random) -> tuple[list[str], list[str]]:
    """A sentence of a template, its entities drawn from the lists, tagged BIO."""
    tokens, tags = [], []
    for word in rng.choice(NER_TEMPLATES).split():
        if word.startswith("{"):
            kind = word[1:-1]
            for i, part in enumerate(rng.choice(NAMES[kind]).split()):
                tokens.append(part)
                tags.append(("B-" if i == 0 else "I-") + kind)
        else:
            tokens.append(word)
            tags.append("O")
    return tokens, tags


def write_ner(folder: Path, train: int = 300, dev: int = 60, seed: int = 0) -> dict[str, Path]:
    """train/dev as JSON lines and as CoNLL-2003 column files, the same sentences in both."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = {}
    for name, count in (("train", train), ("dev", dev)):
        rows = [tagged_sentence(rng) for _ in range(count)]
        paths[f"{name}.jsonl"] = folder / f"{name}.jsonl"
        paths[f"{name}.jsonl"].write_text("".join(json.dumps({"tokens": tokens, "ner_tags": tags}) + "\n"
                                                  for tokens, tags in rows))
        lines = ["-DOCSTART- -X- -X- O", ""]
        for tokens, tags in rows:
            lines += [f"{word} NNP I-NP {tag}" for word, tag in zip(tokens, tags)] + [""]
        paths[f"{name}.txt"] = folder / f"{name}.txt"
        paths[f"{name}.txt"].write_text("\n".join(lines) + "\n")
    return paths


def tacred_example(rng: random.Random, index: int) -> dict:
    """One example with every field of TACRED's released JSON."""
    relation, obj_type, template = rng.choice(TACRED_TEMPLATES)
    subject, obj = rng.choice(PEOPLE[:8]).split(), rng.choice(PLACES if obj_type == "CITY" else ORGS).split()
    tokens, spans = [], {}
    for word in template.split():
        if word in ("{S}", "{O}"):
            words = subject if word == "{S}" else obj
            spans[word] = (len(tokens), len(tokens) + len(words) - 1)
            tokens += words
        else:
            tokens.append(word)
    n = len(tokens)
    return {"id": f"e7a1{index:08x}", "docid": f"APW_ENG_{index:08d}", "relation": relation, "token": tokens,
            "subj_start": spans["{S}"][0], "subj_end": spans["{S}"][1], "obj_start": spans["{O}"][0],
            "obj_end": spans["{O}"][1], "subj_type": "PERSON", "obj_type": obj_type, "stanford_pos": ["NNP"] * n,
            "stanford_ner": ["O"] * n, "stanford_head": list(range(n)), "stanford_deprel": ["dep"] * n}


def write_tacred(folder: Path, train: int = 240, dev: int = 60, seed: int = 0) -> Path:
    """train.json and dev.json as TACRED ships them: one JSON list per file."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for name, count in (("train.json", train), ("dev.json", dev)):
        (folder / name).write_text(json.dumps([tacred_example(rng, i) for i in range(count)]))
    return folder


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=("ner", "tacred"))
    parser.add_argument("--output_dir", required=True, help="Where the files go (created).")
    parser.add_argument("--train", type=int, default=None, help="Training examples (ner 300, tacred 240).")
    parser.add_argument("--dev", type=int, default=60, help="Evaluation examples.")
    args = parser.parse_args(argv)
    folder = Path(args.output_dir)
    if args.task == "ner":
        written = list(write_ner(folder, args.train or 300, args.dev).values())
    else:
        write_tacred(folder, args.train or 240, args.dev)
        written = [folder / "train.json", folder / "dev.json"]
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
