"""BERTAC part 2: TIER fusion over a transformer, the in-model CNN word lookup, the noun-phrase masks, the ablations,
reload without this repository, and GLUE / extractive QA / open-domain QA fine-tuning end to end on tiny models."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import run_isolated, session_dir
from huggingface_hub import ModelCard
from test_bertac_cnn import TINY as CNN_TINY
from test_pretrain import pretrain
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, BertModel
from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput, BertSelfOutput

from encoder_zoo import models  # noqa: F401
from encoder_zoo.models.bertac.configuration_bertac import BertacCnnConfig, BertacConfig
from encoder_zoo.models.bertac.modeling_bertac import (
    BertacCnnForPreTraining,
    BertacCnnModel,
    BertacForQuestionAnswering,
    BertacForSequenceClassification,
    BertacModel,
    BertacTierLayer,
    BertacWordLookup,
    build_word_lookup,
)
from encoder_zoo.training.data.resources import minilm_path
from encoder_zoo.training.masking.entity_spans import (
    EntitySpanBuilder,
    load_pipeline,
    longest_common_noun_phrase,
    longest_noun_phrase,
    noun_chunks,
)

REPO = Path(__file__).resolve().parents[1]
PAIRS = [
    ("The new international airport opened in 2006 near Bang Phli.",
     "The airport replaced Don Mueang as the main hub."),
    ("A man is playing a guitar on the street.", "The man plays an old electric guitar on stage."),
]


@pytest.fixture(scope="module")
def cnn_export(tmp_path_factory):
    """A real part-1 export: `pretrain.py --model bertac_cnn --model_size tiny`, 20 GAN steps on 12 articles (word
    tokenizer, fastText table and CNN), made once per session."""
    from filelock import FileLock

    shared = session_dir(tmp_path_factory)
    out = shared / "bertac_tier_cnn"
    with FileLock(str(shared / "bertac_tier_cnn.lock")):
        if not (out / "export" / "model.safetensors").exists():
            pretrain(*CNN_TINY, "--output_dir", str(out), "--max_steps", "20", "--save_steps", "20",
                     "--validation_documents", "0", "--overwrite_output_dir")
    return str(out / "export")


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def backbone(tmp_path_factory, tokenizer):
    """A tiny random BERT with the real MiniLM WordPiece tokenizer, saved like any pretrained encoder."""
    path = tmp_path_factory.mktemp("backbone")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def build(backbone, cnn_export, head=BertacForSequenceClassification, seed=0, **options):
    torch.manual_seed(seed)
    return head.from_pretrained_parts(backbone, cnn_export, **{"num_labels": 3, **options})


def pair_batch(tokenizer, pairs=PAIRS, padding=True):
    first, second = [a for a, _ in pairs], [b for _, b in pairs]
    encoded = tokenizer(first, second, return_offsets_mapping=True)
    spans = EntitySpanBuilder()(encoded, [first, second])["entity_spans"]
    encoded.pop("offset_mapping")
    batch = tokenizer.pad(encoded, padding=padding, return_tensors="pt")
    batch["entity_spans"] = torch.tensor(spans)
    return batch


# ----------------------------------------------------------------------------------------------------- TIER layer
def test_tier_layer_keeps_the_sequence_length_and_computes_the_paper_attention():
    torch.manual_seed(0)
    config = BertConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    layer = BertacTierLayer(config, cnn_dim=6).eval()
    hidden, cnn = torch.randn(2, 7, 16), torch.randn(2, 2, 6)
    token_mask = torch.ones(2, 7, dtype=torch.bool)
    token_mask[1, 5:] = False
    segment_mask = torch.tensor([[True, True], [True, False]])  # row 1: a single sentence (u = 1)
    output, probabilities = layer(hidden, cnn, token_mask, segment_mask)
    assert output.shape == hidden.shape and probabilities.shape == (2, 2, 2, 7)

    attention = layer.attention
    for row in range(2):
        length, queries = int(token_mask[row].sum()), int(segment_mask[row].sum())
        r, h = cnn[row, :queries], hidden[row, :length]
        context = []
        for head in range(2):
            part = slice(8 * head, 8 * head + 8)
            q = (r @ attention.query.weight.T + attention.query.bias)[:, part]
            k = (h @ attention.key.weight.T + attention.key.bias)[:, part]
            v = (h @ attention.value.weight.T + attention.value.bias)[:, part]
            p = torch.softmax(q @ k.T / math.sqrt(8), dim=-1)  # (u, l_k)
            # The paper: A = softmax(r K^T / sqrt(d_k))^T J_{u, d_k}, output A ⊙ V: token j gets sum_q p[q, j] v_j.
            context.append((p.T @ torch.ones(queries, 8)) * v)
        context = torch.cat(context, dim=-1)
        attended = layer.attention_output(context, h)
        expected = layer.output(layer.intermediate(attended), attended)
        torch.testing.assert_close(output[row, :length], expected, rtol=1e-5, atol=1e-6)
    assert isinstance(layer.attention_output, BertSelfOutput) and isinstance(layer.intermediate, BertIntermediate)
    assert isinstance(layer.output, BertOutput)  # transformers' BERT blocks around the new attention


def test_narrow_tier_layers_sit_between_projections_as_over_albert_xxlarge():
    backbone = BertConfig(vocab_size=100, hidden_size=48, num_hidden_layers=1, num_attention_heads=4,
                          intermediate_size=96)
    config = BertacConfig(backbone_config=backbone.to_dict(), tier_hidden_size=16, tier_intermediate_size=64,
                          tier_num_attention_heads=4, cnn_config={"vocab_size": 20, "word_embedding_dim": 8,
                                                                  "num_filters": 5, "mask_token_id": 2},
                          separator_token_ids=[1, 2], backbone_vocab_size=100)
    model = BertacModel(config).eval()
    assert (model.input_projection.in_features, model.input_projection.out_features) == (48, 16)  # 4096 -> 1024
    assert (model.output_projection.in_features, model.output_projection.out_features) == (16, 48)  # 1024 -> 4096
    assert model.tier_layers[0].intermediate.dense.out_features == 64
    ids = torch.tensor([[1, 5, 6, 7, 2, 8, 9, 2]])
    output = model(ids, output_hidden_states=True)
    assert output.last_hidden_state.shape == (1, 8, 48)
    assert [h.shape for h in output.tier_hidden_states] == [(1, 8, 16)] * 3
    assert [r.shape for r in output.cnn_representations] == [(1, 2, 15)] * 3  # de = 3 windows x 5 filters
    with pytest.raises(ValueError, match="not a multiple"):
        BertacConfig(backbone_config=backbone.to_dict(), tier_hidden_size=18)


# ----------------------------------------------------------------------------------------------- CNN words
def test_rebuilt_cnn_words_equal_the_word_tokenizer_on_real_sentences(backbone, cnn_export, tokenizer):
    from encoder_zoo.glue.tasks import load_rotten_tomatoes

    words_tokenizer = AutoTokenizer.from_pretrained(cnn_export)
    model = build(backbone, cnn_export).bertac
    sentences = load_rotten_tomatoes()["validation"]["sentence"][:200]
    first, second = sentences[:100], sentences[100:]
    encoded = tokenizer(first, second, return_offsets_mapping=True)
    spans = EntitySpanBuilder()(encoded, [first, second])["entity_spans"]
    encoded.pop("offset_mapping")
    batch = tokenizer.pad(encoded, return_tensors="pt")
    plain, plain_mask = model.cnn_inputs(batch["input_ids"], batch["attention_mask"])
    masked, masked_mask = model.cnn_inputs(batch["input_ids"], batch["attention_mask"], torch.tensor(spans))
    offsets = tokenizer(first, second, return_offsets_mapping=True)
    checked = masked_segments = 0
    for row in range(100):
        for segment, text in enumerate((first[row], second[row])):
            assert plain[row, segment][plain_mask[row, segment]].tolist() == words_tokenizer(text)["input_ids"]
            # With the noun phrase replaced by [EM] in the text, the word tokenizer gives what the model built.
            start, end = spans[row][segment]
            if start >= 0:
                pieces = [o for o, s in zip(offsets["offset_mapping"][row], offsets.sequence_ids(row)) if s == segment]
                text = text[: pieces[start][0]] + " [EM] " + text[pieces[end - 1][1] :]
                masked_segments += 1
            assert masked[row, segment][masked_mask[row, segment]].tolist() == words_tokenizer(text)["input_ids"]
            checked += 1
    assert checked == 200 and masked_segments >= 10  # unrelated snippets share few noun phrases
    assert len(model.word_lookup.word_keys) == len(words_tokenizer) - 3  # every CNN word but [PAD] [UNK] [EM]


def _trained_tokenizer(kind, texts):
    """A small real tokenizer of another family: byte-level BPE (RoBERTa-style) or SentencePiece-style Unigram."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers import models as tokenizer_models
    from transformers import PreTrainedTokenizerFast

    if kind == "byte_level_bpe":
        tokenizer = Tokenizer(tokenizer_models.BPE(unk_token="<unk>"))
        tokenizer.pre_tokenizer, tokenizer.decoder = (pre_tokenizers.ByteLevel(add_prefix_space=False),
                                                      decoders.ByteLevel())
        tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=3000,
                                                                 special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                       cls_token="<s>", pad_token="<pad>", unk_token="<unk>")
    tokenizer = Tokenizer(tokenizer_models.Unigram())
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.StripAccents(),
                                                 normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation()])
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=3000, unk_token="<unk>",
                                                                 special_tokens=["[CLS]", "[SEP]", "<pad>", "<unk>"]))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 0), ("[SEP]", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, cls_token="[CLS]", sep_token="[SEP]", pad_token="<pad>",
                                   unk_token="<unk>")


