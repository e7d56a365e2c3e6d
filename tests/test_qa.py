"""Extractive QA harness: windows, post-processing, official metrics, threshold tuning, embedded data, end to end."""

import json
from pathlib import Path

import datasets
import evaluate
import numpy as np
import pytest
from helpers import call_cli, save_tiny_spanbert
from transformers import AutoTokenizer

from encoder_zoo import models  # noqa: F401
from encoder_zoo.qa.data import MalformedRecordError, build_wiki_cloze, validate
from encoder_zoo.qa.processing import postprocess_predictions, prepare_train_features, prepare_validation_features
from encoder_zoo.qa.run_qa import METRIC_MODULE, main
from encoder_zoo.training.data.resources import minilm_path

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def wiki(tmp_path_factory):
    return build_wiki_cloze(with_unanswerable=True, articles=600, cache_dir=str(tmp_path_factory.mktemp("cache")))


def squad_file(path, records):
    data = [{"title": "t", "paragraphs": [{"context": r["context"], "qas": [
        {"id": r["id"], "question": r["question"], "is_impossible": not r["answers"],
         "answers": [{"text": t, "answer_start": s} for t, s in r["answers"]]}]}]} for r in records]
    path.write_text(json.dumps({"version": "v2.0", "data": data}))
    return str(path)


def test_wiki_cloze_is_real_extractive_qa(wiki):
    train, validation = wiki["train"], wiki["validation"]
    assert len(train) > 200 and len(validation) > 10
    assert not set(train["title"]) & set(validation["title"])  # split by article
    unanswerable = 0
    for record in train:
        assert "[" in record["question"] and "]" in record["question"]
        answers = record["answers"]
        if not answers["text"]:
            unanswerable += 1
            continue
        start = answers["answer_start"][0]
        assert record["context"][start : start + len(answers["text"][0])] == answers["text"][0]
        # The context is the rest of the article: the question's own sentence is not in it.
        import re

        sentence = re.sub(r"\[[^\]]+\]", answers["text"][0], record["question"], count=1)
        assert sentence not in record["context"]
    assert 0.2 < unanswerable / len(train) < 0.45
    # The articles come in alphabetical order: a split's first rows (--max_train_samples) are a random sample of it.
    ranks = {title: rank for rank, title in enumerate(sorted(train["title"]))}
    head = [ranks[title] / len(train) for title in train["title"][:100]]
    assert 0.4 < np.mean(head) < 0.6 and max(head) > 0.9


def test_wiki_cloze_build_shows_progress_and_caches_where_datasets_does(tmp_path, monkeypatch, capsys):
    import datasets.config

    from encoder_zoo.qa.data import default_cache_dir

    # The same folder as `datasets` (which read the environment when imported), then each variable in turn.
    assert default_cache_dir() == Path(datasets.config.HF_DATASETS_CACHE) / "encoder-zoo"
    for name in ("HF_DATASETS_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    assert default_cache_dir() == Path.home() / ".cache" / "huggingface" / "datasets" / "encoder-zoo"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "huggingface" / "datasets" / "encoder-zoo"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert default_cache_dir() == tmp_path / "hf" / "datasets" / "encoder-zoo"
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "ds"))
    assert default_cache_dir() == tmp_path / "ds" / "encoder-zoo"
    # The build shows a progress bar and lands in that cache.
    data = build_wiki_cloze(articles=8)
    assert "Building wiki_cloze" in capsys.readouterr().err and len(data["train"]) + len(data["validation"]) > 0
    assert [p.name for p in (tmp_path / "ds" / "encoder-zoo").iterdir()] == ["wiki_cloze_v1_8_0.json"]


