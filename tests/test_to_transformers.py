"""`training/to_transformers.py`: a zoo export's standard BERT or ELECTRA copy. It has no code and no auto_map, and in a
process where this project is not importable, transformers' Auto classes, the fill-mask pipeline and
sentence-transformers, all without trust_remote_code, give the export's own outputs (the export loaded with its code)
to 1e-5; a family with no standard body and a non-empty OUTPUT are refused."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import call_cli, run_isolated
from transformers import AutoTokenizer

from encoder_zoo.training.data.resources import minilm_path
from encoder_zoo.training.recipes import pretraining_export
from encoder_zoo.training.run.standard_copy import GENERATOR_FOLDER, TOLERANCE, convert

ELECTRA = dict(embedding_size=32, pretraining_tasks="rtd", task_head_type="ffn", layer_tying="none",
               generator_hidden_size=16, generator_intermediate_size=32, generator_num_attention_heads=1)
# The recipes the standard copies are claimed for, as tiny random exports.
EXPORTS = {
    "spanbert": pretraining_export("spanbert"),
    "bert_2seq_nsp": pretraining_export("spanbert", use_span_boundary_objective=False,
                                        use_next_sentence_prediction=True),
    "teams": pretraining_export("teams", embedding_size=16),
    "electra": pretraining_export("teams", **ELECTRA),
}

# Run in a fresh process without this project: EXPORT (loaded with its own code) against STANDARD (without).
CHILD = """
import json
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForPreTraining, AutoTokenizer, pipeline

remote = {"trust_remote_code": True}
standard_folder = Path(STANDARD)
generator = standard_folder / "generator"
masked_lm_folder = generator if generator.is_dir() else standard_folder
config = AutoConfig.from_pretrained(STANDARD)
assert not getattr(config, "auto_map", None) and not list(standard_folder.rglob("*.py")), "remote code left in the copy"
tokenizer = AutoTokenizer.from_pretrained(STANDARD)
batch = tokenizer(["The quick brown fox jumps over the lazy dog.", "A short second sentence."], padding=True,
                  return_tensors="pt")
real = batch["attention_mask"].bool()
differences = {}


def differ(a, b, mask=real):
    return float((a - b).abs()[mask].max())


def loaded(auto, folder, **kwargs):
    return getattr(transformers, auto).from_pretrained(folder, **kwargs).eval()


with torch.no_grad():
    differences["AutoModel"] = differ(loaded("AutoModel", STANDARD)(**batch).last_hidden_state,
                                      loaded("AutoModel", EXPORT, **remote)(**batch).last_hidden_state)
    export_mlm = loaded("AutoModelForMaskedLM", EXPORT, **remote)(**batch).logits
    differences["AutoModelForMaskedLM"] = differ(loaded("AutoModelForMaskedLM", masked_lm_folder)(**batch).logits,
                                                 export_mlm)
    export_pretraining = loaded("AutoModelForPreTraining", EXPORT, **remote)(**batch)
    architecture = config.architectures[0]
    if architecture in ("BertForPreTraining", "BertForMaskedLM"):
        theirs = loaded("AutoModelForPreTraining", STANDARD)(**batch)
        differences["AutoModelForPreTraining (MLM)"] = differ(theirs.prediction_logits, export_pretraining.mlm_logits)
        if architecture == "BertForPreTraining":
            differences["AutoModelForPreTraining (NSP)"] = float(
                (theirs.seq_relationship_logits - export_pretraining.nsp_logits).abs().max())
    rtd_folder = standard_folder / "rtd"  # TEAMS's RTD branch, a discriminator of its own
    if architecture == "ElectraForPreTraining" or rtd_folder.is_dir():
        rtd_folder = rtd_folder if rtd_folder.is_dir() else standard_folder
        rtd = loaded("AutoModelForPreTraining", rtd_folder)(**batch).logits
        differences["AutoModelForPreTraining (RTD)"] = differ(rtd, export_pretraining.rtd_logits)

