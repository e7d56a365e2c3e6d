"""Bad input to the fine-tuning scripts (run_glue.py, run_qa.py, run_open_qa.py, init_hire.py, hire_importance.py),
as the catalogue lists it: each case ends with one clear line naming the input and the fix (status 2), or with the
right result, never silently or in a traceback; Ctrl-C says what was saved (status 130); Hub data fails within seconds
offline; per-seed cards are complete; scores are printed in percent.

The catalogue calls each script's `cli()` in this process, as tests/test_bad_input.py does."""

import importlib
import json
import logging
import socket
import sys
import time
from pathlib import Path

import pytest
from helpers import save_tiny_spanbert
from test_bad_input import ENTRY_POINTS, Case, assert_refused, write

SCRIPTS = {**ENTRY_POINTS, "hire_importance.py": "encoder_zoo.glue.hire_importance"}
FAST = ["--num_train_epochs", "1", "--per_device_train_batch_size", "4", "--max_seq_length", "32"]
QA_FAST = ["--num_train_epochs", "1", "--per_device_train_batch_size", "4", "--max_seq_length", "64",
           "--doc_stride", "16", "--max_question_length", "16"]


def minilm(_=None) -> str:
    from encoder_zoo.training.data.resources import minilm_path

    return minilm_path()


def csv_rows(path: Path, rows: list[tuple]) -> Path:
    return write(path, "text,label\n" + "".join(f"{text},{label}\n" for text, label in rows))


def jsonl(path: Path, records: list[dict]) -> Path:
    return write(path, "".join(json.dumps(record) + "\n" for record in records))


def glue_files(w: Path, train: str = "train.csv", validation: str | None = None, model: str | None = None) -> list[str]:
    return ["--model_name_or_path", model or minilm(), *(["--trust_remote_code"] if model else []), "--train_file",
            str(w / train), "--validation_file", str(w / (validation or train)), "--text_columns", "text",
            "--output_dir", str(w / "o"), *FAST]


def squad(path: Path, qas: list[dict], context: str = "Rome is old.", qas_key: str = "qas") -> Path:
    return write(path, json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context, qas_key: qas}]}]}))


def negative_offset(w: Path) -> None:
    """-89 counts from the end in Python: the text IS found there, so the offset was accepted and trained on."""
    context = "Rome" + "." * 85  # 89 characters: context[-89:-85] == "Rome"
    squad(w / "dev.json", [{"id": "q-1", "question": "What?", "answers": [{"text": "Rome", "answer_start": -89}]}],
          context)


def sst2_tsv(w: Path, train: str) -> None:
    write(w / "glue" / "SST-2" / "train.tsv", "sentence\tlabel\n" + train)
    write(w / "glue" / "SST-2" / "dev.tsv", "sentence\tlabel\na fine film\t1\na dull one\t0\n")


MNLI_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
               "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n")


def mnli_without_sentence2(w: Path) -> None:
    good = "0\t0\t0\tfiction\t()\t()\t()\t()\tA man plays.\tA person plays.\tentailment\tentailment\n"
    short = "1\t0\t0\tfiction\t()\t()\t()\t()\tThe cat sleeps.\n"  # cut off after sentence1
    for name in ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"):
        write(w / "glue" / "MNLI" / name, MNLI_HEADER + good + (short if name == "train.tsv" else ""))


def tiny_model(w: Path, head: str = "SpanBertForSequenceClassification", positions: int = 512) -> str:
    return save_tiny_spanbert(w / "model", head, max_position_embeddings=positions)


OPEN_RECORD = {"id": "q", "question": "Who came?", "answers": ["Ann"], "passages": ["Ann came.", "Bob left."]}