def test_windows_recover_the_gold_answer_text(wiki, tokenizer):
    answerable = wiki["train"].filter(lambda r: len(r["answers"]["text"]) > 0).select(range(120))
    features = prepare_train_features(answerable[:], tokenizer, max_seq_length=96, doc_stride=16,
                                      max_question_length=40)
    assert len(features["input_ids"]) > len(answerable)  # long contexts were split into windows
    validation = prepare_validation_features(answerable[:], tokenizer, max_seq_length=96, doc_stride=16,
                                             max_question_length=40)
    position = {qid: i for i, qid in enumerate(answerable["id"])}
    recovered = inside = 0
    for index, (start, end) in enumerate(zip(features["start_positions"], features["end_positions"])):
        if start == 0:
            assert end == 0
            continue
        inside += 1
        offsets = validation["offset_mapping"][index]
        example = answerable[position[validation["example_id"][index]]]
        text = example["context"][offsets[start][0] : offsets[end][1]]
        recovered += text == example["answers"]["text"][0]
    assert inside > 100 and recovered == inside
    # Every example has at least one window that contains its answer.
    windows_with_answer = {validation["example_id"][i] for i, s in enumerate(features["start_positions"]) if s}
    assert windows_with_answer == set(answerable["id"])


def test_postprocessing_on_crafted_logits(tokenizer):
    context = "The Eiffel Tower is in Paris. It opened in 1889 and is 330 metres tall."
    example = {"id": "q1", "question": "When did it open?", "context": context,
               "answers": {"text": ["1889"], "answer_start": [context.index("1889")]}}
    examples = datasets.Dataset.from_list([example])
    features = prepare_validation_features(examples[:], tokenizer, max_seq_length=64, doc_stride=16)
    tokens = tokenizer.convert_ids_to_tokens(features["input_ids"][0])
    width = len(tokens)
    start, end = np.full((1, width), -5.0), np.full((1, width), -5.0)
    year = tokens.index("1889")
    start[0, year], end[0, year] = 4.0, 4.0
    # A higher-scoring but invalid span (end before start) and one in the question must be ignored.
    question_token = tokens.index("open")
    start[0, question_token], end[0, question_token] = 9.0, 9.0
    start[0, year + 1], end[0, year - 1] = 8.0, 8.0
    predictions, nbest, odds = postprocess_predictions(examples, features, start, end, n_best_size=5,
                                                       max_answer_length=5)
    assert predictions["q1"] == "1889"
    assert odds["q1"] == pytest.approx((-5.0 - 5.0) - 8.0)  # null score minus best span score
    assert abs(sum(c["probability"] for c in nbest["q1"]) - 1) < 1e-6
    # max_answer_length: a long span loses to a short one even when scored higher.
    paris = tokens.index("paris")
    start[0, tokens.index("tower")], end[0, paris] = 20.0, 20.0  # "Tower is in Paris": 4 tokens
    predictions, _, _ = postprocess_predictions(examples, features, start, end, n_best_size=5, max_answer_length=3)
    assert predictions["q1"] == "1889"
    predictions, _, _ = postprocess_predictions(examples, features, start, end, n_best_size=5, max_answer_length=4)
    assert predictions["q1"] == "Tower is in Paris"


def test_metrics_on_hand_checked_cases():
    v1 = evaluate.load(METRIC_MODULE, "v1")
    refs = [{"id": "a", "answers": {"text": ["Eiffel Tower", "the tower"], "answer_start": [0, 0]}},
            {"id": "b", "answers": {"text": ["in 1889"], "answer_start": [0]}}]
    preds = [{"id": "a", "prediction_text": "The  EIFFEL tower!"}, {"id": "b", "prediction_text": "1889 and"}]
    # a: normalised "eiffel tower" == gold -> EM 1. b: tokens {1889, and} vs {in, 1889}: P=1/2 R=1/2 F1=1/2.
    assert v1.compute(predictions=preds, references=refs) == {"exact_match": 50.0, "f1": 75.0, "total": 2}
    v2 = evaluate.load(METRIC_MODULE, "v2")
    refs2 = refs + [{"id": "c", "answers": {"text": [], "answer_start": []}}]
    preds2 = [{**p, "no_answer_probability": -1.0} for p in preds] + [{"id": "c", "prediction_text": "x",
                                                                        "no_answer_probability": 2.0}]
    result = v2.compute(predictions=preds2, references=refs2, no_answer_threshold=0.0)  # null odds, as run_qa passes
    assert result["HasAns_exact"] == 50.0 and result["HasAns_f1"] == 75.0 and result["HasAns_total"] == 2
    assert result["NoAns_exact"] == 100.0 and result["NoAns_total"] == 1  # odds 2 > 0: predicted null, correctly
    assert result["exact"] == pytest.approx(200 / 3) and result["f1"] == pytest.approx(250 / 3)  # (100 + 50 + 100) / 3