@pytest.mark.parametrize("kind, share", [("sentencepiece", 1.0), ("byte_level_bpe", 0.55)])
def test_word_lookup_follows_other_encoder_tokenizers(cnn_export, kind, share):
    """SentencePiece-style pieces (`▁` word starts, bare `▁` before punctuation) rebuild the CNN words exactly;
    byte-level BPE (a space byte starts a word; cased forms) loses only contractions ("'s" is one piece, two CNN words)
    and multi-character punctuation pieces, which become [UNK]."""
    from encoder_zoo.glue.tasks import load_rotten_tomatoes

    data = load_rotten_tomatoes()
    encoder_tokenizer = _trained_tokenizer(kind, data["train"]["sentence"][:3000])
    words_tokenizer = AutoTokenizer.from_pretrained(cnn_export)
    tables = build_word_lookup(encoder_tokenizer, words_tokenizer)
    config = BertacConfig(cnn_config={"vocab_size": len(words_tokenizer), "word_embedding_dim": 8, "mask_token_id": 2},
                          separator_token_ids=tables["separator_token_ids"], word_lookup_size=len(tables["word_keys"]),
                          backbone_vocab_size=len(tables["piece_flags"]))
    lookup = BertacWordLookup(config)
    lookup.load_tables(tables)
    sentences = data["validation"]["sentence"][:200]
    batch = encoder_tokenizer(sentences[:100], sentences[100:], padding=True, return_tensors="pt")
    words, mask = lookup(batch["input_ids"], batch["attention_mask"])
    same = sum(words[row, segment][mask[row, segment]].tolist() == words_tokenizer(text)["input_ids"]
               for row in range(100) for segment, text in enumerate((sentences[row], sentences[100 + row])))
    assert same >= share * 200, same
    if kind == "byte_level_bpe":  # cased forms and the space context are in the table
        encoded = encoder_tokenizer(["Paris is big.", "It was Paris."], padding=True, return_tensors="pt")
        words, mask = lookup(encoded["input_ids"], encoded["attention_mask"])
        vocab = words_tokenizer.get_vocab()
        assert words[0, 0, 0] == vocab["paris"] and words[1, 0, 2] == vocab["paris"]