CATALOGUE = [
    # 1. answer_start outside the context
    Case("qa-negative-answer-start", "run_qa.py",
         lambda w: ["--model_name_or_path", minilm(), "--validation_file", str(w / "dev.json"),
                    "--output_dir", str(w / "o")],
         "dev.json: record 'q-1' (row 0): answer_start -89 of answer 'Rome' is outside its context", negative_offset),
    Case("qa-answer-start-beyond-context", "run_qa.py",
         lambda w: ["--model_name_or_path", minilm(), "--validation_file", str(w / "dev.json"),
                    "--output_dir", str(w / "o")],
         "answer_start 500 of answer 'Rome' is outside its context (a character offset from 0 to 8",
         lambda w: squad(w / "dev.json",
                         [{"id": "q-1", "question": "What?", "answers": [{"text": "Rome", "answer_start": 500}]}])),
    # 3. duplicate seeds
    Case("glue-duplicate-seeds", "run_glue.py",
         lambda w: ["--model_name_or_path", minilm(), "--seeds", "1", "2", "1", "--output_dir", str(w / "o")],
         "--seeds 1 2 1 names seed 1 more than once"),
    # 4. --num_labels 0 or negative
    Case("hire-num-labels-0", "init_hire.py", lambda w: ["--num_labels", "0", "--output_dir", str(w / "h")],
         "--num_labels 0: pass the number of classes (2 or more), or 1 for regression."),
    Case("hire-num-labels-negative", "init_hire.py", lambda w: ["--num_labels", "-3", "--output_dir", str(w / "h")],
         "--num_labels -3: pass the number of classes"),
    # 5. one class only
    Case("glue-single-class", "run_glue.py", lambda w: glue_files(w),
         "--label_column 'label' of the train file",
         lambda w: csv_rows(w / "train.csv", [(f"row {i}", 1) for i in range(6)])),
    # 6. text columns that are not text, in the three scripts
    Case("glue-text-column-of-ints", "run_glue.py", lambda w: glue_files(w),
         "Text column 'text' of the train file", lambda w: csv_rows(w / "train.csv", [(i, i % 2) for i in range(6)])),
    Case("glue-text-column-with-null", "run_glue.py", lambda w: glue_files(w, "t.jsonl"),
         "holds an empty cell (null) at row 2, not a string",
         lambda w: jsonl(w / "t.jsonl", [{"text": None if i == 2 else f"r {i}", "label": i % 2} for i in range(6)])),
    Case("glue-text-column-with-list", "run_glue.py", lambda w: glue_files(w, "t.jsonl"),
         "holds ['a', 'b'] (list) at row 3, not a string",
         lambda w: jsonl(w / "t.jsonl",
                         [{"text": ["a", "b"] if i == 3 else f"r {i}", "label": i % 2} for i in range(6)])),
    Case("qa-question-is-a-number", "run_qa.py",
         lambda w: ["--model_name_or_path", minilm(), "--validation_file", str(w / "dev.json"),
                    "--output_dir", str(w / "o")],
         "record 'q-1' (data[0].paragraphs[0].qas[0]) has question 5 (int); it must be text",
         lambda w: squad(w / "dev.json",
                         [{"id": "q-1", "question": 5, "answers": [{"text": "Rome", "answer_start": 0}]}])),
    Case("open-qa-answer-is-a-number", "run_open_qa.py",
         lambda w: ["--model_name_or_path", minilm(), "--train_file", str(w / "q.jsonl"), "--output_dir", str(w / "o")],
         "q.jsonl, record 0: answers is [1984]; it must be a list of strings",
         lambda w: jsonl(w / "q.jsonl", [{**OPEN_RECORD, "answers": [1984]}])),
    Case("open-qa-question-is-null", "run_open_qa.py",
         lambda w: ["--model_name_or_path", minilm(), "--train_file", str(w / "q.jsonl"), "--output_dir", str(w / "o")],
         "q.jsonl, record 0: question is None (NoneType), not text",
         lambda w: jsonl(w / "q.jsonl", [{**OPEN_RECORD, "question": None}])),
    # 8. a label outside the task's classes
    Case("glue-label-outside-the-tasks-classes", "run_glue.py",
         lambda w: [*glue_files(w), "--task_name", "sst2", "--text_columns", "sentence"],
         "The label 2 at row 1 of the train file",
         lambda w: write(w / "train.csv", "sentence,label\ngood,1\nodd,2\nbad,0\n")),
    Case("glue-tsv-label-outside-the-tasks-classes", "run_glue.py",
         lambda w: ["--model_name_or_path", minilm(), "--task_name", "sst2", "--data_dir", str(w / "glue"),
                    "--output_dir", str(w / "o")],
         "train.tsv, line 3: label '2' is not one of sst2's ['negative', 'positive', '0', '1']",
         lambda w: sst2_tsv(w, "good\t1\nodd\t2\n")),
    Case("glue-validation-label-unseen-in-training", "run_glue.py", lambda w: glue_files(w, "train.csv", "dev.csv"),
         "The label 2 at row 1 of the validation file",
         lambda w: (csv_rows(w / "train.csv", [("a", 0), ("b", 1)]), csv_rows(w / "dev.csv", [("a", 0), ("c", 2)]))),
    # 9. a named column or key that is not there: the ones that are
    Case("glue-unknown-text-column", "run_glue.py", lambda w: [*glue_files(w), "--text_columns", "review"],
         "Column 'review' not found in the train file", lambda w: csv_rows(w / "train.csv", [("a", 0), ("b", 1)])),
    Case("glue-label-column-is-a-text-column", "run_glue.py", lambda w: [*glue_files(w), "--label_column", "text"],
         "--label_column 'text' is also a text column", lambda w: csv_rows(w / "train.csv", [("a", 0), ("b", 1)])),
    Case("qa-misnamed-key", "run_qa.py",
         lambda w: ["--model_name_or_path", minilm(), "--validation_file", str(w / "dev.json"),
                    "--output_dir", str(w / "o")],
         "dev.json: data[0].paragraphs[0] has no 'qas'; its keys are ['context', 'questions']",
         lambda w: squad(w / "dev.json", [{"id": "q", "question": "?", "answers": []}], qas_key="questions")),
    # 10, 11. GLUE TSV rows without a field
    Case("glue-tsv-row-without-label", "run_glue.py",
         lambda w: ["--model_name_or_path", minilm(), "--task_name", "sst2", "--data_dir", str(w / "glue"),
                    "--output_dir", str(w / "o")],
         "train.tsv, line 3: no 'label' (column 'label'): the row has 1 tab-separated field where the header has 2",
         lambda w: sst2_tsv(w, "good\t1\na row without its label\nbad\t0\n")),
    Case("glue-tsv-mnli-row-without-sentence2", "run_glue.py",
         lambda w: ["--model_name_or_path", minilm(), "--task_name", "mnli", "--data_dir", str(w / "glue"),
                    "--output_dir", str(w / "o")],
         "train.tsv, line 3: no 'hypothesis' (column 'sentence2') and 'label' (column 'gold_label')",
         mnli_without_sentence2),
    # 12. a damaged cache is named, and left for the user to delete
    Case("open-qa-truncated-cache", "run_open_qa.py",
         lambda w: ["--model_name_or_path", minilm(), "--dataset", "wiki_open", "--cache_dir", str(w / "cache"),
                    "--output_dir", str(w / "o")],
         "wiki_cloze_v1_4000_0.json is damaged (Unterminated string starting at: line 1 column 23 (char 22)). "
         "Delete that file (only it)",
         lambda w: write(w / "cache" / "wiki_cloze_v1_4000_0.json", '[{"id": "a", "title": "Ro')),
    # 13. --max_seq_length beyond the model's positions: the flag and the limit, the same in every script
    Case("glue-max-seq-length-beyond-positions", "run_glue.py",
         lambda w: ["--model_name_or_path", str(w / "model"), "--trust_remote_code", "--max_seq_length", "1024",
                    "--output_dir", str(w / "o")],
         "--max_seq_length 1024 is longer than", lambda w: tiny_model(w)),
    Case("qa-max-seq-length-beyond-positions", "run_qa.py",
         lambda w: ["--model_name_or_path", minilm(), "--max_seq_length", "1024",
                    "--validation_file", str(w / "dev.json"), "--output_dir", str(w / "o")],
         "can read: 512 tokens (bert position embeddings, max_position_embeddings 512). "
         "Pass --max_seq_length 512 or less.",
         lambda w: squad(w / "dev.json",
                         [{"id": "q-1", "question": "What?", "answers": [{"text": "Rome", "answer_start": 0}]}])),
    Case("open-qa-max-seq-length-beyond-positions", "run_open_qa.py",
         lambda w: ["--model_name_or_path", minilm(), "--max_seq_length", "1024", "--train_file", str(w / "q.jsonl"),
                    "--output_dir", str(w / "o")],
         "Pass --max_seq_length 512 or less.", lambda w: jsonl(w / "q.jsonl", [OPEN_RECORD])),
    # 14. bad data of a later task stops the command before the first task trains
    Case("glue-second-task-data-checked-first", "run_glue.py",
         lambda w: ["--model_name_or_path", minilm(), "--task_name", "rotten_tomatoes", "sst2",
                    "--data_dir", str(w / "glue"), "--output_dir", str(w / "o"), *FAST],
         "train.tsv, line 2: no 'label'", lambda w: sst2_tsv(w, "a row without its label\n")),
    # 7. hire_importance on a model that is not HIRE
    Case("hire-importance-not-hire", "hire_importance.py",
         lambda w: ["--run", f"rotten_tomatoes={w / 'model'}", "--trust_remote_code", "--output_dir", str(w / "imp")],
         "is a 'spanbert' model (SpanBertForSequenceClassification), not HIRE", lambda w: tiny_model(w)),
]