def refs(*golds):
    return [{"id": f"q{i}", "answers": {"text": list(gold), "answer_start": [0] * len(gold)}}
            for i, gold in enumerate(golds)]


def preds(*texts, no_answer=None):
    return [{"id": f"q{i}", "prediction_text": text,
             **({} if no_answer is None else {"no_answer_probability": no_answer[i]})}
            for i, text in enumerate(texts)]


def test_v1_scores_gold_answers_that_normalise_to_nothing_as_the_official_script():
    v1 = evaluate.load(METRIC_MODULE, "v1")
    # evaluate-v1.1.py: "" == normalize("the") gives EM 1, but F1 needs a shared token, so 0 (not 100).
    assert v1.compute(predictions=preds(""), references=refs(["the"])) == {"exact_match": 100.0, "f1": 0.0, "total": 1}
    # Every gold answer counts as written: "." keeps its EM credit for an empty prediction ...
    assert v1.compute(predictions=preds(""), references=refs([".", "x"])) == {"exact_match": 100.0, "f1": 0.0,
                                                                              "total": 1}
    # ... and a real answer scores as usual next to it.
    assert v1.compute(predictions=preds("the x!"), references=refs([".", "x"])) == {"exact_match": 100.0, "f1": 100.0,
                                                                                    "total": 1}
    with pytest.raises(ValueError, match="no gold answer.*'v2'"):
        v1.compute(predictions=preds("x"), references=refs([]))


def test_v2_counts_a_question_whose_answers_normalise_to_nothing_as_hasans():
    v2 = evaluate.load(METRIC_MODULE, "v2")
    # evaluate-v2.0.py: HasAns is decided by the raw gold list; the answers that normalise to nothing are then
    # dropped and the question is scored against "" (F1 1 when both are empty).
    result = v2.compute(predictions=preds("", "The", "cat", no_answer=[0.0, 0.0, 0.0]),
                        references=refs(["the"], [".", "a"], ["the"]))
    assert result["HasAns_total"] == 3 and "NoAns_total" not in result
    assert result["HasAns_exact"] == result["HasAns_f1"] == pytest.approx(200 / 3)
    # A gold list with "." and a real answer keeps only the real one.
    result = v2.compute(predictions=preds("", no_answer=[0.0]), references=refs([".", "x"]))
    assert (result["exact"], result["f1"]) == (0.0, 0.0)
    # Predicted null on such a question: the official script scores it 0 (a HasAns question answered null).
    result = v2.compute(predictions=preds("", no_answer=[0.9]), references=refs(["the"]), no_answer_threshold=0.5)
    assert result["exact"] == 0.0


def test_v2_takes_the_squad_v2_metric_arguments_and_defaults():
    v2 = evaluate.load(METRIC_MODULE, "v2")
    references = refs(["Paris"], [])
    # `squad_v2`'s default no_answer_threshold is 1.0 on probabilities: 0.9 is not "no answer", so the
    # unanswerable question answered "London" scores 0 ...
    default = v2.compute(predictions=preds("Paris", "London", no_answer=[0.1, 0.9]), references=references)
    assert (default["exact"], default["NoAns_exact"], default["HasAns_exact"]) == (50.0, 0.0, 100.0)
    # ... and with no_answer_threshold=0.5 it is predicted null, correctly.
    tuned = v2.compute(predictions=preds("Paris", "London", no_answer=[0.1, 0.9]), references=references,
                       no_answer_threshold=0.5)
    assert (tuned["exact"], tuned["NoAns_exact"]) == (100.0, 100.0)
    # The best-threshold search ranks by the same scores: answering only below 0.9 is perfect.
    assert (default["best_exact"], default["best_exact_thresh"]) == (100.0, pytest.approx(0.1))
    with pytest.raises(TypeError):
        v2.compute(predictions=preds("Paris", no_answer=[0.1]), references=refs(["Paris"]), null_threshold=0.0)