# ----------------------------------------------------------------------------------------------------- masking
def test_noun_phrase_masks_follow_the_authors_rules():
    nlp = load_pipeline()
    single = noun_chunks(nlp("The new international airport opened near the old city."))
    start, end = longest_noun_phrase(single)
    assert "The new international airport opened near the old city."[start:end] == "The new international airport"
    a, b = "A man is playing a guitar on the street.", "The man plays an old electric guitar on stage."
    span_a, span_b = longest_common_noun_phrase(noun_chunks(nlp(a)), noun_chunks(nlp(b)))
    # "man" and "guitar" are both common one-word runs; the longer string wins; determiners stay unmasked.
    assert (a[slice(*span_a)], b[slice(*span_b)]) == ("guitar", "guitar")
    assert longest_common_noun_phrase(noun_chunks(nlp("It rains.")), noun_chunks(nlp("She sings."))) is None
    assert longest_noun_phrase(noun_chunks(nlp("It rains."))) is None  # a pronoun is no content word: m = s
    encoded = AutoTokenizer.from_pretrained(minilm_path())(["It rains."], return_offsets_mapping=True)
    assert EntitySpanBuilder()(encoded, [["It rains."]])["entity_spans"] == [[[-1, -1], [-1, -1]]]


# ------------------------------------------------------------------------------------------- model invariants
def test_padding_changes_no_prediction(backbone, cnn_export, tokenizer):
    classifier = build(backbone, cnn_export).eval()
    reader = build(backbone, cnn_export, head=BertacForQuestionAnswering).eval()
    batch = pair_batch(tokenizer)
    wide = {k: v for k, v in batch.items()}
    extra = 9
    wide["input_ids"] = torch.cat([batch["input_ids"], torch.zeros(2, extra, dtype=torch.long)], 1)
    wide["attention_mask"] = torch.cat([batch["attention_mask"], torch.zeros(2, extra, dtype=torch.long)], 1)
    wide["token_type_ids"] = torch.cat([batch["token_type_ids"], torch.zeros(2, extra, dtype=torch.long)], 1)
    with torch.no_grad():
        torch.testing.assert_close(classifier(**wide).logits, classifier(**batch).logits, rtol=1e-5, atol=1e-6)
        alone = classifier(**{k: v[:1, : int(batch["attention_mask"][0].sum())] for k, v in batch.items()}).logits
        torch.testing.assert_close(alone, classifier(**batch).logits[:1], rtol=1e-5, atol=1e-6)
        narrow, padded = reader(**batch), reader(**wide)
        length = batch["input_ids"].shape[1]
        torch.testing.assert_close(padded.start_logits[:, :length], narrow.start_logits, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(padded.end_logits[:, :length], narrow.end_logits, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("head", [BertacForSequenceClassification, BertacForQuestionAnswering])
def test_compiles_with_fullgraph_and_gives_the_eager_outputs(backbone, cnn_export, tokenizer, head):
    """The word lookup and the CNN trace into one graph: fixed shapes (no boolean indexing, no width read from the
    data), so `fullgraph=True` holds; the compiled outputs equal the eager ones."""
    model = build(backbone, cnn_export, head=head).eval()
    batch = pair_batch(tokenizer)
    torch._dynamo.reset()
    with torch.no_grad():
        expected = model(**batch)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(**batch)
    for name in ("logits", "start_logits", "end_logits"):
        if expected.get(name) is not None:
            torch.testing.assert_close(compiled[name], expected[name], rtol=1e-5, atol=1e-6)


def test_config_exposes_the_encoder_as_its_text_config(backbone, cnn_export, tmp_path):
    model = build(backbone, cnn_export)
    text = model.config.get_text_config()
    assert text is model.config.backbone_config and text.vocab_size == model.get_input_embeddings().num_embeddings
    assert model.config.get_text_config(decoder=True) is text and text.hidden_size == 32
    model.resize_token_embeddings(text.vocab_size + 3)
    assert model.config.get_text_config().vocab_size == model.get_input_embeddings().num_embeddings
    model.config.save_pretrained(tmp_path)
    reloaded = BertacConfig.from_pretrained(tmp_path)
    assert reloaded.get_text_config().vocab_size == text.vocab_size and reloaded.get_text_config().model_type == "bert"


def test_the_cnn_and_its_table_get_no_gradient_while_updates_and_tiers_train(backbone, cnn_export, tokenizer, tmp_path):
    model = build(backbone, cnn_export).train()
    assert all(not p.requires_grad for p in model.bertac.cnn.parameters())
    assert ("bertac.cnn.embeddings.weight" in model.state_dict()
            and "bertac.cnn.embeddings.weight" not in dict(model.named_parameters()))
    model(**pair_batch(tokenizer), labels=torch.tensor([0, 2])).loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(grads[n] is None for n in grads if n.startswith("bertac.cnn."))
    for part in ("bertac.tier_layers.0.", "bertac.tier_layers.2.", "bertac.input_updates.0.0.",
                 "bertac.input_updates.1.1.", "bertac.backbone.", "pooler.", "classifier."):
        trained = [n for n in grads if n.startswith(part)]
        assert trained and all(grads[n] is not None and grads[n].abs().sum() > 0 for n in trained), part
    # transformers makes every loaded parameter trainable; the CNN is frozen again after from_pretrained.
    model.save_pretrained(tmp_path)
    reloaded = BertacForSequenceClassification.from_pretrained(tmp_path)
    assert all(not p.requires_grad for p in reloaded.bertac.cnn.parameters())
    assert all(p.requires_grad for n, p in reloaded.named_parameters() if not n.startswith("bertac.cnn."))


def test_heads_compute_their_losses(backbone, cnn_export, tokenizer):
    batch = pair_batch(tokenizer)
    regressor = build(backbone, cnn_export, num_labels=1).eval()
    with torch.no_grad():
        output = regressor(**batch, labels=torch.tensor([0.5, -1.0]))
    assert output.logits.shape == (2, 1)
    torch.testing.assert_close(output.loss,
                               torch.nn.functional.mse_loss(output.logits.squeeze(-1), torch.tensor([0.5, -1.0])))
    reader = build(backbone, cnn_export, head=BertacForQuestionAnswering).eval()
    starts, ends = torch.tensor([3, 5]), torch.tensor([4, 9])
    with torch.no_grad():
        output = reader(**batch, start_positions=starts, end_positions=ends)
    cross_entropy = torch.nn.functional.cross_entropy
    expected = (cross_entropy(output.start_logits, starts) + cross_entropy(output.end_logits, ends)) / 2
    torch.testing.assert_close(output.loss, expected)


# ------------------------------------------------------------------------------------------------- ablations
def test_without_update_every_tier_reads_the_first_cnn_vectors(backbone, cnn_export, tokenizer):
    batch = pair_batch(tokenizer)
    full = build(backbone, cnn_export).eval()
    fixed = build(backbone, cnn_export, update_cnn_input=False).eval()
    assert fixed.bertac.input_updates is None and len(full.bertac.input_updates) == 2  # between the 3 TIER layers
    with torch.no_grad():
        vectors = fixed.bertac(**batch).cnn_representations
        updated = full.bertac(**batch).cnn_representations
    assert all(torch.equal(v, vectors[0]) for v in vectors)
    torch.testing.assert_close(updated[0], vectors[0])  # F(m^1) is the same; the updates change the later ones
    assert not torch.allclose(updated[1], updated[0]) and not torch.allclose(updated[2], updated[1])


def test_without_cnn_and_tier_is_the_encoder_alone_with_the_same_head(backbone, cnn_export, tokenizer):
    model = BertacForSequenceClassification.from_pretrained_parts(backbone, None, num_labels=3,
                                                                  use_cnn_and_tier=False).eval()
    assert model.bertac.cnn is None and model.bertac.tier_layers is None and model.bertac.word_lookup is None
    reference = BertForSequenceClassification.from_pretrained(backbone, num_labels=3).eval()
    reference.bert.pooler.load_state_dict(model.pooler.state_dict())
    reference.classifier.load_state_dict(model.classifier.state_dict())
    batch = pair_batch(tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits,
                                   reference(**{k: v for k, v in batch.items() if k != "entity_spans"}).logits)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())
    full = build(backbone, cnn_export)
    assert sum(p.numel() for p in full.parameters()) > sum(p.numel() for p in model.parameters())


def test_random_cnn_is_trained_and_keeps_the_frozen_word_table(backbone, cnn_export, tokenizer):
    export = BertacCnnModel.from_pretrained(cnn_export)
    model = build(backbone, cnn_export, cnn_weights="random").train()
    cnn = model.bertac.cnn
    assert model.config.cnn_trainable and all(p.requires_grad for p in cnn.parameters())
    assert torch.equal(cnn.embeddings.weight, export.embeddings.weight)
    assert not torch.equal(cnn.encoder.projection.weight, export.encoder.projection.weight)
    model(**pair_batch(tokenizer), labels=torch.tensor([1, 0])).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in cnn.encoder.parameters())
    pretrained = build(backbone, cnn_export)
    assert torch.equal(pretrained.bertac.cnn.encoder.projection.weight, export.encoder.projection.weight)


