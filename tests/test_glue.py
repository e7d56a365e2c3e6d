"""GLUE harness: data sources, preprocessing, metrics against sklearn/scipy, tiny end-to-end fine-tunes, bad input."""

import json
from pathlib import Path

import evaluate
import numpy as np
import pytest
import yaml
from helpers import call_cli, save_tiny_spanbert
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from transformers import AutoTokenizer

from encoder_zoo import models  # noqa: F401
from encoder_zoo.glue.run_glue import METRIC_MODULE, glue_average, main, model_config_overrides, parse_args
from encoder_zoo.glue.tasks import TASKS, load_movie_sentiment_regression, load_rotten_tomatoes, load_task
from encoder_zoo.training.data.resources import minilm_path

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_zoo_model(tmp_path_factory):
    return save_tiny_spanbert(tmp_path_factory.mktemp("tiny_spanbert"), "SpanBertForSequenceClassification")


def write_glue_tsv(root: Path):
    """A miniature of the original GLUE TSV distribution for MNLI, CoLA and STS-B."""
    mnli = root / "MNLI"
    mnli.mkdir(parents=True)
    header = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
              "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n")
    labels = ["entailment", "neutral", "contradiction"]
    pairs = [("A man is playing a guitar.", "A person plays music."), ("The cat sleeps.", "The cat is awake."),
             ("Kids are at school.", "It is summer holiday."), ("She reads \"quoted\" text.", "She reads.")]
    for name, count in (("train.tsv", 12), ("dev_matched.tsv", 6), ("dev_mismatched.tsv", 5)):
        rows = [f"{i}\t0\t0\tfiction\t()\t()\t()\t()\t{pairs[i % 4][0]}\t{pairs[i % 4][1]}\t"
                f"{labels[i % 3]}\t{labels[i % 3]}\n" for i in range(count)]
        (mnli / name).write_text(header + "".join(rows))
    cola = root / "CoLA"
    cola.mkdir()
    for name in ("train.tsv", "dev.tsv"):
        (cola / name).write_text("".join(f"gj04\t{i % 2}\t\tThe sentence number {i} is here.\n" for i in range(10)))
    stsb = root / "STS-B"
    stsb.mkdir()
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    for name in ("train.tsv", "dev.tsv"):
        (stsb / name).write_text(header + "".join(f"{i}\tnews\tf\t2012\t{i}\ts\ts\tA plane takes off {i}.\t"
                                                  f"A plane is taking off.\t{i % 5}.{i}\n" for i in range(10)))


def test_embedded_tasks_are_real_and_fixed():
    rt = load_rotten_tomatoes()
    assert len(rt["train"]) > 9000 and 900 < len(rt["validation"]) < 1500
    assert set(rt["train"]["label"]) == {0, 1}
    assert not set(rt["train"]["sentence"]) & set(rt["validation"]["sentence"])
    assert load_rotten_tomatoes()["validation"]["sentence"] == rt["validation"]["sentence"]  # fixed split
    reg = load_movie_sentiment_regression()
    scores = np.array(reg["train"]["label"])
    assert len(reg["train"]) > 9000 and scores.min() < -3 and scores.max() > 3


@pytest.mark.parametrize("task_name", [name for name, task in TASKS.items() if task.loader])
def test_the_first_rows_of_an_embedded_task_are_a_random_sample_of_its_split(task_name):
    """What --max_train_samples 2000 / --max_eval_samples 500 keep has the labels of the whole split (the movie
    scores' file order once gave 93% positive rows): the same law as the rest of the split, at the 1% level."""
    from scipy import stats

    task, data = load_task(task_name)
    for split, first in (("train", 2000), ("validation", 500)):
        labels = np.array(data[split]["label"])
        head, rest = labels[:first], labels[first:]
        if task.is_regression:
            p_value = stats.ks_2samp(head, rest).pvalue
        else:
            classes = np.unique(labels)
            counts = np.array([[np.sum(part == c) for c in classes] for part in (head, rest)])
            p_value = stats.chi2_contingency(counts).pvalue
        assert p_value > 0.01, f"{task_name} {split}: the first {first} rows differ from the rest (p={p_value:.2g})"
    assert load_task(task_name)[1]["train"]["sentence"][:50] == data["train"]["sentence"][:50]  # one fixed order