def test_v2_threshold_tuning_beats_a_fixed_zero_threshold():
    v2 = evaluate.load(METRIC_MODULE, "v2")
    refs = [{"id": "a", "answers": {"text": ["Paris"], "answer_start": [0]}},
            {"id": "b", "answers": {"text": [], "answer_start": []}},
            {"id": "c", "answers": {"text": [], "answer_start": []}}]
    # The model's null odds are all negative (it never says "no answer" at threshold 0), but they rank the
    # unanswerable questions above the answerable one: a threshold of -3 gets everything right.
    preds = [{"id": "a", "prediction_text": "Paris", "no_answer_probability": -3.0},
             {"id": "b", "prediction_text": "London", "no_answer_probability": -1.0},
             {"id": "c", "prediction_text": "Rome", "no_answer_probability": -0.5}]
    result = v2.compute(predictions=preds, references=refs, no_answer_threshold=0.0)
    assert result["exact"] == pytest.approx(100 / 3)
    assert result["best_exact"] == 100.0 and result["best_f1"] == 100.0 and result["best_f1_thresh"] == -3.0


@pytest.mark.parametrize("null_odds, answers, predicted", [
    ([-1.0, -2.0, 0.5, 3.0], [[], [], [], ["Paris"]], ["x", "y", "z", "Rome"]),  # null everywhere wins
    ([-2.0, -2.0, 1.0, 1.0], [["Paris"], [], ["Rome"], []], ["Paris", "x", "Rome", "y"]),  # tied scores
    ([-3.0, -1.0, 2.0, 4.0], [["Paris"], ["Rome"], [], []], ["Paris", "Rome", "x", "y"]),  # an interior optimum
])
def test_v2_written_threshold_reproduces_the_best_score(null_odds, answers, predicted):
    """Scoring at the written best threshold gives the written best score (the official script says 0.0 when
    predicting null everywhere wins, and splits tied scores that no threshold can split)."""
    v2 = evaluate.load(METRIC_MODULE, "v2")
    references = refs(*answers)
    predictions = preds(*predicted, no_answer=null_odds)
    result = v2.compute(predictions=predictions, references=references, no_answer_threshold=0.0)
    for kind in ("exact", "f1"):
        rescored = v2.compute(predictions=predictions, references=references,
                              no_answer_threshold=result[f"best_{kind}_thresh"])
        assert rescored[kind] == pytest.approx(result[f"best_{kind}"]), kind
    if null_odds[0] == -1.0:
        assert result["best_exact"] == 75.0 and result["best_exact_thresh"] < -2.0


def test_malformed_records_are_named_or_skipped():
    good = {"id": "ok", "question": "q?", "context": "Paris is big.",
            "answers": {"text": ["Paris"], "answer_start": [0]}}
    bad = {"id": "bad-7", "question": "q?", "context": "Paris is big.",
           "answers": {"text": ["Paris"], "answer_start": [3]}}
    data = datasets.Dataset.from_list([good, bad])
    with pytest.raises(MalformedRecordError, match="bad-7.*not at offset 3"):
        validate(data, "error")
    kept, skipped = validate(data, "skip")
    assert skipped == ["'bad-7' (row 1): answer 'Paris' is not at offset 3 (found 'is is')"] and kept["id"] == ["ok"]
    with pytest.raises(MalformedRecordError, match="lacks the fields"):
        validate(data.remove_columns("context"), "error")


@pytest.fixture(scope="module")
def tiny_zoo_qa(tmp_path_factory):
    return save_tiny_spanbert(tmp_path_factory.mktemp("tiny_qa"), "SpanBertForQuestionAnswering")