def test_self_supervised_cnn_export_plugs_in_as_its_ablation(backbone, cnn_export, tmp_path):
    gan = BertacCnnModel.from_pretrained(cnn_export)
    config = gan.config.to_dict()
    config.update(pretraining_objective="self_supervised")
    torch.manual_seed(1)
    supervised = BertacCnnForPreTraining(type(gan.config)(**{k: v for k, v in config.items()
                                                             if k not in ("auto_map", "architectures",
                                                                          "transformers_version")}))
    supervised.cnn.embeddings.weight.copy_(gan.embeddings.weight)
    supervised.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(cnn_export).save_pretrained(tmp_path)
    model = build(backbone, str(tmp_path))
    assert model.config.cnn_config.pretraining_objective == "self_supervised"
    assert torch.equal(model.bertac.cnn.encoder.projection.weight, supervised.cnn.encoder.projection.weight)
    assert not any(name.startswith("bertac.cnn.entity_projection") for name in model.state_dict())


def test_detached_cnn_output_leaves_the_update_layers_untrained_as_the_released_code(backbone, cnn_export, tokenizer):
    model = build(backbone, cnn_export, detach_cnn_output=True).train()
    model(**pair_batch(tokenizer), labels=torch.tensor([0, 1])).loss.backward()
    updates = [p.grad for p in model.bertac.input_updates.parameters()]
    assert all(g is None or g.abs().sum() == 0 for g in updates)
    assert all(p.grad is not None for p in model.bertac.tier_layers.parameters())
    with pytest.raises(ValueError, match="detach_cnn_output"):
        BertacConfig(cnn_trainable=True, detach_cnn_output=True)