def test_preprocessing_single_sentence_and_pairs(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    write_glue_tsv(tmp_path)
    task, data = load_task("mnli", data_dir=str(tmp_path))
    assert task.text_columns == ("premise", "hypothesis")
    assert set(data) == {"train", "validation_matched", "validation_mismatched"}
    assert data["train"][1]["label"] == 1 and data["train"][3]["premise"] == 'She reads "quoted" text.'
    encoded = tokenizer(data["train"][0]["premise"], data["train"][0]["hypothesis"])
    assert encoded["input_ids"].count(tokenizer.sep_token_id) == 2 and set(encoded["token_type_ids"]) == {0, 1}
    task, data = load_task("cola", data_dir=str(tmp_path))
    assert (task.text_columns == ("sentence",)
            and data["validation"][1] == {"sentence": "The sentence number 1 is here.", "label": 1})
    task, data = load_task("stsb", data_dir=str(tmp_path / "STS-B"))  # the task folder itself works too
    assert task.is_regression and data["train"][3]["label"] == pytest.approx(3.3)


@pytest.mark.parametrize(
    "task, predictions, references",
    [
        ("cola", [1, 0, 1, 1, 0, 0, 1], [1, 0, 0, 1, 0, 1, 1]),
        ("mrpc", [1, 0, 1, 1, 0, 0, 1], [1, 0, 0, 1, 0, 1, 1]),
        ("qqp", [1, 1, 1, 0], [1, 0, 1, 0]),
        ("sst2", [1, 0, 1], [1, 1, 1]),
        ("mnli", [0, 1, 2, 2], [0, 1, 1, 2]),
        ("stsb", [0.1, 2.5, 3.9, 1.0, 4.8], [0.0, 3.0, 3.5, 1.5, 5.0]),
    ],
)
def test_metrics_match_sklearn_and_scipy(task, predictions, references):
    result = evaluate.load(METRIC_MODULE, task).compute(predictions=predictions, references=references)
    if task == "cola":
        assert result == {"matthews_correlation": pytest.approx(matthews_corrcoef(references, predictions))}
    elif task in ("mrpc", "qqp"):
        assert result == {"accuracy": pytest.approx(accuracy_score(references, predictions)),
                          "f1": pytest.approx(f1_score(references, predictions))}
    elif task == "stsb":
        assert result == {"pearson": pytest.approx(pearsonr(predictions, references)[0], rel=1e-5),
                          "spearmanr": pytest.approx(spearmanr(predictions, references)[0], rel=1e-5)}
    else:
        assert result == {"accuracy": pytest.approx(accuracy_score(references, predictions))}


def test_metric_known_values():
    # Hand-checked: 2 of 3 positives found, 1 false positive -> precision 2/3, recall 2/3, F1 2/3; accuracy 3/5.
    result = evaluate.load(METRIC_MODULE, "mrpc").compute(predictions=[1, 1, 0, 1, 0], references=[1, 1, 1, 0, 0])
    assert result == {"accuracy": pytest.approx(0.6), "f1": pytest.approx(2 / 3)}
    assert (evaluate.load(METRIC_MODULE, "cola").compute(predictions=[1, 0, 1, 0], references=[1, 0, 1, 0])
            == {"matthews_correlation": 1.0})


def test_glue_average_excludes_wnli_and_averages_multi_metric_tasks():
    per_task = {"mrpc": {"f1": 0.9, "accuracy": 0.8}, "mnli": {"accuracy_matched": 0.8, "accuracy_mismatched": 0.7},
                "wnli": {"accuracy": 0.1}, "rotten_tomatoes": {"accuracy": 0.5}}
    assert glue_average(per_task) == pytest.approx((0.85 + 0.75) / 2)
    assert glue_average(per_task, include_wnli=True) == pytest.approx((0.85 + 0.75 + 0.1) / 3)


def test_tiny_end_to_end_mnli_matched_and_mismatched_with_a_zoo_model(tmp_path, tiny_zoo_model):
    write_glue_tsv(tmp_path / "glue_data")
    results = main(["--model_name_or_path", tiny_zoo_model, "--trust_remote_code", "--task_name", "mnli",
                    "--data_dir", str(tmp_path / "glue_data"), "--output_dir", str(tmp_path / "out"),
                    "--num_train_epochs", "1", "--per_device_train_batch_size", "4", "--seeds", "1", "2",
                    "--ignore_mismatched_sizes", "--add_to_model_card"])
    mnli = results["tasks"]["mnli"]
    assert set(mnli["median"]) == {"accuracy_matched", "accuracy_mismatched"}
    assert [run["seed"] for run in mnli["runs"]] == [1, 2]
    assert (results["glue_average"] == pytest.approx(task_average := sum(mnli["median"].values()) / 2)
            and task_average >= 0)
    saved = json.loads((tmp_path / "out" / "glue_results.json").read_text())
    assert saved["tasks"]["mnli"]["median"] == mnli["median"]
    assert "| mnli | accuracy_mismatched |" in (tmp_path / "out" / "glue_results.md").read_text()
    # The floor to read the runs against, one constant answer: 2 of the 6 matched rows share a label (2 each), 2 of
    # the 5 mismatched rows (entailment, neutral, contradiction, entailment, neutral).
    assert mnli["majority_class"] == pytest.approx({"accuracy_matched": 100 * 2 / 6, "accuracy_mismatched": 40.0})
    assert "| mnli | accuracy_mismatched of always predicting its most frequent label | 40.00 |" in (
        tmp_path / "out" / "glue_results.md").read_text()
    card = (tmp_path / "out" / "mnli" / "seed-1" / "README.md").read_text()
    index = yaml.safe_load(card.split("---")[1])["model-index"][0]["results"][0]
    assert index["dataset"]["type"] == "nyu-mll/glue" and {m["type"] for m in index["metrics"]} == {"accuracy_matched",
                                                                                                    "accuracy_mismatched"}
    for run in mnli["runs"]:  # each seed's card carries its own score, in points, and names its seed
        card = (tmp_path / "out" / "mnli" / f"seed-{run['seed']}" / "README.md").read_text()
        metrics = yaml.safe_load(card.split("---")[1])["model-index"][0]["results"][0]["metrics"]
        assert {m["type"]: m["value"] for m in metrics} == {k: pytest.approx(v, abs=1e-4)
                                                            for k, v in run["metrics"].items()}
        assert all(m["name"].endswith(f"(1 seed: {run['seed']})") for m in metrics)
    # The fine-tuned zoo model reloads with its 3-way head.
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out" / "mnli" / "seed-1",
                                                               trust_remote_code=True)
    assert model.config.num_labels == 3 and model.config.id2label[2] == "contradiction"
    # The folders users publish hold the training arguments as JSON, no pickle, and no machine's loading state.
    assert not list((tmp_path / "out").rglob("training_args.bin"))
    from encoder_zoo.training.data.tokenizer import LOADING_STATE

    saved = json.loads((tmp_path / "out" / "mnli" / "seed-1" / "tokenizer_config.json").read_text())
    assert saved["tokenizer_class"] and not set(LOADING_STATE) & set(saved)
    assert json.loads((tmp_path / "out" / "mnli" / "seed-2" / "training_args.json").read_text())["seed"] == 2