text = f"The quick brown {tokenizer.mask_token} jumps over the lazy dog."
theirs = pipeline("fill-mask", model=str(masked_lm_folder), top_k=20)(text)
ours = {p["token"]: p["score"] for p in pipeline("fill-mask", model=EXPORT, top_k=50, **remote)(text)}
assert sum(p["token"] in ours for p in theirs) >= 15, "fill-mask proposes other tokens"
differences["fill-mask pipeline"] = max(abs(p["score"] - ours[p["token"]]) for p in theirs if p["token"] in ours)

from sentence_transformers import SentenceTransformer, models

def encoder(folder, **kwargs):
    word = models.Transformer(folder, model_args=kwargs, config_args=kwargs, tokenizer_args=kwargs)
    return SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension())], device="cpu")

sentences = ["The quick brown fox jumps over the lazy dog.", "A short second sentence."]
differences["sentence-transformers"] = float((encoder(STANDARD).encode(sentences, convert_to_tensor=True)
                                              - encoder(EXPORT, **remote).encode(sentences, convert_to_tensor=True))
                                             .abs().max())
print("\\nDIFFERENCES " + json.dumps(differences))
"""


def tiny_export(name: str, folder):
    folder.mkdir(parents=True)
    torch.manual_seed(0)
    return EXPORTS[name](folder, AutoTokenizer.from_pretrained(minilm_path())).folder


def plain_environment_differences(export, standard) -> dict[str, float]:
    output = run_isolated(f"EXPORT = {str(export)!r}\nSTANDARD = {str(standard)!r}\n" + CHILD, timeout=600)
    return json.loads(output.rsplit("\nDIFFERENCES ", 1)[1])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPORTS))
def test_the_standard_copy_gives_the_exports_outputs_in_a_plain_environment(tmp_path, name):
    export = tiny_export(name, tmp_path / "export")
    standard = convert(export, tmp_path / "standard")
    differences = plain_environment_differences(export, standard)
    print(name, differences)
    expected = {"AutoModel", "AutoModelForMaskedLM", "fill-mask pipeline", "sentence-transformers"}
    expected |= {"bert_2seq_nsp": {"AutoModelForPreTraining (MLM)", "AutoModelForPreTraining (NSP)"},
                 "spanbert": {"AutoModelForPreTraining (MLM)"}, "electra": {"AutoModelForPreTraining (RTD)"},
                 "teams": {"AutoModelForPreTraining (RTD)"}}[name]
    assert set(differences) == expected
    assert all(value <= TOLERANCE for value in differences.values()), differences


def test_a_spanbert_export_becomes_bert_with_its_sbo_head_named_as_dropped(tmp_path):
    export = tiny_export("spanbert", tmp_path / "export")
    standard = convert(export, tmp_path / "standard")
    config = json.loads((standard / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertForMaskedLM"]
    assert "auto_map" not in config and not list(standard.glob("*.py"))
    assert (standard / "tokenizer.json").is_file()
    card = (standard / "README.md").read_text()
    assert "| `sbo.*` | SBO head (span boundary objective): BERT has no such head |" in card
    assert "hidden states 0, MLM logits 0 |" in card  # the check measured, not assumed
    from safetensors import safe_open

    with safe_open(str(standard / "model.safetensors"), framework="pt") as handle:
        keys = set(handle.keys())
    assert "bert.encoder.layer.1.output.LayerNorm.weight" in keys and not any(k.startswith("sbo.") for k in keys)
    # An OUTPUT that holds files is refused unless --overwrite, which replaces it.
    refused = call_cli("encoder_zoo.training.to_transformers", str(export), str(standard))
    assert refused.returncode == 2 and "exists and is not empty; pass --overwrite" in refused.stderr
    (standard / "stale.txt").write_text("old")
    assert call_cli("encoder_zoo.training.to_transformers", str(export), str(standard), "--overwrite").returncode == 0
    assert not (standard / "stale.txt").exists() and (standard / "README.md").is_file()


def test_an_electra_export_keeps_the_generator_as_google_released_it(tmp_path):
    export = tiny_export("electra", tmp_path / "export")
    standard = convert(export, tmp_path / "standard")
    assert json.loads((standard / "config.json").read_text())["architectures"] == ["ElectraForPreTraining"]
    generator = json.loads((standard / GENERATOR_FOLDER / "config.json").read_text())
    assert generator["architectures"] == ["ElectraForMaskedLM"] and generator["hidden_size"] == 16


@pytest.mark.parametrize("model_type", ["cloze", "hire", "bertac", "bertac_cnn"])
def test_a_family_without_a_standard_body_is_refused_in_one_line(tmp_path, model_type):
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"model_type": model_type}))
    result = call_cli("encoder_zoo.training.to_transformers", str(export), str(tmp_path / "standard"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert f"a {model_type} export has no standard BERT or ELECTRA copy" in result.stderr
    assert not (tmp_path / "standard").exists()


def test_also_export_standard_is_refused_before_anything_for_a_family_without_a_standard_body(tmp_path):
    result = call_cli("encoder_zoo.training.pretrain", "--model", "cloze", "--model_size", "tiny",
                      "--also_export_standard", "--output_dir", str(tmp_path / "run"))
    assert result.returncode == 2 and "--also_export_standard with --model cloze: a cloze export has no standard" in (
        result.stderr)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("start", ["root", "rtd", "generator"])
def test_a_teams_copy_continued_with_init_from_is_the_export_at_step_0(tmp_path, start):
    """`--init_from` the copy (its root, or its rtd/ or generator/ folder, read as the whole copy) starts a teams run
    whose hidden states, RTD logits and generator logits equal the export's; only the MWS head, which the copy drops,
    starts new, and the notes name it."""
    from test_init_from import sentences, started_model

    from encoder_zoo import models

    export = tiny_export("teams", tmp_path / "export")
    standard = convert(export, tmp_path / "standard")
    folder = standard if start == "root" else standard / start
    model, init = started_model(tmp_path, "--model", "teams", "--init_from", str(folder), "--max_seq_length", "64")
    assert {name.split(".")[0] for name in init.new} == {"mws_head"}, init.new
    assert any("MWS head (no counterpart in ELECTRA): new." in note for note in init.notes)
    assert init.loads["teams.rtd_layer.output.dense.weight"][0] == "--init_from rtd/"
    assert init.loads["generator.bias"] == ("--init_generator_from", "generator_lm_head.bias")
    zoo = models.get_class("teams", "AutoModelForPreTraining").from_pretrained(export).eval()
    masked_lm = models.get_class("teams", "AutoModelForMaskedLM").from_pretrained(export).eval()
    model.save_pretrained(tmp_path / "saved")
    ours_masked_lm = models.get_class("teams", "AutoModelForMaskedLM").from_pretrained(tmp_path / "saved").eval()
    inputs = sentences(AutoTokenizer.from_pretrained(minilm_path()))
    inputs = {k: v for k, v in inputs.items() if k != "token_type_ids"}
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(model.teams(**inputs).last_hidden_state[real],
                                   zoo.teams(**inputs).last_hidden_state[real], atol=1e-5, rtol=0)
        torch.testing.assert_close(model(**inputs).rtd_logits[real], zoo(**inputs).rtd_logits[real], atol=1e-5, rtol=0)
        torch.testing.assert_close(ours_masked_lm(**inputs).logits[real], masked_lm(**inputs).logits[real], atol=1e-5,
                                   rtol=0)


def test_the_copys_card_keeps_the_exports_name_licence_and_base_model_which_a_continued_run_keeps(tmp_path):
    from huggingface_hub import ModelCard
    from test_init_from import started_model

    export = tiny_export("spanbert", tmp_path / "run" / "export")
    (export / "README.md").write_text("---\nlicense: mit\nmodel_name: spanbert-from-minilm\nbase_model: "
                                      "nreimers/MiniLM-L6-H384-uncased\n---\n\n# spanbert-from-minilm\n")
    standard = convert(export, tmp_path / "export-standard")
    card = ModelCard.load(standard / "README.md")
    assert (card.data.license, card.data.model_name) == ("mit", "spanbert-from-minilm")
    assert card.data.base_model == "nreimers/MiniLM-L6-H384-uncased"
    assert "\n# spanbert-from-minilm (standard BERT copy)\n" in card.text
    _, init = started_model(tmp_path, "--model", "spanbert", "--init_from", str(standard), "--max_seq_length", "64")
    assert init.record()["base_model"] == "nreimers/MiniLM-L6-H384-uncased"
    # Without a card, the run folder names it, under the project's licence.
    bare = tiny_export("spanbert", tmp_path / "other-run" / "export")
    card = ModelCard.load(convert(bare, tmp_path / "other-standard") / "README.md")
    assert (card.data.license, card.data.model_name) == ("apache-2.0", "other-run")


def test_the_help_names_the_rtd_folder_and_what_is_kept():
    result = call_cli("encoder_zoo.training.to_transformers", "--help")
    assert result.returncode == 0 and "OUTPUT/rtd" in result.stdout and "4.57" in result.stdout
    assert "task layers) is dropped" not in result.stdout.replace("\n", " ")


def cased_tokenizer():
    """A cased WordPiece as the zoo trains one (saved by transformers 5 as `TokenizersBackend`)."""
    from encoder_zoo.training.data.tokenizer import train_wordpiece_tokenizer

    texts = ["Hello World, this is Été in Paris.", "The quick brown Fox jumps over the lazy dog."] * 30
    return train_wordpiece_tokenizer(texts, vocab_size=120, min_frequency=1)


PROBE_TEXT = ["Hello World Été", "HELLO hello, the Fox"]


@pytest.mark.parametrize("name", ["spanbert", "teams"])
def test_the_copys_tokenizer_is_berts_or_electras_fast_tokenizer_and_reads_text_as_the_exports(tmp_path, name):
    folder = tmp_path / "export"
    folder.mkdir()
    tokenizer = cased_tokenizer()
    torch.manual_seed(0)
    export = EXPORTS[name](folder, tokenizer).folder
    standard = convert(export, tmp_path / "standard")
    family = "Bert" if name == "spanbert" else "Electra"
    for sub in [".", *(["generator", "rtd"] if name == "teams" else [])]:
        config = json.loads((standard / sub / "tokenizer_config.json").read_text())
        assert config["tokenizer_class"] == f"{family}TokenizerFast" and config["do_lower_case"] is False
        assert not {"is_local", "local_files_only", "backend", "name_or_path"} & set(config)
        assert AutoTokenizer.from_pretrained(standard / sub)(PROBE_TEXT)["input_ids"] == tokenizer(PROBE_TEXT)[
            "input_ids"]


def test_an_electra_copy_continued_with_init_from_reads_its_generator_folder_and_is_the_export(tmp_path):
    from test_init_from import sentences, started_model

    from encoder_zoo import models

    export = tiny_export("electra", tmp_path / "export")
    standard = convert(export, tmp_path / "standard")
    model, init = started_model(tmp_path, "--model", "electra", "--init_from", str(standard), "--max_seq_length", "64")
    assert not init.new and "--init_generator_from" in init.checkpoints
    zoo = models.get_class("teams", "AutoModelForPreTraining").from_pretrained(export).eval()
    inputs = {k: v for k, v in sentences(AutoTokenizer.from_pretrained(minilm_path())).items() if k != "token_type_ids"}
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        ours, theirs = model(**inputs), zoo(**inputs)
        torch.testing.assert_close(ours.rtd_logits[real], theirs.rtd_logits[real], atol=1e-5, rtol=0)
    model.save_pretrained(tmp_path / "saved")
    masked_lm = [models.get_class("teams", "AutoModelForMaskedLM").from_pretrained(folder).eval()
                 for folder in (tmp_path / "saved", export)]
    with torch.no_grad():
        torch.testing.assert_close(masked_lm[0](**inputs).logits[real], masked_lm[1](**inputs).logits[real], atol=1e-5,
                                   rtol=0)
