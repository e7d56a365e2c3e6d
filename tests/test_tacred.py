"""run_glue.py --task_name tacred: the SpanBERT authors' entity markers and micro-F1, a synthetic set in TACRED's JSON
that a tiny model learns, the spanbert preset's TACRED settings, and one-line refusals."""

import json

import evaluate
import numpy as np
import pytest
from helpers import call_cli, save_tiny_spanbert
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from encoder_zoo.glue.run_glue import METRIC_MODULE, main, parse_args
from encoder_zoo.glue.synthetic_sets import write_tacred
from encoder_zoo.glue.tacred import mark_entities
from encoder_zoo.glue.tasks import load_task
from encoder_zoo.training.data.resources import minilm_path


# ------------------------------------------------------------------------------------------------ the score
def authors_compute_f1(preds, labels):
    """code/run_tacred.py's compute_f1 (SpanBERT, facebookresearch), as written there."""
    n_gold = n_pred = n_correct = 0
    for pred, label in zip(preds, labels):
        if pred != 0:
            n_pred += 1
        if label != 0:
            n_gold += 1
        if (pred != 0) and (label != 0) and (pred == label):
            n_correct += 1
    if n_correct == 0:
        return {'precision': 0.0, 'recall': 0.0, 'f1': 0.0}
    else:
        prec = n_correct * 1.0 / n_pred
        recall = n_correct * 1.0 / n_gold
        if prec + recall > 0:
            f1 = 2.0 * prec * recall / (prec + recall)
        else:
            f1 = 0.0
        return {'precision': prec, 'recall': recall, 'f1': f1}


def test_the_score_is_the_authors_micro_f1_over_relations_other_than_no_relation():
    metric = evaluate.load(METRIC_MODULE, "tacred")
    rng = np.random.default_rng(0)
    for trial in range(30):
        labels = rng.choice(5, size=50, p=[0.6, 0.1, 0.1, 0.1, 0.1])
        preds = np.where(rng.random(50) < 0.6, labels, rng.integers(0, 5, size=50))
        ours = metric.compute(predictions=preds, references=labels)
        assert ours == pytest.approx(authors_compute_f1(preds, labels), abs=1e-12), trial
    # By hand: 2 of 3 relation predictions right, 2 of 5 gold relations found (a wrong relation for a gold one counts
    # against both); no_relation predicted for no_relation counts for nothing. F1 = 2 (2/3)(2/5) / (2/3 + 2/5).
    scores = metric.compute(predictions=[1, 2, 0, 0, 3, 0], references=[1, 2, 3, 4, 2, 0])
    assert scores == pytest.approx({"precision": 2 / 3, "recall": 2 / 5, "f1": 0.5})
    assert metric.compute(predictions=[0, 0], references=[1, 0]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


# ------------------------------------------------------------------------------------------------ the input
EXAMPLE = {"token": ["Bill", "Gates", "founded", "Microsoft", "-LRB-", "in", "1975", "-RRB-", "."], "subj_start": 0,
           "subj_end": 1, "obj_start": 3, "obj_end": 3, "subj_type": "PERSON", "obj_type": "ORGANIZATION",
           "relation": "org:founded_by"}


def test_entities_are_marked_as_the_authors_feature_modes_mark_them():
    assert mark_entities(EXAMPLE, "ner") == ("[SUBJ-PERSON] founded [OBJ-ORGANIZATION] ( in 1975 ) .",)
    assert mark_entities(EXAMPLE, "text") == (
        "[SUBJ-START] Bill Gates [SUBJ-END] founded [OBJ-START] Microsoft [OBJ-END] ( in 1975 ) .",)
    assert mark_entities(EXAMPLE, "text_ner") == (
        "[SUBJ-START] Bill Gates [SUBJ-END] founded [OBJ-START] Microsoft [OBJ-END] ( in 1975 ) .",
        "[SUBJ-PERSON] [OBJ-ORGANIZATION]")


def test_markers_are_new_whole_tokens_even_for_an_uncased_tokenizer_and_relations_keep_no_relation_first(tmp_path):
    write_tacred(tmp_path, train=40, dev=10)
    task, data = load_task("tacred", data_dir=str(tmp_path))
    assert task.label_names[0] == "no_relation" and set(task.label_names) == {
        "no_relation", "per:city_of_birth", "per:employee_of"}
    assert task.new_tokens == ("[OBJ-CITY]", "[OBJ-ORGANIZATION]", "[SUBJ-PERSON]")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())  # uncased WordPiece
    size = len(tokenizer)
    tokenizer.add_tokens(list(task.new_tokens), special_tokens=True)
    pieces = tokenizer.tokenize(data["train"][0]["sentence"])
    assert set(task.new_tokens) & set(pieces) and all(marker in pieces for marker in pieces if marker.startswith("["))
    assert {tokenizer.convert_tokens_to_ids(marker) for marker in task.new_tokens} == set(range(size, size + 3))