# ------------------------------------------------------------------------------------------------- save / load
def test_reload_in_a_plain_environment_through_every_auto_class(backbone, cnn_export, tokenizer, tmp_path):
    model = build(backbone, cnn_export).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    saved = "".join(p.read_text(errors="ignore") for p in tmp_path.iterdir() if p.suffix in (".json", ".py", ".md"))
    assert str(Path(backbone).parent) not in saved and "site-packages" not in saved  # no local path is saved
    batch = pair_batch(tokenizer)
    with torch.no_grad():
        expected = model(**batch).logits
        expected_words = model.bertac.cnn_inputs(batch["input_ids"], batch["attention_mask"], batch["entity_spans"])[0]
    result = json.loads(run_isolated(f"""
        import json, torch
        from transformers import (AutoConfig, AutoModel, AutoModelForQuestionAnswering,
                                  AutoModelForSequenceClassification, AutoTokenizer)
        path = {str(tmp_path)!r}
        batch = {{k: torch.tensor(v) for k, v in {json.dumps({k: v.tolist() for k, v in batch.items()})}.items()}}
        config = AutoConfig.from_pretrained(path, trust_remote_code=True)
        classifier = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
        bare = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
        reader = AutoModelForQuestionAnswering.from_pretrained(path, trust_remote_code=True).eval()
        with torch.no_grad():
            logits = classifier(**batch).logits
            words = bare.cnn_inputs(batch["input_ids"], batch["attention_mask"], batch["entity_spans"])[0]
            state = bare(**batch).last_hidden_state
            start = reader(**batch).start_logits
        print(json.dumps({{"config": type(config).__name__, "logits": logits.tolist(), "words": words.tolist(),
                          "classes": [type(m).__name__ for m in (classifier, bare, reader)],
                          "module": type(classifier).__module__, "backbone": type(bare.backbone).__name__,
                          "frozen": all(not p.requires_grad for p in classifier.bertac.cnn.parameters()),
                          "shapes": [list(state.shape), list(start.shape)],
                          "tokenizer": type(AutoTokenizer.from_pretrained(path, trust_remote_code=True)).__name__}}))
    """).strip().splitlines()[-1])
    assert result["config"] == "BertacConfig" and "transformers_modules" in result["module"]
    assert result["classes"] == ["BertacForSequenceClassification", "BertacModel", "BertacForQuestionAnswering"]
    assert result["backbone"] == "BertModel" and result["frozen"]
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(torch.tensor(result["words"]), expected_words)  # tables and frozen CNN table came back
    length = batch["input_ids"].shape[1]
    assert result["shapes"] == [[2, length, 32], [2, length]]


