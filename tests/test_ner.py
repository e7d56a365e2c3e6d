"""glue/run_ner.py: entity scores against a port of conlleval, both file formats, sub-token labels, every family's
token-classification head on a synthetic set it learns, and one-line refusals."""

import json
import random
from pathlib import Path

import evaluate
import pytest
import yaml
from helpers import call_cli, save_tiny_spanbert
from transformers import AutoTokenizer

from encoder_zoo import models
from encoder_zoo.glue.ner import align_labels, first_sub_tokens, load_ner
from encoder_zoo.glue.run_ner import METRIC_MODULE, main
from encoder_zoo.glue.synthetic_sets import write_ner
from encoder_zoo.training.data.resources import minilm_path


# ------------------------------------------------------------------------------------------------ conlleval's rules
def conlleval_chunks(tags: list[str]) -> set[tuple[int, int, str]]:
    """(start, end, type) of every chunk, by conlleval.pl's startOfChunk and endOfChunk (B/I/E/O tags)."""
    chunks, start, previous, previous_type = set(), None, "O", ""
    for position, tag in enumerate([*tags, "O"]):
        kind, kind_type = (tag, "") if tag == "O" else tag.split("-", 1)
        ends = ((previous, kind) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"),
                                     ("E", "O")} or (previous != "O" and previous_type != kind_type))
        starts = ((previous, kind) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"),
                                       ("O", "E")} or (kind != "O" and previous_type != kind_type))
        if ends and start is not None:
            chunks.add((start, position - 1, previous_type))
            start = None
        if starts:
            start = position
        previous, previous_type = kind, kind_type
    return chunks


def conlleval_scores(references, predictions) -> dict[str, float]:
    gold = {(row, *chunk) for row, tags in enumerate(references) for chunk in conlleval_chunks(tags)}
    guessed = {(row, *chunk) for row, tags in enumerate(predictions) for chunk in conlleval_chunks(tags)}
    correct = len(gold & guessed)
    precision = correct / len(guessed) if guessed else 0.0
    recall = correct / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if correct else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def test_entity_scores_are_conllevals_on_random_and_malformed_tag_sequences():
    """BIO, IOB1 (I- opening an entity) and ill-formed sequences (I-LOC after B-PER) alike."""
    metric = evaluate.load(METRIC_MODULE)
    rng = random.Random(1)
    tags = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG", "B-ORG"]
    for trial in range(20):
        references = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(30)]
        predictions = [[tag if rng.random() < 0.7 else rng.choice(tags) for tag in sentence] for sentence in references]
        ours = metric.compute(predictions=predictions, references=references)
        expected = conlleval_scores(references, predictions)
        for key in ("precision", "recall", "f1"):
            assert ours[key] == pytest.approx(expected[key], abs=1e-12), (trial, key)
        for kind in ("PER", "LOC", "ORG"):
            only = lambda rows, kind=kind: [[t if t.endswith(kind) else "O" for t in row] for row in rows]  # noqa: E731
            assert ours.get(kind, {"f1": 0.0})["f1"] == pytest.approx(
                conlleval_scores(only(references), only(predictions))["f1"], abs=1e-12)


def test_entity_scores_by_hand():
    """Gold: PER (0-1), LOC (3); predicted: PER (0-1) right, ORG (3) wrong, a LOC opened by I- (5) spurious."""
    scores = evaluate.load(METRIC_MODULE).compute(
        references=[["B-PER", "I-PER", "O", "B-LOC", "O", "O"]],
        predictions=[["B-PER", "I-PER", "O", "B-ORG", "O", "I-LOC"]])
    assert (scores["precision"], scores["recall"]) == pytest.approx((1 / 3, 1 / 2))
    assert scores["f1"] == pytest.approx(0.4) and scores["accuracy"] == pytest.approx(4 / 6)
    assert scores["PER"]["f1"] == 1.0 and scores["LOC"]["recall"] == 0.0


# ------------------------------------------------------------------------------------------------ data
def test_json_lines_and_conll_files_read_the_same_sentences(tmp_path):
    paths = write_ner(tmp_path, train=20, dev=5)
    labels, from_json = load_ner(None, str(paths["train.jsonl"]), str(paths["dev.jsonl"]))
    labels_conll, from_conll = load_ner(None, str(paths["train.txt"]), str(paths["dev.jsonl"]))
    assert labels == labels_conll == sorted(labels) and "O" in labels and "B-PER" in labels
    for split in ("train", "validation"):
        assert from_json[split]["tokens"] == from_conll[split]["tokens"]
        assert from_json[split]["ner_tags"] == from_conll[split]["ner_tags"]