def test_an_expected_head_swap_is_one_info_line_and_a_missing_encoder_weight_the_full_report(tmp_path, caplog):
    import logging

    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    from encoder_zoo.training.run.loading import load_pretrained

    class Collect(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    shown = Collect()
    modeling_logger = hf_logging.get_logger("transformers.modeling_utils")
    modeling_logger.addHandler(shown)
    try:
        pretraining = save_tiny_spanbert(tmp_path / "pretraining", "SpanBertForPreTraining")
        with caplog.at_level(logging.INFO, logger="encoder_zoo.training.run.loading"):
            load_pretrained(AutoModelForSequenceClassification, pretraining, trust_remote_code=True, num_labels=3)
        assert not any("LOAD REPORT" in m for m in shown.messages)
        assert "new head weights classifier.bias, classifier.weight initialised" in caplog.text
        # The pretraining heads are no news: the zoo models ignore them (_keys_to_ignore_on_load_unexpected).
        assert "pretraining-head weights not used" not in caplog.text
        # Encoder weights the checkpoint lacks (here a third layer) are news: transformers' report is shown.
        load_pretrained(AutoModelForSequenceClassification, pretraining, trust_remote_code=True, num_hidden_layers=3)
        assert any("LOAD REPORT" in m and "encoder.layer.2" in m for m in shown.messages)
    finally:
        modeling_logger.removeHandler(shown)


def test_no_pin_memory_without_an_accelerator(tmp_path):
    import torch

    training_args = parse_args(["--model_name_or_path", "m", "--output_dir", str(tmp_path)])[1]
    assert training_args.dataloader_pin_memory is torch.accelerator.is_available()


def test_regression_and_custom_files_with_any_transformers_encoder(tmp_path, capsys):
    train = tmp_path / "train.jsonl"
    valid = tmp_path / "valid.jsonl"
    rows = [{"review": f"movie {i} was {'great' if i % 2 else 'awful'}", "stars": float(i % 5) + 0.5}
            for i in range(24)]
    train.write_text("\n".join(json.dumps(r) for r in rows))
    valid.write_text("\n".join(json.dumps(r) for r in rows[:8]))
    results = main(["--model_name_or_path", minilm_path(), "--train_file", str(train), "--validation_file", str(valid),
                    "--text_columns", "review", "--label_column", "stars", "--output_dir", str(tmp_path / "out"),
                    "--num_train_epochs", "1", "--per_device_train_batch_size", "8", "--max_seq_length", "32",
                    "--add_to_model_card", "--max_eval_samples", "6"])
    custom = results["tasks"]["custom"]
    assert set(custom["median"]) == {"pearson", "spearmanr"}
    assert all(np.isfinite(v) for v in custom["median"].values())
    # The baseline the runs are read against (a constant has no correlation): a bag-of-words Ridge model fitted on
    # the 24 training rows and scored on the 6 scored ones, as sklearn computes it here, in points.
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import Ridge

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    ridge = Ridge(alpha=1.0).fit(vectorizer.fit_transform([r["review"] for r in rows]), [r["stars"] for r in rows])
    predicted = ridge.predict(vectorizer.transform([r["review"] for r in rows[:6]]))
    stars = [r["stars"] for r in rows[:6]]
    expected = {"pearson": 100 * pearsonr(predicted, stars)[0], "spearmanr": 100 * spearmanr(predicted, stars)[0]}
    assert custom["bag_of_words"] == pytest.approx(expected) and "majority_class" not in custom
    assert custom["bag_of_words_model"] == "TF-IDF word 1-2-grams + Ridge(alpha=1) on 24 training rows"
    saved = json.loads((tmp_path / "out" / "glue_results.json").read_text())["tasks"]["custom"]
    assert saved["bag_of_words"] == pytest.approx(expected)
    printed = (f"| custom | pearson of a bag-of-words ridge model ({custom['bag_of_words_model']}) | "
               f"{expected['pearson']:.2f} |")
    assert printed in capsys.readouterr().out and printed in (tmp_path / "out" / "glue_results.md").read_text()
    # A run cut down with --max_eval_samples is kept out of the model-index.
    assert not list((tmp_path / "out").rglob("README.md"))


def test_model_index_gives_each_dataset_its_identity_each_seed_its_score_and_the_extra_card_the_median(tmp_path):
    from huggingface_hub import ModelCard

    from encoder_zoo.glue.run_glue import write_model_index

    def task(metrics_per_seed, splits=("validation",)):
        runs = [{"seed": seed, "metrics": m} for seed, m in metrics_per_seed.items()]
        median = {k: sorted(r["metrics"][k] for r in runs)[len(runs) // 2] for k in runs[0]["metrics"]}
        return {"runs": runs, "median": median, "validation_splits": list(splits)}

    results = {"tasks": {  # in points, as run_glue's results hold them
        "rotten_tomatoes": task({1: {"accuracy": 81.0}, 2: {"accuracy": 79.0}, 3: {"accuracy": 80.0}}),
        "movie_sentiment_regression": task({1: {"pearson": 50.0, "spearmanr": 40.0},
                                            2: {"pearson": 60.0, "spearmanr": 50.0},
                                            3: {"pearson": 70.0, "spearmanr": 60.0}}),
        "sst2": task({1: {"accuracy": 66.0}, 2: {"accuracy": 70.0}, 3: {"accuracy": 68.0}}),
    }}
    write_model_index(results, tmp_path / "out", str(tmp_path / "export"))
    seed_two = ModelCard.load(tmp_path / "out" / "rotten_tomatoes" / "seed-2" / "README.md").data.eval_results
    assert [(r.dataset_type, r.metric_type, r.metric_value) for r in seed_two] == [("encoder-zoo:rotten_tomatoes",
                                                                                     "accuracy", 79.0)]
    export = {(r.dataset_type, r.dataset_config, r.metric_type): (r.metric_value, r.metric_name, r.dataset_split)
              for r in ModelCard.load(tmp_path / "export" / "README.md").data.eval_results}
    seeds = "(median of 3 seeds: 1, 2, 3)"
    assert export == {
        ("encoder-zoo:rotten_tomatoes", None, "accuracy"): (80.0, f"accuracy {seeds}", "validation"),
        ("encoder-zoo:movie_sentiment_regression", None, "pearson"): (60.0, f"pearson {seeds}", "validation"),
        ("encoder-zoo:movie_sentiment_regression", None, "spearmanr"): (50.0, f"spearmanr {seeds}", "validation"),
        ("nyu-mll/glue", "sst2", "accuracy"): (68.0, f"accuracy {seeds}", "validation"),
    }


def test_custom_string_labels_are_mapped_to_ids_and_named_in_the_config(tmp_path):
    """pos/neg labels become ids in name order (as transformers' run_glue.py does); the config's id2label names them."""
    rows = [{"review": f"movie {i} was {'great' if i % 2 else 'awful'}", "sentiment": "pos" if i % 2 else "neg"}
            for i in range(24)]
    for name, part in (("train.jsonl", rows), ("valid.jsonl", rows[:8])):
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in part))
    results = main(["--model_name_or_path", minilm_path(), "--train_file", str(tmp_path / "train.jsonl"),
                    "--validation_file", str(tmp_path / "valid.jsonl"), "--text_columns", "review", "--label_column",
                    "sentiment", "--output_dir", str(tmp_path / "out"), "--num_train_epochs", "1",
                    "--per_device_train_batch_size", "8", "--max_seq_length", "32"])
    assert set(results["tasks"]["custom"]["median"]) == {"accuracy", "f1"}
    config = json.loads((tmp_path / "out" / "custom" / f"seed-{results['tasks']['custom']['runs'][0]['seed']}"
                         / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"} and config["label2id"] == {"neg": 0, "pos": 1}
    _, data = load_task("custom", train_file=str(tmp_path / "train.jsonl"),
                        validation_file=str(tmp_path / "valid.jsonl"), text_columns=["review"],
                        label_column="sentiment")
    assert data["train"]["label"][:4] == [0, 1, 0, 1]


def run_cli(*args):
    return call_cli("encoder_zoo.glue.run_glue", *args)


def test_bad_input_is_named(tmp_path):
    unknown = run_cli("--model_name_or_path", minilm_path(), "--task_name", "sst3", "--output_dir", str(tmp_path))
    assert unknown.returncode == 2 and "Unknown --task_name 'sst3'" in unknown.stderr
    train = tmp_path / "train.csv"
    train.write_text("text,target\nhello,1\nbye,0\n")
    wrong = run_cli("--model_name_or_path", minilm_path(), "--train_file", str(train),
                    "--validation_file", str(train), "--text_columns", "sentence", "--output_dir", str(tmp_path / "o"))
    assert (wrong.returncode == 2 and "Column 'sentence' not found" in wrong.stderr
            and "['text', 'target']" in wrong.stderr)
    no_label = run_cli("--model_name_or_path", minilm_path(), "--train_file", str(train),
                       "--validation_file", str(train), "--text_columns", "text", "--output_dir", str(tmp_path / "o"))
    assert no_label.returncode == 2 and "Column 'label' not found" in no_label.stderr
    missing = run_cli("--model_name_or_path", minilm_path(), "--task_name", "rte",
                      "--data_dir", str(tmp_path / "nowhere"), "--output_dir", str(tmp_path / "o"))
    assert missing.returncode == 2 and "train.tsv not found" in missing.stderr
    preset = run_cli("--model_name_or_path", minilm_path(), "--preset", "bert_huge",
                     "--output_dir", str(tmp_path / "o"))
    assert preset.returncode == 2 and "Unknown --preset" in preset.stderr


def test_every_glue_task_is_described():
    assert {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"} <= set(TASKS)
    assert TASKS["stsb"].is_regression and TASKS["mnli"].validation_splits == ("validation_matched",
                                                                               "validation_mismatched")


def test_hire_preset_is_the_papers_appendix(tmp_path):
    from transformers import Trainer

    args, training_args, _ = parse_args(["--model_name_or_path", "m", "--preset", "hire",
                                         "--output_dir", str(tmp_path)])
    optimizer_class, kwargs = Trainer.get_optimizer_cls_and_kwargs(training_args)
    # App. A.2: Adam with beta1 0.9, beta2 0.98, eps 1e-6; lr 1e-5 (of 1e-5, 2e-5); 6% warmup; weight decay 0.1;
    # gradient norm clipped at 1; inputs of 128 tokens.
    assert optimizer_class.__name__ == "AdamW" and kwargs["betas"] == (0.9, 0.98) and kwargs["eps"] == 1e-6
    assert (training_args.learning_rate, training_args.weight_decay, training_args.max_grad_norm) == (1e-5, 0.1, 1.0)
    assert training_args.get_warmup_steps(1000) == 60 and args.max_seq_length == 128
    args, training_args, _ = parse_args(["--model_name_or_path", "m", "--preset", "hire", "--learning_rate", "2e-5",
                                         "--output_dir", str(tmp_path)])
    assert training_args.learning_rate == 2e-5 and training_args.adam_beta2 == 0.98  # a flag still wins


def test_early_stopping_stops_and_the_best_checkpoint_is_the_saved_model(tmp_path, tiny_zoo_model):
    """--early_stopping_patience: Trainer's EarlyStoppingCallback stops after an epoch without a better development
    score, the best epoch's weights are loaded and saved, and the reported scores are that epoch's."""
    import torch
    from safetensors.torch import load_file

    out = tmp_path / "out"
    results = main(["--model_name_or_path", tiny_zoo_model, "--trust_remote_code", "--task_name", "rotten_tomatoes",
                    "--output_dir", str(out), "--max_train_samples", "32", "--max_eval_samples", "40",
                    "--per_device_train_batch_size", "8", "--num_train_epochs", "20", "--learning_rate", "1e-3",
                    "--early_stopping_patience", "1", "--save_strategy", "epoch", "--save_total_limit", "30",
                    "--seeds", "3"])
    run = results["tasks"]["rotten_tomatoes"]["runs"][0]
    assert run["best_step"] < run["trained_steps"] < 20 * 4  # stopped early, after an epoch worse than the best
    folder = out / "rotten_tomatoes" / "seed-3"
    best, last = (load_file(folder / f"checkpoint-{step}" / "model.safetensors")
                  for step in (run["best_step"], run["trained_steps"]))
    saved = load_file(folder / "model.safetensors")
    assert all(torch.equal(saved[name], best[name]) for name in best)
    assert any(not torch.equal(saved[name], last[name]) for name in last)
    state = json.loads((folder / f"checkpoint-{run['trained_steps']}" / "trainer_state.json").read_text())
    logged = next(e for e in state["log_history"] if e.get("step") == run["best_step"] and "eval_accuracy" in e)
    # Trainer logs percentages (GLUE's scale), as glue_results.json keeps them.
    assert (run["metrics"]["accuracy"] == pytest.approx(logged["eval_accuracy"])
            == pytest.approx(logged["eval_score"]))


def test_selection_settings_and_l2_through_adam(tmp_path):
    from transformers import Trainer

    from encoder_zoo.glue.run_glue import PRESETS, l2_adam, selection_arguments

    args, training_args, flags = parse_args(["--model_name_or_path", "m", "--preset", "hire",
                                             "--output_dir", str(tmp_path)])
    assert args.early_stopping_patience == 3 and args.weight_decay_type == "decoupled"
    assert selection_arguments(args, training_args, flags, PRESETS["hire"].flags) == {
        "load_best_model_at_end": True, "eval_strategy": "epoch", "eval_steps": None, "save_strategy": "epoch",
        "save_steps": training_args.save_steps, "save_total_limit": 1, "metric_for_best_model": "score",
        "greater_is_better": True}
    argv = ["--model_name_or_path", "m", "--load_best_model_at_end", "true", "--eval_strategy", "steps", "--eval_steps",
            "7", "--save_strategy", "steps", "--save_steps", "7", "--metric_for_best_model", "accuracy",
            "--output_dir", str(tmp_path)]
    args, training_args, flags = parse_args(argv)
    assert selection_arguments(args, training_args, flags) == {"load_best_model_at_end": True}  # the user's own
    with pytest.raises(ValueError, match="--early_stopping_patience 0"):
        selection_arguments(*parse_args([*argv[:2], "--early_stopping_patience", "0", "--output_dir", str(tmp_path)]))
    # The user's --save_strategy no turns the preset's selection off; with their own --early_stopping_patience, an
    # error.
    argv = ["--model_name_or_path", "m", "--preset", "hire", "--save_strategy", "no", "--output_dir", str(tmp_path)]
    assert selection_arguments(*parse_args(argv), PRESETS["hire"].flags) == {}
    with pytest.raises(ValueError, match="--save_strategy no rules out"):
        selection_arguments(*parse_args([*argv, "--early_stopping_patience", "2"]), PRESETS["hire"].flags)
    # --weight_decay_type l2: torch.optim.Adam, its weight_decay per group (0.1, biases and LayerNorm at 0) is L2.
    args, training_args, _ = parse_args(["--model_name_or_path", "m", "--preset", "hire", "--weight_decay_type", "l2",
                                         "--output_dir", str(tmp_path)])
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    trainer = Trainer(model=model, args=training_args, optimizer_cls_and_kwargs=l2_adam(training_args))
    optimizer = trainer.create_optimizer()
    assert type(optimizer) is torch.optim.Adam and optimizer.defaults["betas"] == (0.9, 0.98)
    assert optimizer.defaults["eps"] == 1e-6 and optimizer.defaults["lr"] == 1e-5
    assert [(len(g["params"]), g["weight_decay"]) for g in optimizer.param_groups] == [(1, 0.1), (3, 0.0)]
    weight = model[0].weight
    with torch.no_grad():  # weights far from 0: Adam's eps (1e-6) is negligible beside the gradient 0.1 |w|
        weight.copy_(torch.tensor([[0.5, -0.3, 0.2], [-0.4, 0.6, -0.25], [0.35, -0.45, 0.3]]))
    before = weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # zero loss gradient: the first Adam step moves each weight by lr against sign(0.1 w)
    torch.testing.assert_close(weight.detach(), before - 1e-5 * torch.sign(before), atol=1e-9, rtol=0)


def test_presets_follow_the_papers_fine_tuning_recipes(tmp_path):
    def resolved(preset):
        return parse_args(["--model_name_or_path", "m", "--preset", preset, "--output_dir", str(tmp_path)])[1]

    spanbert, teams_small, teams_base, cloze = (resolved(p) for p in ("spanbert", "teams_small", "teams_base", "cloze"))
    assert (spanbert.adam_epsilon, spanbert.weight_decay, spanbert.num_train_epochs) == (1e-6, 0.01, 10)
    assert (teams_small.learning_rate, teams_base.learning_rate, teams_small.adam_epsilon) == (1e-4, 3e-5, 1e-6)
    assert teams_small.num_train_epochs == 5 and teams_small.weight_decay == 0.01
    # Cloze Sec. 4: 10% warmup, then cosine annealing to 1e-6; batch 16, 3 epochs.
    assert cloze.lr_scheduler_type == "cosine_with_min_lr" and cloze.lr_scheduler_kwargs == {"min_lr": 1e-6}
    assert (cloze.per_device_train_batch_size, cloze.num_train_epochs, cloze.weight_decay) == (16, 3, 0.0)


@pytest.fixture(scope="module")
def tiny_cloze(tmp_path_factory):
    import torch

    from encoder_zoo.models.cloze.configuration_cloze import TwoTowerClozeConfig
    from encoder_zoo.models.cloze.modeling_cloze import TwoTowerCloze

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("cloze")
    config = TwoTowerClozeConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=128, bos_token_id=tokenizer.cls_token_id,
                                 eos_token_id=tokenizer.sep_token_id, sep_token_id=tokenizer.sep_token_id)
    TwoTowerCloze(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def dropout_rates(model):
    """Every dropout rate of a cloze classifier: nn.Dropout modules and the attention's SDPA dropout."""
    from torch import nn

    rates = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Dropout):
            rates[name] = module.p
        elif isinstance(getattr(module, "dropout", None), float):
            rates[name + ".dropout"] = module.dropout
    return rates


def test_cloze_preset_switches_off_dropout_in_the_language_model_and_keeps_it_before_the_projection(tmp_path,
                                                                                                    tiny_cloze):
    from transformers import AutoModelForSequenceClassification

    results = main(["--model_name_or_path", tiny_cloze, "--trust_remote_code", "--task_name", "rotten_tomatoes",
                    "--preset", "cloze", "--max_train_samples", "16", "--max_eval_samples", "8",
                    "--max_seq_length", "32", "--num_train_epochs", "1", "--per_device_train_batch_size", "8",
                    "--output_dir", str(tmp_path / "out")])
    assert 0 <= results["tasks"]["rotten_tomatoes"]["median"]["accuracy"] <= 100
    trained = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out" / "rotten_tomatoes" / "seed-42",
                                                                 trust_remote_code=True)
    config = trained.config
    assert (config.hidden_dropout_prob, config.attention_probs_dropout_prob,
            config.activation_dropout) == (0.0, 0.0, 0.0)
    rates = dropout_rates(trained)
    language_model = {name: rate for name, rate in rates.items() if name.startswith("cloze.")}
    assert len(language_model) >= 10 and set(language_model.values()) == {0.0}  # towers and combination layer
    assert rates["dropout"] == 0.1  # between the language model output and the projection
    # Without the preset, the pretraining dropout is back everywhere; --config_overrides beats the preset.
    args, _, _ = parse_args(["--model_name_or_path", tiny_cloze, "--trust_remote_code", "--output_dir", str(tmp_path)])
    plain = AutoModelForSequenceClassification.from_pretrained(tiny_cloze, trust_remote_code=True, num_labels=2,
                                                               **model_config_overrides(args))
    assert dropout_rates(plain)["cloze.forward_tower.layers.0.dropout"] == 0.1
    args, _, _ = parse_args(["--model_name_or_path", tiny_cloze, "--trust_remote_code", "--preset", "cloze",
                             "--config_overrides", "classifier_dropout=0.3", "--output_dir", str(tmp_path)])
    assert model_config_overrides(args) == {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
                                            "activation_dropout": 0.0, "classifier_dropout": 0.3}


def test_config_overrides_are_checked_against_the_model(tmp_path, tiny_zoo_model):
    args, _, _ = parse_args(["--model_name_or_path", tiny_zoo_model, "--trust_remote_code", "--preset", "cloze",
                             "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match="--preset cloze: SpanBertConfig has no field 'activation_dropout'"):
        model_config_overrides(args)
    args, _, _ = parse_args(["--model_name_or_path", tiny_zoo_model, "--trust_remote_code", "--config_overrides",
                             "hidden_dropout_prob=0.0,dropout_everywhere=1", "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match="--config_overrides: SpanBertConfig has no field 'dropout_everywhere'"):
        model_config_overrides(args)