def test_end_to_end_tiny_run_with_a_zoo_model(tmp_path, wiki, tiny_zoo_qa, capsys):
    train = squad_file(tmp_path / "train.json", [
        {"id": r["id"], "question": r["question"], "context": r["context"],
         "answers": list(zip(r["answers"]["text"], r["answers"]["answer_start"]))}
        for r in wiki["train"].select(range(40))])
    valid = squad_file(tmp_path / "valid.json", [
        {"id": r["id"], "question": r["question"], "context": r["context"],
         "answers": list(zip(r["answers"]["text"], r["answers"]["answer_start"]))}
        for r in wiki["validation"].select(range(20))])
    results = main(["--model_name_or_path", tiny_zoo_qa, "--trust_remote_code", "--train_file", train,
                    "--validation_file", valid, "--output_dir", str(tmp_path / "out"), "--max_seq_length", "128",
                    "--doc_stride", "32", "--max_question_length", "48", "--num_train_epochs", "1",
                    "--per_device_train_batch_size", "8", "--add_to_model_card"])
    assert results["version_2"] is True
    assert {"exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh"} <= set(results["eval"])
    out = tmp_path / "out"
    predictions = json.loads((out / "predictions.json").read_text())
    assert len(predictions) == 20 and set(json.loads((out / "null_odds.json").read_text())) == set(predictions)
    # run_qa scores null odds with threshold 0: the same numbers as the written predictions (null = "") scored
    # with no question predicted null by the metric.
    qas = [article["paragraphs"][0]["qas"][0] for article in json.loads(Path(valid).read_text())["data"]]
    references = [{"id": qa["id"], "answers": {"text": [a["text"] for a in qa["answers"]],
                                               "answer_start": [a["answer_start"] for a in qa["answers"]]}}
                  for qa in qas]
    rescored = evaluate.load(METRIC_MODULE, "v2").compute(
        predictions=[{"id": q, "prediction_text": t, "no_answer_probability": 0.0} for q, t in predictions.items()],
        references=references)
    assert (rescored["exact"], rescored["f1"]) == (results["eval"]["exact"], results["eval"]["f1"])
    assert all(len(v) <= 20 for v in json.loads((out / "nbest_predictions.json").read_text()).values())
    # Beside the score, the first-words floor on the same questions: k chosen on the training ones, scored as above.
    floor = results["first_words_floor"]
    answered = [{"id": qa["id"], "prediction_text": " ".join(article["paragraphs"][0]["context"].split()[
        :floor["words"]]), "no_answer_probability": 0.0}
        for article, qa in zip(json.loads(Path(valid).read_text())["data"], qas)]
    assert floor["f1"] == evaluate.load(METRIC_MODULE, "v2").compute(predictions=answered, references=references)["f1"]
    assert floor["train_f1"][floor["words"]] == max(floor["train_f1"].values()) and floor["train_questions"] == 40
    assert (f"QA results: F1 {results['eval']['f1']:.2f}, exact match {results['eval']['exact']:.2f}; first-words "
            f"floor F1 {floor['f1']:.2f}") in capsys.readouterr().out
    # The model-index, read back by huggingface_hub: percentages as computed, the file by its own id, the seed named.
    from huggingface_hub import ModelCard

    written = {r.metric_type: r for r in ModelCard.load(out / "README.md").data.eval_results}
    assert set(written) == {"exact", "f1", "best_exact", "best_f1"}
    for name, r in written.items():
        assert (r.metric_value == pytest.approx(results["eval"][name], abs=1e-4)
                and r.metric_name == f"{name} (1 seed: 42)")
        assert (r.dataset_type, r.dataset_name, r.dataset_split) == ("local:valid", "valid.json", "validation")
    assert str(tmp_path) not in (out / "README.md").read_text()
    from transformers import AutoModelForQuestionAnswering

    assert (type(AutoModelForQuestionAnswering.from_pretrained(out, trust_remote_code=True)).__name__
            == "SpanBertForQuestionAnswering")
    assert (not list(out.rglob("training_args.bin"))
            and json.loads((out / "training_args.json").read_text())["seed"] == 42)
    from encoder_zoo.training.data.tokenizer import LOADING_STATE

    assert not set(LOADING_STATE) & set(json.loads((out / "tokenizer_config.json").read_text()))  # no machine's state