def test_sub_token_labels_follow_transformers_run_ner():
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    words, tags = ["Vandelay", "Industries", "hired", "Omar"], ["B-ORG", "I-ORG", "O", "B-PER"]
    label2id = {tag: i for i, tag in enumerate(["B-ORG", "B-PER", "I-ORG", "I-PER", "O"])}
    word_ids = tokenizer(words, is_split_into_words=True).word_ids()
    assert len(word_ids) > len(words) + 2  # "Vandelay" splits into several pieces
    first = align_labels(word_ids, tags, label2id, label_all_tokens=False)
    every = align_labels(word_ids, tags, label2id, label_all_tokens=True)
    positions = first_sub_tokens(word_ids)
    assert [first[p] for p in positions] == [label2id[t] for t in tags]
    assert sum(label != -100 for label in first) == len(words)
    pieces_of_first_word = [i for i, w in enumerate(word_ids) if w == 0]
    assert [every[i] for i in pieces_of_first_word] == [label2id["B-ORG"]] + [label2id["I-ORG"]] * (
        len(pieces_of_first_word) - 1)
    assert every[0] == every[-1] == -100  # [CLS] and [SEP]


# ------------------------------------------------------------------------------------------------ fine-tuning
@pytest.fixture(scope="module")
def synthetic_set(tmp_path_factory):
    return write_ner(tmp_path_factory.mktemp("ner_data"))


def best_constant_f1(references) -> float:
    """The best entity F1 (points) of one tag answered for every word."""
    metric = evaluate.load(METRIC_MODULE)
    tags = sorted({tag for row in references for tag in row})
    return max(100 * metric.compute(predictions=[[tag] * len(row) for row in references],
                                    references=references)["f1"] for tag in tags)


def test_a_tiny_zoo_model_learns_the_conll_files_and_writes_every_seed(tmp_path, synthetic_set):
    model = save_tiny_spanbert(tmp_path / "model", "SpanBertForTokenClassification")
    output = tmp_path / "out"
    results = main(["--model_name_or_path", model, "--trust_remote_code", "--ignore_mismatched_sizes",
                    "--train_file", str(synthetic_set["train.txt"]), "--validation_file", str(synthetic_set["dev.txt"]),
                    "--learning_rate", "1e-3", "--num_train_epochs", "5", "--per_device_train_batch_size", "16",
                    "--seeds", "1", "2", "--add_to_model_card", "--output_dir", str(output)])
    gold = [json.loads(line)["ner_tags"] for line in synthetic_set["dev.jsonl"].read_text().splitlines()]
    constant = best_constant_f1(gold)
    assert constant < 40
    assert results["median"]["f1"] > constant + 40, results["median"]
    saved = json.loads((output / "ner_results.json").read_text())
    assert [run["seed"] for run in saved["runs"]] == [1, 2] and saved["median"] == results["median"]
    assert saved["median"]["f1"] == pytest.approx(sorted(run["metrics"]["f1"] for run in saved["runs"])[0] / 2
                                                  + sorted(run["metrics"]["f1"] for run in saved["runs"])[1] / 2)
    assert set(saved["runs"][0]["per_type"]) == {"PER", "LOC", "ORG"}
    for seed in (1, 2):
        rows = [json.loads(line) for line in (output / f"seed-{seed}" / "predictions.jsonl").read_text().splitlines()]
        assert [row["gold_tags"] for row in rows] == gold
        assert all(len(row["predicted_tags"]) == len(row["tokens"]) for row in rows)
        # The file's predictions give the run's reported score.
        scores = evaluate.load(METRIC_MODULE).compute(predictions=[row["predicted_tags"] for row in rows],
                                                      references=gold)
        run = next(run for run in saved["runs"] if run["seed"] == seed)
        assert 100 * scores["f1"] == pytest.approx(run["metrics"]["f1"])
        card = (output / f"seed-{seed}" / "README.md").read_text()
        meta = yaml.safe_load(card.split("---")[1])
        assert meta["pipeline_tag"] == "token-classification" and "AutoModelForTokenClassification" in card
        result = meta["model-index"][0]["results"][0]
        assert result["task"]["type"] == "token-classification"
        assert result["dataset"]["type"] == "local:train"