def tiny_cnn_export(folder: Path) -> str:
    """A random 8-d CNN with a word tokenizer of a few real sentences, saved as a `bertac_cnn` export is (no GAN
    run: what BERTAC reads from it is its shape and files)."""
    from encoder_zoo.training.data.bertac_pairs import train_word_tokenizer

    words = train_word_tokenizer([sentence for pair in PAIRS for sentence in pair], vocab_size=100)
    torch.manual_seed(0)
    cnn = BertacCnnModel(BertacCnnConfig(vocab_size=len(words), word_embedding_dim=8, filter_windows=[1, 2],
                                         num_filters=4, mask_token_id=words.mask_token_id,
                                         pad_token_id=words.pad_token_id))
    cnn.save_pretrained(folder)
    words.save_pretrained(folder)
    return str(folder)


ZOO_BACKBONES = {  # every zoo family that is an encoder, tiny (HIRE and BERTAC are not: init_bertac refuses them)
    "spanbert": {},
    "teams": {"embedding_size": 32},
    "cloze": {},
}


def test_bertac_over_every_zoo_encoder_reloads_without_this_repository(tokenizer, tmp_path):
    """`glue/init_bertac.py --backbone <a zoo export>` saves the encoder family's code next to BERTAC's: the folder
    loads with `trust_remote_code=True` in a process that cannot import this repository, with the same outputs."""
    from encoder_zoo.glue.init_bertac import main as init_bertac

    cnn = tiny_cnn_export(tmp_path / "cnn")
    batch = pair_batch(tokenizer)
    expected = {}
    for family, sizes in ZOO_BACKBONES.items():
        config_class, model_class = models.get_class(family, "AutoConfig"), models.get_class(family, "AutoModel")
        config = config_class(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, **sizes)
        torch.manual_seed(0)
        model_class(config).save_pretrained(tmp_path / family)
        tokenizer.save_pretrained(tmp_path / family)
        folder = Path(init_bertac(["--backbone", str(tmp_path / family), "--cnn", cnn, "--num_labels", "3",
                                   "--output_dir", str(tmp_path / f"bertac-{family}")]))
        assert ({f"configuration_{family}.py", f"modeling_{family}.py", "bertac_backbone.py"}
                <= {p.name for p in folder.iterdir()})
        assert f"BACKBONE_CLASSES = {{{family!r}: ({config_class.__name__}, {model_class.__name__})}}" in (
            folder / "bertac_backbone.py").read_text()
        model = BertacForSequenceClassification.from_pretrained(folder).eval()
        with torch.no_grad():
            expected[family] = model(**batch).logits
    result = json.loads(run_isolated(f"""
        import json, torch
        from transformers import AutoModel, AutoModelForSequenceClassification
        batch = {{k: torch.tensor(v) for k, v in {json.dumps({k: v.tolist() for k, v in batch.items()})}.items()}}
        out = {{}}
        for family in {list(ZOO_BACKBONES)!r}:
            path = {str(tmp_path)!r} + "/bertac-" + family
            model = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
            with torch.no_grad():
                logits = model(**batch).logits
            bare = AutoModel.from_pretrained(path, trust_remote_code=True)
            out[family] = {{"logits": logits.tolist(), "encoder": type(model.bertac.backbone).__module__,
                           "bare": type(bare.backbone).__name__}}
        print(json.dumps(out))
    """).strip().splitlines()[-1])
    for family in ZOO_BACKBONES:
        assert (result[family]["encoder"].startswith("transformers_modules.")
                and result[family]["encoder"].endswith(f"modeling_{family}"))
        assert result[family]["bare"] == models.get_class(family, "AutoModel").__name__
        torch.testing.assert_close(torch.tensor(result[family]["logits"]), expected[family], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ fine-tuning scripts
@pytest.fixture(scope="module")
def bertac_init(tmp_path_factory, backbone, cnn_export):
    from encoder_zoo.glue.init_bertac import main as init_bertac

    out = tmp_path_factory.mktemp("bertac_init")
    return init_bertac(["--backbone", backbone, "--cnn", cnn_export, "--output_dir", str(out / "init"),
                        "--num_labels", "2"])


@pytest.fixture(scope="module")
def wiki(tmp_path_factory):
    from encoder_zoo.qa.data import build_wiki_cloze

    return build_wiki_cloze(articles=300, cache_dir=str(session_dir(tmp_path_factory) / "bertac_wiki_cache"))


def test_init_bertac_writes_a_card_and_every_needed_file(bertac_init):
    files = {p.name for p in Path(bertac_init).iterdir()}
    assert {"config.json", "model.safetensors", "configuration_bertac.py", "modeling_bertac.py", "tokenizer.json",
            "README.md"} <= files
    card = Path(bertac_init, "README.md").read_text()
    assert "TIER layers | 3 x width 32" in card and "@inproceedings{oh2021bertac" in card and "/tmp" not in card
    assert "LoraConfig(target_modules=['query', 'value']" in card


def test_glue_fine_tunes_bertac_on_single_sentences_and_pairs(bertac_init, tmp_path):
    from encoder_zoo.glue.run_glue import main as run_glue

    common = ["--model_name_or_path", bertac_init, "--trust_remote_code", "--max_train_samples", "32",
              "--max_eval_samples", "16", "--num_train_epochs", "1", "--per_device_train_batch_size", "8",
              "--max_seq_length", "48"]
    results = run_glue([*common, "--task_name", "rotten_tomatoes", "--seeds", "1", "2",
                        "--output_dir", str(tmp_path / "rt"), "--add_to_model_card"])
    runs = results["tasks"]["rotten_tomatoes"]["runs"]
    assert len(runs) == 2 and 0 <= results["tasks"]["rotten_tomatoes"]["median"]["accuracy"] <= 100
    assert not (tmp_path / "rt" / "rotten_tomatoes" / "seed-1" / "README.md").exists()  # cut-down runs: no model-index
    rows = [{"premise": a, "hypothesis": b, "label": i % 2} for i, (a, b) in enumerate(PAIRS * 12)]
    for name, chunk in (("train", rows), ("validation", rows[:8])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chunk))
    pair = run_glue([*common, "--train_file", str(tmp_path / "train.jsonl"),
                     "--validation_file", str(tmp_path / "validation.jsonl"),
                     "--text_columns", "premise", "hypothesis", "--output_dir", str(tmp_path / "pairs")])
    assert set(pair["tasks"]["custom"]["median"]) == {"accuracy", "f1"}
    tuned = BertacForSequenceClassification.from_pretrained(tmp_path / "pairs" / "custom" / "seed-42")
    assert all(not p.requires_grad for p in tuned.bertac.cnn.parameters())