@pytest.mark.parametrize("case", CATALOGUE, ids=lambda case: case.name)
def test_bad_input_gets_one_clear_line_and_touches_nothing(tmp_path, monkeypatch, capsys, case):
    before, after = assert_refused(case, SCRIPTS[case.script], tmp_path, monkeypatch, capsys)
    assert not [name for name in after if name not in before and "seed-" in name]  # nothing trained first


def test_a_blank_line_ends_a_glue_tsv_harmlessly_and_empty_text_is_named(tmp_path, caplog):
    from encoder_zoo.glue.tasks import load_task

    sst2_tsv(tmp_path, "good\t1\nbad\t0\n\t1\n\n")  # the last line is blank; the one before has an empty sentence
    with caplog.at_level(logging.WARNING):
        task, data = load_task("sst2", data_dir=str(tmp_path / "glue"))
    assert data["train"]["label"] == [1, 0, 1] and data["train"]["sentence"] == ["good", "bad", ""]
    assert "train.tsv: 1 rows have an empty 'sentence' (column 'sentence'; lines 4)" in caplog.text


def test_string_answers_are_one_answer_each_and_scored_as_such(tmp_path, caplog):
    import evaluate

    from encoder_zoo.qa.open_data import load_open_file
    from encoder_zoo.qa.run_open_qa import METRIC_MODULE, references

    jsonl(tmp_path / "q.jsonl",
          [{**OPEN_RECORD, "answers": "Ann Smith"}, {**OPEN_RECORD, "id": "r", "answers": ["Bob"]}])
    with caplog.at_level(logging.INFO):
        questions = load_open_file(tmp_path / "q.jsonl")
    assert questions["answers"] == [["Ann Smith"], ["Bob"]]
    assert "1 records give their answer as a string, not a list (records 0)" in caplog.text
    metric = evaluate.load(METRIC_MODULE, "v1")
    scores = metric.compute(predictions=[{"id": "q", "prediction_text": "Ann Smith"},
                                         {"id": "r", "prediction_text": "Bob"}],
                            references=references(questions))
    assert scores["exact_match"] == scores["f1"] == 100.0
    # A string that reached the scorer anyway is still one answer, not its letters.
    assert references({"id": ["q"], "answers": ["Ann"]})[0]["answers"]["text"] == ["Ann"]


