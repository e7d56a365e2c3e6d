"""Code that family folders repeat by design (each folder travels alone in its checkpoints) stays equal to its
original: every `# Copied from` block, checked by tests/check_copies.py (`--fix` rewrites drifted copies)."""

import inspect
import shutil

import pytest
import transformers
from check_copies import REPO, check, find_copies


def test_every_copy_equals_its_original():
    assert len(find_copies(REPO / "models")) >= 4
    assert check() == [], "run `python tests/check_copies.py --fix`"


def test_a_drifted_copy_is_found_and_fixed(tmp_path, monkeypatch):
    import check_copies

    models = tmp_path / "models"
    shutil.copytree(REPO / "models", models)
    monkeypatch.setattr(check_copies, "REPO", tmp_path)
    teams = models / "teams" / "modeling_teams.py"
    original = teams.read_text()
    teams.write_text(original.replace("start_logits.squeeze(-1).contiguous()", "start_logits.squeeze(-1)", 1))
    assert check(models) == ["models/teams/modeling_teams.py:" + str(
        original.splitlines().index(next(line for line in original.splitlines()
                                         if "SpanBertForQuestionAnswering.forward" in line)) + 1)
        + " models.spanbert.modeling_spanbert.SpanBertForQuestionAnswering.forward"]
    check(models, fix=True)
    assert teams.read_text() == original and check(models) == []


@pytest.mark.parametrize("line", ["# Copied from models.spanbert.modeling_spanbert.no_such_function\n"
                                  "def f():\n    pass\n"])
def test_a_copy_of_nothing_is_an_error(tmp_path, monkeypatch, line):
    import check_copies

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "x.py").write_text(line)
    monkeypatch.setattr(check_copies, "REPO", tmp_path)
    with pytest.raises(LookupError):
        check(tmp_path / "models")


@pytest.mark.parametrize("model_type, reference", [("spanbert", "BertConfig"), ("teams", "ElectraConfig")])
def test_configs_repeat_the_encoder_fields_under_transformers_names_and_types(model_type, reference):
    """SpanBERT's and TEAMS's configs repeat BERT's (ELECTRA's) fields, which transformers' BERT and ELECTRA layers
    read; a folder travels alone, so it cannot import them. Each shared field keeps transformers' name and type; the
    defaults are the paper's (SpanBERT's cased vocabulary, TEAMS's sizes)."""
    from encoder_zoo import models

    theirs = inspect.get_annotations(getattr(transformers, reference), eval_str=True)
    ours = inspect.get_annotations(models.get_class(model_type, "AutoConfig"), eval_str=True)
    encoder = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
               "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id", "classifier_dropout",
               "is_decoder", "add_cross_attention", "tie_word_embeddings"}
    assert encoder <= ours.keys() & theirs.keys()
    shared = sorted(ours.keys() & theirs.keys())
    assert [(name, ours[name]) for name in shared] == [(name, theirs[name]) for name in shared]