def tiny_family_model(family: str, folder: Path) -> str:
    import torch

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    config = models.get_class(family, "AutoConfig")(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=128, **({"embedding_size": 32} if family == "teams" else {}),
        **({"bos_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id,
            "sep_token_id": tokenizer.sep_token_id} if family == "cloze" else {}))
    torch.manual_seed(0)
    models.get_class(family, "AutoModelForTokenClassification")(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


# Learning rate and epochs. A random tiny cloze model's outputs are small (no final LayerNorm; std ~0.01): its tagger
# needs larger and more steps. The transformers encoder is the pretrained MiniLM (22M parameters): few steps.
SETTINGS = {"teams": ("2e-3", "12"), "cloze": ("5e-3", "20"), "transformers": ("3e-4", "2")}


@pytest.mark.parametrize("family", [pytest.param(family, marks=pytest.mark.slow) if family == "transformers" else family
                                    for family in SETTINGS])  # MiniLM's 22M parameters: 13 to 33 s here
def test_every_token_classification_head_learns_with_every_sub_token_labelled(tmp_path, synthetic_set, family):
    """TEAMS and the cloze model (SpanBERT above) through trust_remote_code, and a plain transformers BERT."""
    model = minilm_path() if family == "transformers" else tiny_family_model(family, tmp_path / family)
    results = main(["--model_name_or_path", model, "--trust_remote_code", "--ignore_mismatched_sizes",
                    "--train_file", str(synthetic_set["train.jsonl"]), "--validation_file",
                    str(synthetic_set["dev.jsonl"]), "--label_all_tokens", "--max_seq_length", "64",
                    "--learning_rate", SETTINGS[family][0], "--num_train_epochs", SETTINGS[family][1],
                    "--per_device_train_batch_size", "16", "--output_dir", str(tmp_path / "out")])
    assert results["median"]["f1"] > 60, results["median"]


# ------------------------------------------------------------------------------------------------ refusals
def hire_and_bertac(folder: Path) -> dict[str, str]:
    from encoder_zoo.models.bertac.configuration_bertac import BertacCnnConfig, BertacConfig
    from encoder_zoo.models.hire.configuration_hire import HireConfig

    backbone = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 16, "num_hidden_layers": 1,
                "num_attention_heads": 2, "intermediate_size": 32}
    configs = {"hire": HireConfig(backbone_config=backbone),
               "bertac": BertacConfig(backbone_config=backbone, cnn_config=BertacCnnConfig(
                   vocab_size=20, word_embedding_dim=8, filter_windows=[1], num_filters=4, mask_token_id=1,
                   pad_token_id=0).to_dict())}
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    paths = {}
    for name, config in configs.items():
        config.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
        paths[name] = str(folder / name)
    return paths


def test_hire_and_bertac_are_refused_in_one_line(tmp_path, synthetic_set):
    for name, path in hire_and_bertac(tmp_path).items():
        result = call_cli("encoder_zoo.glue.run_ner", "--model_name_or_path", path, "--trust_remote_code",
                          "--train_file", str(synthetic_set["train.jsonl"]), "--validation_file",
                          str(synthetic_set["dev.jsonl"]), "--output_dir", str(tmp_path / f"out-{name}"))
        assert result.returncode == 2
        message = result.stderr.strip().splitlines()[-1]
        assert message.startswith("run_ner.py: error: --model_name_or_path") and "Traceback" not in result.stderr
        assert f"model type {name!r} defines no token-classification head" in message
        assert "SequenceClassification" in message and "glue/run_glue.py" in message