@pytest.mark.parametrize("script,args,names", [
    ("run_glue.py", ["--task_name", "rte"],
     ["rotten_tomatoes", "movie_sentiment_regression", "--train_file", "--data_dir"]),
    ("run_qa.py", ["--dataset", "squad_v2"], ["wiki_cloze", "--train_file/--validation_file"]),
    ("run_open_qa.py", ["--dataset", "search_qa"], ["wiki_open", "--train_file/--validation_file"]),
])
@pytest.mark.parametrize("how", ["HF_HUB_OFFLINE", "no network"])
def test_hub_data_fails_within_seconds_offline_and_names_the_way_out(tmp_path, monkeypatch, capsys, script, args,
                                                                     names, how):
    import datasets
    from huggingface_hub import constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty-cache")  # no copy to fall back on
    if how == "HF_HUB_OFFLINE":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    else:  # online mode on a machine without a network: the probe finds no route to the Hub
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
        for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(proxy, raising=False)

        def no_route(*_, **__):
            raise OSError("[Errno 101] Network is unreachable")

        monkeypatch.setattr(socket, "create_connection", no_route)
    monkeypatch.setattr(sys, "argv",
                        [script, "--model_name_or_path", minilm(), *args, "--output_dir", str(tmp_path / "o")])
    start = time.monotonic()
    with pytest.raises(SystemExit) as exit:
        importlib.import_module(SCRIPTS[script]).cli()
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit.value.code == 2 and time.monotonic() - start < 10, last
    reason = "HF_HUB_OFFLINE is set" if how == "HF_HUB_OFFLINE" else "no network: huggingface.co cannot be reached"
    assert f"{args[1]} comes from the Hub" in last and reason in last and all(name in last for name in names), last