def test_a_new_qa_head_is_the_same_for_the_same_seed(tmp_path, wiki):
    """A pretraining export has no QA head: run_qa makes one. Two runs with one --seed in one process (the global RNG
    moved on between them) train the same weights and score the same; another seed does not."""
    import torch
    from safetensors.torch import load_file

    pretrained = save_tiny_spanbert(tmp_path / "pretrained", "SpanBertForPreTraining")
    records = [{"id": r["id"], "question": r["question"], "context": r["context"],
                "answers": list(zip(r["answers"]["text"], r["answers"]["answer_start"]))}
               for r in wiki["train"].select(range(24))]
    train = squad_file(tmp_path / "train.json", records[:16])
    valid = squad_file(tmp_path / "valid.json", records[16:])

    def run(name, seed):
        torch.rand(7)  # whatever the process drew before
        results = main(["--model_name_or_path", pretrained, "--trust_remote_code", "--train_file", train,
                        "--validation_file", valid, "--output_dir", str(tmp_path / name), "--max_seq_length", "128",
                        "--doc_stride", "32", "--max_question_length", "48", "--num_train_epochs", "1",
                        "--per_device_train_batch_size", "8", "--seed", str(seed)])
        return results["train"]["train_loss"], load_file(tmp_path / name / "model.safetensors")

    (loss, weights), (again, same) = run("first", 3), run("second", 3)
    assert loss == again and weights.keys() == same.keys()
    for name in weights:
        torch.testing.assert_close(weights[name], same[name], rtol=0, atol=0)
    other, _ = run("other", 4)
    assert other != loss


def test_validation_file_alone_is_detected_as_squad_v2(tmp_path, wiki, tiny_zoo_qa):
    """Evaluation-only runs on a local SQuAD 2.0 file score with v2 rules: a correct "no answer" counts."""
    records = [{"id": r["id"], "question": r["question"], "context": r["context"],
                "answers": list(zip(r["answers"]["text"], r["answers"]["answer_start"]))}
               for r in wiki["validation"].select(range(12))]
    assert any(not r["answers"] for r in records) and any(r["answers"] for r in records)
    results = main(["--model_name_or_path", tiny_zoo_qa, "--trust_remote_code", "--validation_file",
                    squad_file(tmp_path / "dev.json", records), "--output_dir", str(tmp_path / "out"),
                    "--max_seq_length", "128", "--doc_stride", "32", "--max_question_length", "48"])
    assert results["version_2"] is True and {"NoAns_f1", "best_f1"} <= set(results["eval"])


def run_cli(*args):
    return call_cli("encoder_zoo.qa.run_qa", *args)


def test_bad_input_gets_clear_errors(tmp_path):
    bad = squad_file(tmp_path / "bad.json",
                     [{"id": "q-42", "question": "?", "context": "Rome is old.", "answers": [("Rome", 5)]}])
    result = run_cli("--model_name_or_path", minilm_path(), "--train_file", bad, "--validation_file", bad,
                     "--output_dir", str(tmp_path / "o"))
    assert result.returncode == 2 and "q-42" in result.stderr and "--on_malformed skip" in result.stderr
    skipped = run_cli("--model_name_or_path", minilm_path(), "--validation_file", bad, "--on_malformed", "skip",
                      "--output_dir", str(tmp_path / "o"))  # why each record was skipped, not only that it was
    assert skipped.returncode == 2 and ("bad.json has no validation questions left: all 1 were malformed and skipped "
                                        "('q-42' (row 0): answer 'Rome' is not at offset 5 (found 'is o'))") in (
        skipped.stderr)
    missing = run_cli("--model_name_or_path", minilm_path(), "--validation_file", str(tmp_path / "none.json"),
                      "--output_dir", str(tmp_path / "o"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    not_squad = tmp_path / "list.json"
    not_squad.write_text("[1, 2]")
    wrong = run_cli("--model_name_or_path", minilm_path(), "--validation_file", str(not_squad),
                    "--output_dir", str(tmp_path / "o"))
    assert wrong.returncode == 2 and "not SQuAD-format" in wrong.stderr
    unknown = run_cli("--model_name_or_path", minilm_path(), "--dataset", "triviaqa_web",
                      "--output_dir", str(tmp_path / "o"))
    assert unknown.returncode == 2 and "Unknown --dataset 'triviaqa_web'" in unknown.stderr