@pytest.mark.parametrize("problem, train, expected", [
    ("a tag that is no BIO tag", [{"tokens": ["a", "b"], "ner_tags": ["O", "X-PER"]}],
     "the train file {train}, sentence 0, word 1 ('b'): tag 'X-PER' is not O, B-TYPE or I-TYPE"),
    ("one tag short", [{"tokens": ["a", "b"], "ner_tags": ["O"]}],
     "the train file {train}, sentence 0: 2 words but 1 tags"),
    ("no tags column", [{"tokens": ["a"], "labels": ["O"]}],
     "Column 'ner_tags' not found in the train file {train}; its columns are ['tokens', 'labels']. Set --tags_column"),
    ("a validation tag never trained", [{"tokens": ["a", "b"], "ner_tags": ["O", "B-PER"]}],
     "sentence 0: tag 'B-LOC' never occurs in the training data"),
])
def test_bad_data_is_named_in_one_line(tmp_path, problem, train, expected):
    train_file, dev_file = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    train_file.write_text("".join(json.dumps(row) + "\n" for row in train))
    dev_file.write_text(json.dumps({"tokens": ["a"], "ner_tags": ["B-LOC"]}) + "\n")
    result = call_cli("encoder_zoo.glue.run_ner", "--model_name_or_path", minilm_path(), "--train_file",
                      str(train_file), "--validation_file", str(dev_file), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2, problem
    lines = result.stderr.strip().splitlines()
    assert expected.format(train=train_file) in lines[-1] and lines[-1].startswith("run_ner.py: error: ")


def test_a_conll_file_without_a_tag_column_and_offline_conll2003_are_refused(tmp_path, monkeypatch):
    words = tmp_path / "words.txt"
    words.write_text("EU\nrejects\n\n")
    result = call_cli("encoder_zoo.glue.run_ner", "--model_name_or_path", minilm_path(), "--train_file", str(words),
                      "--validation_file", str(words), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2 and "has no tag column" in result.stderr.strip().splitlines()[-1]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = call_cli("encoder_zoo.glue.run_ner", "--model_name_or_path", minilm_path(), "--dataset", "conll2003",
                      "--output_dir", str(tmp_path / "out2"))
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "--dataset conll2003 comes from the Hub (eriktks/conll2003)" in last
    assert "--train_file/--validation_file" in last


def test_a_seed_named_twice_is_refused(tmp_path):
    paths = write_ner(tmp_path, train=4, dev=2)
    result = call_cli("encoder_zoo.glue.run_ner", "--model_name_or_path", minilm_path(), "--train_file",
                      str(paths["train.jsonl"]), "--validation_file", str(paths["dev.jsonl"]), "--seeds", "1", "1",
                      "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2 and "--seeds names seed 1 more than once" in result.stderr.strip().splitlines()[-1]


def test_conll2003_online_is_asked_at_its_parquet_conversion_and_its_tag_ids_become_names(monkeypatch):
    """The Hub path as far as it runs here: datasets.load_dataset stands in for the Hub and answers in CoNLL-2003's
    schema (id, tokens, pos/chunk/ner ids with ClassLabel names)."""
    import datasets
    from huggingface_hub import constants

    from encoder_zoo.glue import tasks

    names = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    features = datasets.Features({"id": datasets.Value("string"),
                                  "tokens": datasets.Sequence(datasets.Value("string")),
                                  "pos_tags": datasets.Sequence(datasets.Value("int64")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names))})
    split = datasets.Dataset.from_dict({"id": ["0"], "tokens": [["EU", "rejects", "German", "call"]],
                                        "pos_tags": [[22, 42, 16, 21]], "ner_tags": [[3, 0, 7, 0]]},
                                       features=features)
    asked = []
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(tasks, "hub_unreachable", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: asked.append((a, k)) or datasets.DatasetDict(
        train=split, validation=split, test=split))
    labels, raw = load_ner("conll2003", None, None)
    assert asked == [(("eriktks/conll2003", None), {"revision": "refs/convert/parquet"})]
    assert raw["train"][0] == {"tokens": ["EU", "rejects", "German", "call"],
                               "ner_tags": ["B-ORG", "O", "B-MISC", "O"]}
    assert labels == ["B-MISC", "B-ORG", "O"]


def test_ctrl_c_says_which_seeds_were_saved(tmp_path, monkeypatch):
    """A Ctrl-C in the second seed's training: exit 130, seed 1's model, predictions and scores kept and named."""
    from encoder_zoo.training.run.trainer import FineTuningTrainer

    paths = write_ner(tmp_path / "data", train=16, dev=4)
    model = save_tiny_spanbert(tmp_path / "model", "SpanBertForTokenClassification")
    calls, train = [], FineTuningTrainer.train

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return train(self, *args, **kwargs)

    monkeypatch.setattr(FineTuningTrainer, "train", interrupted)
    result = call_cli("encoder_zoo.glue.run_ner", "--model_name_or_path", model, "--trust_remote_code",
                      "--ignore_mismatched_sizes", "--train_file", str(paths["train.jsonl"]), "--validation_file",
                      str(paths["dev.jsonl"]), "--num_train_epochs", "1", "--seeds", "1", "2", "--output_dir",
                      str(tmp_path / "out"))
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 130 and last.startswith("run_ner.py: interrupted (Ctrl-C). Saved: seed 1: "), last
    partial = json.loads((tmp_path / "out" / "ner_results.partial.json").read_text())
    assert [run["seed"] for run in partial["finished_runs"]] == [1]
    assert (tmp_path / "out" / "seed-1" / "predictions.jsonl").is_file()
    assert not (tmp_path / "out" / "ner_results.json").exists()