def test_a_reachable_hub_is_asked_as_before(monkeypatch):
    """Online, `load_hub_dataset` is `datasets.load_dataset` itself: the real Hub path is kept."""
    import datasets
    from huggingface_hub import constants

    from encoder_zoo.glue import tasks

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(tasks, "hub_unreachable", lambda: None)
    asked = []
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda *a, **k: asked.append((a, constants.HF_HUB_OFFLINE)) or "hub data")
    assert tasks.load_hub_dataset("nyu-mll/glue", "rte", "--task_name rte", "") == "hub data"
    assert asked == [(("nyu-mll/glue", "rte"), False)]


def interrupt_training_on_call(monkeypatch, number: int) -> None:
    """Ctrl-C during the `number`th training of this process's FineTuningTrainer (1-based)."""
    from encoder_zoo.training.run.trainer import FineTuningTrainer

    calls = []
    train = FineTuningTrainer.train

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == number:
            raise KeyboardInterrupt
        return train(self, *args, **kwargs)

    monkeypatch.setattr(FineTuningTrainer, "train", interrupted)


def run_cli(monkeypatch, capsys, script: str, args: list[str]) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", [script, *args])
    with pytest.raises(SystemExit) as exit:
        importlib.import_module(SCRIPTS[script]).cli()
    return exit.value.code, capsys.readouterr().err.strip().splitlines()[-1]


def test_ctrl_c_in_run_glue_says_what_was_saved_and_how_to_go_on(tmp_path, monkeypatch, capsys):
    csv_rows(tmp_path / "train.csv", [(f"good {i}" if i % 2 else f"bad {i}", i % 2) for i in range(8)])
    command = glue_files(tmp_path, model=tiny_model(tmp_path))
    interrupt_training_on_call(monkeypatch, 2)
    code, last = run_cli(monkeypatch, capsys, "run_glue.py", [*command, "--seeds", "1", "2"])
    assert code == 130 and last.startswith("run_glue.py: interrupted (Ctrl-C). Saved: 1 finished run: custom seed 1 (")
    assert "Running the same command again starts every run over" in last
    partial = json.loads((tmp_path / "o" / "glue_results.partial.json").read_text())
    assert [(run["task"], run["seed"]) for run in partial["finished_runs"]] == [("custom", 1)]
    assert (tmp_path / "o" / "custom" / "seed-1" / "model.safetensors").is_file()
    assert not (tmp_path / "o" / "glue_results.json").exists()
    monkeypatch.undo()  # no more Ctrl-C: the same command (for the seed that finished) runs it again, and the
    from encoder_zoo.glue.run_glue import main  # complete results replace the partial ones

    main([*command, "--seeds", "1"])
    assert ((tmp_path / "o" / "glue_results.json").is_file()
            and not (tmp_path / "o" / "glue_results.partial.json").exists())