def squad_file(path, records):
    data = [{"title": "t", "paragraphs": [{"context": r["context"], "qas": [
        {"id": r["id"], "question": r["question"],
         "answers": [{"text": t, "answer_start": s}
                     for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]}]}]}
            for r in records]
    path.write_text(json.dumps({"version": "v1.1", "data": data}))
    return str(path)


def test_qa_fine_tunes_bertac_question_answering(bertac_init, wiki, tmp_path):
    from encoder_zoo.qa.run_qa import main as run_qa

    train = squad_file(tmp_path / "train.json", wiki["train"].select(range(24)))
    valid = squad_file(tmp_path / "valid.json", wiki["validation"].select(range(10)))
    results = run_qa(["--model_name_or_path", bertac_init, "--trust_remote_code", "--train_file", train,
                      "--validation_file", valid, "--output_dir", str(tmp_path / "qa"), "--max_seq_length", "96",
                      "--doc_stride", "32", "--max_question_length", "40", "--num_train_epochs", "1",
                      "--per_device_train_batch_size", "8"])
    assert results["version_2"] is False and {"exact_match", "f1"} <= set(results["eval"])
    assert len(json.loads((tmp_path / "qa" / "predictions.json").read_text())) == 10
    assert type(BertacForQuestionAnswering.from_pretrained(tmp_path / "qa")).__name__ == "BertacForQuestionAnswering"


def test_open_domain_qa_combines_selector_and_reader_probabilities():
    import datasets

    from encoder_zoo.qa.run_open_qa import combine

    pairs = datasets.Dataset.from_dict({"id": ["q|0", "q|1", "q|2"], "question_id": ["q"] * 3})
    selector = {"q|0": 0.9, "q|1": 0.6, "q|2": 0.3}
    nbest = {"q|0": [{"text": "Paris", "probability": 0.5}, {"text": "Lyon", "probability": 0.5}],
             "q|1": [{"text": "the Lyon", "probability": 0.9}, {"text": "Paris.", "probability": 0.1}],
             "q|2": [{"text": "Rome", "probability": 1.0}]}
    normalize = lambda text: " ".join(text.lower().replace(".", "").replace("the ", "").split())  # noqa: E731
    answer = combine(pairs, selector, nbest, normalize)["q"]
    # P(Lyon) = (0.9 * 0.5 + 0.6 * 0.9) / 1.8 = 0.55 > P(Paris) = (0.45 + 0.06) / 1.8 > P(Rome) = 0.3 / 1.8
    assert answer["text"] == "Lyon" and answer["score"] == pytest.approx(0.99 / 1.8)
    assert sum(answer["passage_probabilities"].values()) == pytest.approx(1.0)