# ------------------------------------------------------------------------------------------------ fine-tuning
def test_a_tiny_zoo_model_learns_a_synthetic_tacred_set_with_resized_embeddings(tmp_path):
    data = write_tacred(tmp_path / "tacred")
    model = save_tiny_spanbert(tmp_path / "model", "SpanBertForSequenceClassification")
    results = main(["--model_name_or_path", model, "--trust_remote_code", "--ignore_mismatched_sizes",
                    "--task_name", "tacred", "--data_dir", str(data), "--learning_rate", "1e-3",
                    "--num_train_epochs", "6", "--per_device_train_batch_size", "16", "--output_dir",
                    str(tmp_path / "out")])
    dev = json.loads((data / "dev.json").read_text())
    relations = sorted({example["relation"] for example in dev} - {"no_relation"})
    # The best a constant answer scores: always one relation (always no_relation scores 0).
    constant = max(100 * constant_f1(dev, name) for name in relations)
    assert constant < 60
    median = results["tasks"]["tacred"]["median"]
    assert median["f1"] > constant + 30, median
    assert set(median) == {"f1", "precision", "recall"}
    saved = tmp_path / "out" / "tacred" / "seed-42"
    tokenizer = AutoTokenizer.from_pretrained(saved)
    trained = AutoModelForSequenceClassification.from_pretrained(saved, trust_remote_code=True)
    assert trained.get_input_embeddings().num_embeddings == len(tokenizer) == 30522 + 3
    assert trained.config.id2label[0] == "no_relation"
    assert tokenizer.tokenize("[SUBJ-PERSON] was born in [OBJ-CITY]") == [
        "[SUBJ-PERSON]", "was", "born", "in", "[OBJ-CITY]"]


@pytest.mark.parametrize("mode, markers", [
    ("text", {"[SUBJ-START]", "[SUBJ-END]", "[OBJ-START]", "[OBJ-END]"}),
    ("text_ner", {"[SUBJ-START]", "[SUBJ-END]", "[OBJ-START]", "[OBJ-END]", "[SUBJ-PERSON]", "[OBJ-CITY]",
                  "[OBJ-ORGANIZATION]"}),
])
def test_the_other_marker_modes_fine_tune_and_save_their_markers(tmp_path, mode, markers):
    data = write_tacred(tmp_path / "tacred", train=32, dev=8)
    model = save_tiny_spanbert(tmp_path / "model", "SpanBertForSequenceClassification")
    results = main(["--model_name_or_path", model, "--trust_remote_code", "--ignore_mismatched_sizes",
                    "--task_name", "tacred", "--data_dir", str(data), "--tacred_mode", mode, "--num_train_epochs", "1",
                    "--output_dir", str(tmp_path / "out")])
    assert 0 <= results["tasks"]["tacred"]["median"]["f1"] <= 100
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out" / "tacred" / "seed-42")
    assert set(tokenizer.get_added_vocab()) >= markers and len(tokenizer) == 30522 + len(markers)
    if mode == "text_ner":  # the type markers are the second segment
        encoded = tokenizer(*mark_entities(json.loads((data / "dev.json").read_text())[0], mode))
        second = [t for t, kind in zip(tokenizer.convert_ids_to_tokens(encoded["input_ids"]), encoded["token_type_ids"])
                  if kind == 1]
        assert second[0] == "[SUBJ-PERSON]" and second[-1] == "[SEP]" and len(second) == 3


def constant_f1(dev: list[dict], relation: str) -> float:
    """run_tacred.py's F1 of answering `relation` for every example."""
    names = ["no_relation", relation] + sorted({e["relation"] for e in dev} - {"no_relation", relation})
    ids = [names.index(e["relation"]) for e in dev]
    return authors_compute_f1([1] * len(dev), ids)["f1"]


def test_spanbert_preset_takes_the_authors_tacred_settings(tmp_path):
    args, training_args, _ = parse_args(["--model_name_or_path", minilm_path(), "--task_name", "tacred",
                                         "--preset", "spanbert", "--output_dir", str(tmp_path)])
    # README's TACRED command and run_tacred.py: lr 2e-5, batch 32, 10 epochs, length 128, 10% warmup then linear
    # decay; BertAdam's eps 1e-6, weight decay 0.01 (not on biases and LayerNorm), clipping 1.0.
    assert (training_args.learning_rate, training_args.per_device_train_batch_size,
            training_args.num_train_epochs, args.max_seq_length) == (2e-5, 32, 10, 128)
    assert (training_args.warmup_steps, training_args.lr_scheduler_type.value, training_args.adam_epsilon,
            training_args.weight_decay, training_args.max_grad_norm) == (0.1, "linear", 1e-6, 0.01, 1.0)
    assert args.tacred_mode == "ner"


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("change, expected", [
    (lambda e: e.pop("subj_type"), "dev.json, example 0 (id e7a100000000): field 'subj_type' is missing, not str"),
    (lambda e: e.update(obj_end=99), "example 0 (id e7a100000000): obj_start"),
    (lambda e: e.update(relation="org:parents"), "dev.json, example 0: relation 'org:parents' is not in the training "
                                                 "file"),
])
def test_bad_tacred_data_is_named_in_one_line(tmp_path, change, expected):
    data = write_tacred(tmp_path / "tacred", train=20, dev=4)
    dev = json.loads((data / "dev.json").read_text())
    change(dev[0])
    (data / "dev.json").write_text(json.dumps(dev))
    result = call_cli("encoder_zoo.glue.run_glue", "--model_name_or_path", minilm_path(), "--task_name", "tacred",
                      "--data_dir", str(data), "--output_dir", str(tmp_path / "out"))
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and last.startswith("run_glue.py: error: ") and expected in last, last


def test_tacred_without_data_says_where_it_comes_from(tmp_path):
    result = call_cli("encoder_zoo.glue.run_glue", "--model_name_or_path", minilm_path(), "--task_name", "tacred",
                      "--output_dir", str(tmp_path / "out"))
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "TACRED is distributed by the LDC (LDC2018T24)" in last and "--data_dir" in last
    result = call_cli("encoder_zoo.glue.run_glue", "--model_name_or_path", minilm_path(), "--task_name", "tacred",
                      "--data_dir", str(tmp_path), "--tacred_mode", "entity", "--output_dir", str(tmp_path / "out"))
    assert "--tacred_mode 'entity': choose one of ner, text, text_ner" in result.stderr