def test_sigterm_in_run_glue_says_what_was_saved_and_exits_143(tmp_path, monkeypatch, capsys):
    """A preempted job (SIGTERM during the second seed's training) ends as a Ctrl-C does, saying what was saved,
    with exit status 143; the process's own SIGTERM handler is back afterwards."""
    import os
    import signal

    from encoder_zoo.training.run.trainer import FineTuningTrainer

    csv_rows(tmp_path / "train.csv", [(f"good {i}" if i % 2 else f"bad {i}", i % 2) for i in range(8)])
    command = glue_files(tmp_path, model=tiny_model(tmp_path))
    calls, train = [], FineTuningTrainer.train

    def terminated(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return train(self, *args, **kwargs)

    monkeypatch.setattr(FineTuningTrainer, "train", terminated)
    before = signal.getsignal(signal.SIGTERM)
    code, last = run_cli(monkeypatch, capsys, "run_glue.py", [*command, "--seeds", "1", "2"])
    assert code == 143 and last.startswith("run_glue.py: interrupted (SIGTERM). Saved: 1 finished run: custom seed 1")
    assert (tmp_path / "o" / "custom" / "seed-1" / "model.safetensors").is_file()
    assert signal.getsignal(signal.SIGTERM) == before


def test_ctrl_c_in_run_qa_and_run_open_qa(tmp_path, monkeypatch, capsys):
    squad(tmp_path / "qa.json", [{"id": f"q-{i}", "question": "What is old?",
                                  "answers": [{"text": "Rome", "answer_start": 0}]} for i in range(4)])
    model = tiny_model(tmp_path, "SpanBertForQuestionAnswering")
    interrupt_training_on_call(monkeypatch, 1)
    code, last = run_cli(monkeypatch, capsys, "run_qa.py",
                         ["--model_name_or_path", model, "--trust_remote_code",
                          "--train_file", str(tmp_path / "qa.json"), "--output_dir", str(tmp_path / "qa"), *QA_FAST])
    assert code == 130 and "before the fine-tuned model was saved" in last and "Run the same command again" in last
    jsonl(tmp_path / "q.jsonl", [{**OPEN_RECORD, "id": f"q{i}"} for i in range(4)])
    interrupt_training_on_call(monkeypatch, 2)  # the reader's training, after the selector's
    code, last = run_cli(monkeypatch, capsys, "run_open_qa.py",
                         ["--model_name_or_path", model, "--trust_remote_code",
                          "--train_file", str(tmp_path / "q.jsonl"), "--output_dir", str(tmp_path / "open"), *QA_FAST])
    assert code == 130 and f"Saved: the trained selector ({tmp_path / 'open' / 'selector'})" in last
    assert f"--selector_model {tmp_path / 'open' / 'selector'}" in last
    assert (tmp_path / "open" / "selector" / "model.safetensors").is_file()


def test_per_seed_cards_are_complete_and_scores_print_in_percent(tmp_path, caplog, capsys):
    import yaml

    from encoder_zoo.glue.run_glue import main

    rows = [(f"good film {i}" if i % 2 else f"bad film {i}", i % 2) for i in range(8)]
    csv_rows(tmp_path / "train.csv", rows)
    model = tiny_model(tmp_path)
    write(Path(model) / "README.md", "---\nlicense: mit\nmodel_name: tiny-spanbert\n---\n# tiny\n")  # the base's card
    with caplog.at_level(logging.INFO, logger="run_glue"):
        results = main(["--model_name_or_path", model, "--trust_remote_code",
                        "--train_file", str(tmp_path / "train.csv"), "--validation_file", str(tmp_path / "train.csv"),
                        "--text_columns", "text", "--seeds", "1",
                        "--add_to_model_card", "--output_dir", str(tmp_path / "o"), *FAST])
    card = (tmp_path / "o" / "custom" / "seed-1" / "README.md").read_text()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["library_name"] == "transformers" and meta["license"] == "mit" and "custom_code" in meta["tags"]
    assert meta["model-index"][0]["name"] == "tiny-spanbert-custom-seed-1"
    assert "base_model" not in meta and "fine-tuned on train.csv (seed 1)" in card  # a local base: named in the text
    assert str(tmp_path) not in card
    # Scores in points everywhere: glue_results.json (its `scale` says so; repro reads it back as 0-1), the log, the
    # table and the card.
    accuracy = results["tasks"]["custom"]["runs"][0]["metrics"]["accuracy"]
    assert 0 <= accuracy <= 100 and results["scale"] == "points (percent, 0-100)"
    assert f"custom seed 1: accuracy {accuracy:.2f}" in caplog.text
    assert f"| custom | accuracy | {accuracy:.2f} |" in capsys.readouterr().out
    assert ({m["type"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}["accuracy"]
            == pytest.approx(accuracy))
    from encoder_zoo.repro.jobs import glue_run_scores

    assert glue_run_scores(results)[1]["accuracy"] == pytest.approx(accuracy / 100)
    before_points = {"tasks": {"custom": {"runs": [{"seed": 1, "metrics": {"accuracy": 0.5}}]}}}  # no `scale`: 0-1
    assert glue_run_scores(before_points) == {1: {"accuracy": 0.5}}


def test_a_seed_card_over_a_hub_model_names_it_as_base_model(tmp_path):
    from huggingface_hub import ModelCard, ModelCardData

    from encoder_zoo.glue.run_glue import write_seed_card

    folder = tmp_path / "seed-3"
    folder.mkdir()
    write_seed_card(folder, "FacebookAI/roberta-large", ModelCardData(license="mit"), "rte", 3, "GLUE RTE")
    data = ModelCard.load(folder / "README.md").data
    assert (data.base_model, data.license, data.library_name, data.model_name) == (
        "FacebookAI/roberta-large", "mit", "transformers", "roberta-large-rte-seed-3")
    write_seed_card(folder, "FacebookAI/roberta-large", None, "rte", 3, "GLUE RTE")  # licence unknown: the project's
    assert ModelCard.load(folder / "README.md").data.license == "apache-2.0"


def test_hire_importance_shows_progress_prints_its_numbers_and_writes_into_its_output_dir(tmp_path, monkeypatch,
                                                                                          capsys):
    from transformers import AutoTokenizer, BertConfig, BertModel

    from encoder_zoo.glue.hire_importance import main
    from encoder_zoo.glue.init_hire import main as init_hire

    tokenizer = AutoTokenizer.from_pretrained(minilm())
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(tmp_path / "backbone")
    tokenizer.save_pretrained(tmp_path / "backbone")
    hire = init_hire(["--backbone", str(tmp_path / "backbone"), "--output_dir", str(tmp_path / "hire"),
                      "--gru_hidden_size", "8"])
    monkeypatch.chdir(tmp_path)
    main(["--run", f"rotten_tomatoes={hire}", "--output_dir", str(tmp_path / "imp"), "--max_examples", "8"])
    captured = capsys.readouterr()
    assert "Importance on rotten_tomatoes" in captured.err  # the progress bar
    scores = json.loads((tmp_path / "imp" / "importance.json").read_text())["rotten_tomatoes"]
    assert len(scores) == 3 and sum(scores) == pytest.approx(1, abs=1e-4)
    assert f"| rotten_tomatoes | {scores[0]:.3f} | {scores[1]:.3f} | {scores[2]:.3f} |" in captured.out
    assert (tmp_path / "imp" / "importance.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(tmp_path.glob("*.png"))  # nothing in the working directory
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--output_dir runs/importance \\\n        --run rotten_tomatoes=" in capsys.readouterr().out


def test_a_qa_file_without_questions_is_refused_before_training(tmp_path, monkeypatch, capsys):
    write(tmp_path / "dev.json", '{"data": []}')
    code, last = run_cli(monkeypatch, capsys, "run_qa.py",
                         ["--model_name_or_path", minilm(), "--validation_file", str(tmp_path / "dev.json"),
                          "--output_dir", str(tmp_path / "o")])
    assert code == 2 and last.endswith("dev.json has no validation questions. SQuAD format: {\"data\": [{\"title\", "
                                       "\"paragraphs\": [{\"context\", \"qas\": "
                                       "[{\"id\", \"question\", \"answers\"}]}]}]}."), last