@pytest.mark.parametrize("encoder", ["bertac", "plain"])
def test_open_domain_qa_runs_end_to_end_for_any_encoder(encoder, bertac_init, backbone, wiki, tmp_path):
    from encoder_zoo.qa.open_data import build_wiki_open
    from encoder_zoo.qa.run_open_qa import main as run_open_qa

    questions = build_wiki_open(wiki, num_passages=4)
    for split in questions:
        for record in questions[split]:
            assert len(record["passages"]) == 4 and len(set(record["passages"])) == 4
    records = {split: questions[split].select(range(n)) for split, n in (("train", 16), ("validation", 6))}
    for split, rows in records.items():
        rows.to_json(tmp_path / f"{split}.jsonl")
    model = bertac_init if encoder == "bertac" else backbone
    results = run_open_qa(["--model_name_or_path", model, "--trust_remote_code",
                           "--train_file", str(tmp_path / "train.jsonl"),
                           "--validation_file", str(tmp_path / "validation.jsonl"),
                           "--output_dir", str(tmp_path / "out"),
                           "--max_seq_length", "96", "--doc_stride", "32", "--max_question_length", "40",
                           "--num_train_epochs", "1", "--per_device_train_batch_size", "8", "--add_to_model_card"])
    card = ModelCard.load(tmp_path / "out" / "reader" / "README.md")  # the dataset by its own id, no local path
    assert [(r.dataset_type, r.dataset_name, r.metric_type) for r in card.data.eval_results] == [
        ("local:validation", "validation.jsonl", "exact_match"), ("local:validation", "validation.jsonl", "f1")]
    assert str(tmp_path) not in card.content
    assert results["train"]["passages"] == 64 and 16 <= results["train"]["passages_with_answer"] < 64
    assert results["train"]["reader_windows"] >= 16 and results["eval"]["questions_with_an_answer_passage"] == 100.0
    assert {"exact_match", "f1", "selector_top1_holds_answer"} <= set(results["eval"])
    predictions = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert set(predictions) == set(records["validation"]["id"])
    assert not list((tmp_path / "out").rglob("training_args.bin"))  # the selector and the reader: JSON, no pickle
    assert all((tmp_path / "out" / name / "training_args.json").is_file() for name in ("selector", "reader"))
    expected = "BertacForSequenceClassification" if encoder == "bertac" else "BertForSequenceClassification"
    assert json.loads((tmp_path / "out" / "selector" / "config.json").read_text())["architectures"] == [expected]


def test_bad_input_gets_one_clear_line(backbone, cnn_export, bertac_init, tmp_path):
    from encoder_zoo.glue.init_bertac import main as init_bertac
    from encoder_zoo.qa.run_open_qa import main as run_open_qa

    with pytest.raises(ValueError, match="not a bertac_cnn export"):
        init_bertac(["--backbone", backbone, "--cnn", backbone, "--output_dir", str(tmp_path / "a")])
    with pytest.raises(ValueError, match="already holds files"):  # nothing a user has is overwritten
        init_bertac(["--backbone", backbone, "--cnn", cnn_export, "--output_dir", bertac_init])
    (tmp_path / "bad.jsonl").write_text('{"question": "q?", "passages": ["p"]}\n')
    with pytest.raises(ValueError, match=r"missing \['answers'\]"):
        run_open_qa(["--model_name_or_path", backbone, "--train_file", str(tmp_path / "bad.jsonl"),
                     "--output_dir", str(tmp_path / "b")])
    result = subprocess.run([sys.executable, str(REPO / "glue" / "init_bertac.py"), "--backbone", backbone,
                             "--output_dir", str(tmp_path / "c")], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("init_bertac.py: error: --cnn is required")
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_short_real_fine_tune_on_rotten_tomatoes_reduces_loss(cnn_export, tokenizer):
    """BERTAC over the pretrained MiniLM with the tiny GAN CNN: 40 steps of 16 real snippets (AdamW 1e-4)."""
    from encoder_zoo.glue.tasks import load_rotten_tomatoes

    model = build(minilm_path(), cnn_export, num_labels=2).train()
    builder = EntitySpanBuilder()
    data = load_rotten_tomatoes()["train"].shuffle(seed=0).select(range(640))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    losses = []
    for step in range(40):
        rows = data[step * 16 : (step + 1) * 16]
        encoded = tokenizer(rows["sentence"], truncation=True, max_length=48, return_offsets_mapping=True)
        encoded.update(builder(encoded, [rows["sentence"]]))
        encoded.pop("offset_mapping")
        loss = model(**tokenizer.pad(encoded, return_tensors="pt"), labels=torch.tensor(rows["label"])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert sum(losses[-8:]) / 8 < sum(losses[:8]) / 8 - 0.1, losses
