"""Code that family folders repeat by design (each folder travels alone in its checkpoints) stays equal to its
original: every `# Copied from` block, checked by tests/check_copies.py (`--fix` rewrites drifted copies)."""

import shutil

import pytest
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
