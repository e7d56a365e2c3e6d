"""BERTAC part 1: the CNN (`BertacCnnModel`), its GAN pretraining (`BertacCnnForPreTraining`, `GanTrainer`), the
entity-masked pair builder, the word tokenizer and vectors, and `pretrain.py --model bertac_cnn` end to end."""

import bz2
import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from helpers import run_isolated, session_dir, terminate_when, two_process_launcher
from safetensors.torch import load_file
from test_pretrain import PRETRAIN, env, pretrain
from torch.nn import functional as F

from encoder_zoo import models  # noqa: F401
from encoder_zoo.models.bertac.configuration_bertac import BertacCnnConfig
from encoder_zoo.models.bertac.modeling_bertac import (
    BertacCnnForPreTraining,
    BertacCnnModel,
    discriminator_loss,
    generator_loss,
)
from encoder_zoo.training.data import bertac_pairs as bertac_data
from encoder_zoo.training.recipes.bertac import BERTAC_CNN_SIZES

# 12 real articles of the embedded enwiki excerpt (about 1,400 pairs), the tiny preset, 16 pairs per step.
TINY = ["--model", "bertac_cnn", "--model_size", "tiny", "--max_documents", "12", "--per_device_train_batch_size", "16",
        "--dataloader_num_workers", "0"]
REFERENCE_STEPS = 200

WIKITEXT = """{{Infobox airport}}
'''[[Suvarnabhumi Airport]]''' ({{lang-th|x}}) is [[Thailand]]'s main international air hub.<ref>A [[Citation]].</ref>
It serves [[Bangkok|the capital]] and many [[bus]]es of the [[U.S. Army]] daily. [[File:Plane.jpg|thumb|A [[plane]]]]
* A list item with a [[Link]].
== History ==
The airport opened in 2006 near [[Bang Phli District|Bang Phli]], replacing \
[[Don Mueang International Airport|Don Mueang]].  No link here.
[[Category:Airports in Thailand]]
[[de:Flughafen Suvarnabhumi]]
"""


def step_logs(state_path):
    return [entry for entry in json.loads(Path(state_path).read_text())["log_history"]
            if "f_loss" in entry or "mse_loss" in entry]


def tiny_config(**overrides):
    return BertacCnnConfig(**{"vocab_size": 60, "word_embedding_dim": 12, "filter_windows": [1, 2, 3], "num_filters": 5,
                              "mask_token_id": 2, **overrides})


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """An uninterrupted tiny run (fastText trained on the fly, checkpoints every 10 steps, export at the end), made
    once for every pytest-xdist worker (they share the parent of their temporary folders)."""
    from filelock import FileLock

    shared = session_dir(tmp_path_factory)
    out = shared / "bertac_reference_run"
    with FileLock(str(shared / "bertac_reference_run.lock")):
        if not (out / "export" / "model.safetensors").exists():
            pretrain(*TINY, "--output_dir", str(out), "--max_steps", str(REFERENCE_STEPS), "--logging_steps", "1",
                     "--save_steps", "10", "--save_total_limit", "100", "--validation_documents", "2",
                     "--overwrite_output_dir")
    return out


# ------------------------------------------------------------------------------------------------ the networks
def test_presets_and_output_shapes():
    assert len(BERTAC_CNN_SIZES) == 10 and {"tiny", "w123-f100", "w234-f200", "w1234-f300"} <= set(BERTAC_CNN_SIZES)
    assert BertacCnnConfig(**BERTAC_CNN_SIZES["w1234-f300"]).output_size == 1200  # de = |windows| x filters
    torch.manual_seed(0)
    config = tiny_config()
    # Initialisation: W_s ~ N(0, 0.1), He-initialised convolutions, D undecided (zero), pad row 0, others U(-0.1, 0.1).
    wide = BertacCnnForPreTraining(tiny_config(vocab_size=2000, word_embedding_dim=64, num_filters=64))
    assert wide.cnn.encoder.projection.weight.std().item() == pytest.approx(0.1, rel=0.05)
    he_std = math.sqrt(2 / (1 + 0.01**2) / (64 * 3))
    assert wide.real_encoder.convolutions[2].weight.std().item() == pytest.approx(he_std, rel=0.05)
    assert wide.discriminator.weight.abs().sum() == 0 and wide.discriminator.bias.abs().sum() == 0
    table = wide.cnn.embeddings.weight
    assert table[0].abs().sum() == 0 and table.abs().max() <= 0.1 and table.std() > 0.05
    ids = torch.randint(3, 60, (4, 9))
    entities = torch.randint(3, 60, (4, 3))
    assert BertacCnnModel(config)(ids).pooler_output.shape == (4, 15)
    model = BertacCnnForPreTraining(config)
    full = model(ids, entity_ids=entities)
    assert full.real_representation.shape == full.fake_representation.shape == (4, 15)
    assert full.real_logits.shape == full.fake_logits.shape == (4,)
    assert full.loss.shape == () and torch.equal(full.loss, full.d_loss) and full.f_loss is not None
    generator_step = model(ids, entity_ids=entities, gan_step="generator")
    assert generator_step.d_loss is None and torch.equal(generator_step.loss, generator_step.f_loss)
    with pytest.raises(ValueError, match="gan_step"):
        model(ids, entity_ids=entities, gan_step="both")


def test_pooled_vector_ignores_padding_and_matches_the_unpadded_convolution():
    torch.manual_seed(0)
    config = tiny_config()
    model = BertacCnnModel(config).eval()
    sentence = torch.randint(3, 60, (1, 5))
    padded = torch.cat([sentence, torch.zeros(1, 7, dtype=torch.long)], dim=1)
    batch = torch.cat([padded, torch.randint(3, 60, (1, 12))])
    alone = model(sentence).pooler_output
    in_batch = model(batch, attention_mask=(batch != 0).long()).pooler_output[:1]
    torch.testing.assert_close(in_batch, alone, rtol=0, atol=1e-6)

    # The paper's CNN on the unpadded sentence: projection, Conv1d(padding w-1), leaky ReLU, mean over all outputs.
    encoder = model.encoder
    words = F.leaky_relu(model.embeddings(sentence) @ encoder.projection.weight.T, 0.01).transpose(1, 2)
    reference = torch.cat([F.leaky_relu(conv(words), 0.01).mean(-1) for conv in encoder.convolutions], dim=-1)
    torch.testing.assert_close(alone, reference, rtol=1e-5, atol=1e-6)
    # Same vector through inputs_embeds (BERTAC's updated CNN inputs).
    torch.testing.assert_close(model(inputs_embeds=model.embeddings(sentence)).pooler_output, alone)


def test_real_and_fake_generators_share_no_parameters_and_each_step_trains_its_own_side():
    torch.manual_seed(0)
    model = BertacCnnForPreTraining(tiny_config())
    fake = {id(p) for p in model.cnn.parameters()}
    real = {id(p) for p in model.real_encoder.parameters()}
    assert fake and real and not fake & real
    assert not {id(p) for p in model.discriminator.parameters()} & (fake | real)
    # The word table is frozen: a buffer saved with the weights, read by both, trained by neither.
    assert ("cnn.embeddings.weight" in model.state_dict()
            and "cnn.embeddings.weight" not in dict(model.named_parameters()))
    assert model.cnn.embeddings.weight[model.config.pad_token_id].abs().sum() == 0

    ids, entities = torch.randint(3, 60, (6, 8)), torch.randint(3, 60, (6, 2))
    torch.nn.init.normal_(model.discriminator.weight)  # a zero (fresh) D passes no gradient to R
    model(ids, entity_ids=entities, gan_step="discriminator").loss.backward()
    trained = {name.split(".")[0] for name, p in model.named_parameters()
               if p.grad is not None and p.grad.abs().sum() > 0}
    assert trained == {"real_encoder", "discriminator"}
    model.zero_grad(set_to_none=True)
    model(ids, entity_ids=entities, gan_step="generator").loss.backward()
    trained = {name.split(".")[0] for name, p in model.named_parameters() if p.grad is not None}
    assert trained == {"cnn"}


def test_gan_losses_from_logits_equal_the_formula_and_stay_finite_when_d_saturates():
    torch.manual_seed(0)
    real, fake = torch.randn(64) * 3, torch.randn(64) * 3
    d_of = torch.sigmoid
    expected = -(torch.log(d_of(real)) + torch.log(1 - d_of(fake))).mean()
    torch.testing.assert_close(discriminator_loss(real, fake), expected)
    torch.testing.assert_close(generator_loss(fake, "minimax"), torch.log(1 - d_of(fake)).mean())
    torch.testing.assert_close(generator_loss(fake, "non_saturating"), -torch.log(d_of(fake)).mean())

    saturated_real = torch.tensor([-1e4, 1e4], requires_grad=True)
    saturated_fake = torch.tensor([1e4, -1e4], requires_grad=True)
    naive = -(torch.log(d_of(saturated_real)) + torch.log(1 - d_of(saturated_fake))).mean()
    assert not torch.isfinite(naive)  # what computing from probabilities would give
    loss = discriminator_loss(saturated_real, saturated_fake)
    assert loss.item() == pytest.approx(1e4)  # (1e4 + 0 + 0 + 1e4) / 2
    loss.backward()
    assert torch.isfinite(saturated_real.grad).all() and torch.isfinite(saturated_fake.grad).all()
    for kind in ("minimax", "non_saturating"):
        assert torch.isfinite(generator_loss(torch.tensor([1e4, -1e4]), kind))


def test_self_supervised_ablation_regresses_the_mean_entity_embedding_through_a_projection():
    torch.manual_seed(0)
    model = BertacCnnForPreTraining(tiny_config(pretraining_objective="self_supervised"))
    assert model.real_encoder is None and model.discriminator is None
    assert (model.entity_projection.in_features, model.entity_projection.out_features) == (15, 12)  # de -> dw
    ids, entities = torch.randint(3, 60, (4, 8)), torch.tensor([[5, 6, 0], [7, 0, 0], [8, 9, 10], [11, 12, 0]])
    output = model(ids, entity_ids=entities)
    table = model.cnn.embeddings.weight
    target = torch.stack([table[row[row != 0]].mean(0) for row in entities])
    prediction = model.entity_projection(model.cnn(ids).pooler_output)
    torch.testing.assert_close(output.loss, F.mse_loss(prediction, target))
    with pytest.raises(ValueError, match="pretraining_objective"):
        tiny_config(pretraining_objective="wgan")


# ------------------------------------------------------------------------------------------------------- data
def test_wikitext_fixture_gives_sentences_with_link_mentions():
    sentences = bertac_data.wikitext_sentences(WIKITEXT)
    texts = [text for text, _ in sentences]
    assert texts == [
        "Suvarnabhumi Airport is Thailand's main international air hub.",
        "It serves the capital and many buses of the U.S. Army daily.",
        "The airport opened in 2006 near Bang Phli, replacing Don Mueang.",
        "No link here.",
    ]
    mentions = [[(text[s:e], target) for s, e, target in links] for text, links in sentences]
    assert mentions[1] == [("the capital", "Bangkok"), ("buses", "bus"), ("U.S. Army", "U.S. Army")]  # link trail
    assert mentions[2] == [("Bang Phli", "Bang Phli District"), ("Don Mueang", "Don Mueang International Airport")]
    assert mentions[3] == []  # files, categories, other languages, references and lists give no mention


def test_pair_builder_replaces_one_whole_mention_by_em_deterministically():
    import datasets

    pages = datasets.Dataset.from_dict({"title": ["Suvarnabhumi Airport"], "wikitext": [WIKITEXT]})
    pairs = bertac_data.entity_masked_pairs(pages, seed=3)
    assert len(pairs) == 3  # the three sentences with at least one link, one pair each
    for pair in pairs:
        assert pair["masked"].count("[EM]") == 1 and pair["source"] == "wikilink"
        assert pair["masked"].replace("[EM]", pair["entity"]) == pair["sentence"]
        assert pair["entity"] not in pair["masked"].replace("[EM]", "")  # the mention is gone, whole
    # The draw depends on the seed and the sentence only: same seed, same pairs; other seeds pick other mentions.
    assert bertac_data.entity_masked_pairs(pages, seed=3)["entity"] == pairs["entity"]
    drawn = {tuple(bertac_data.entity_masked_pairs(pages, seed=seed)["entity"]) for seed in range(8)}
    assert len(drawn) > 1


def test_article_pages_stream_from_an_xml_dump_and_parse_on_two_processes(tmp_path):
    def page(title, ns, text, redirect=""):
        return (f"<page><title>{title}</title><ns>{ns}</ns><id>1</id>{redirect}"
                f"<revision><text>{text}</text></revision></page>")

    escaped = WIKITEXT.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    dump = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><siteinfo><sitename>W</sitename></siteinfo>'
            + page("Suvarnabhumi Airport", 0, escaped) + page("Talk:Airport", 1, "[[A]] b.")
            + page("Old name", 0, "#REDIRECT [[Suvarnabhumi Airport]]", '<redirect title="Suvarnabhumi Airport" />')
            + page("Second", 0, "The [[Moon]] orbits the [[Earth]]. It is [[Tide|tidal]].") + "</mediawiki>")
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(bz2.compress(dump.encode()))
    pages = bertac_data.load_article_pages(str(path))
    assert pages["title"] == ["Suvarnabhumi Airport", "Second"]  # no talk page, no redirect
    assert bertac_data.load_article_pages(str(path), max_documents=1)["title"] == ["Suvarnabhumi Airport"]
    one = bertac_data.entity_masked_pairs(pages, seed=0)
    two = bertac_data.entity_masked_pairs(pages, seed=0, num_proc=2)
    assert one.to_dict() == two.to_dict() and len(one) == 5
    with pytest.raises(FileNotFoundError, match="MediaWiki XML dumps"):
        bertac_data.dump_files(str(tmp_path / "missing.xml.bz2"))
    (tmp_path / "notes.xml").write_text("<notes/>")
    with pytest.raises(ValueError, match="not a MediaWiki XML dump"):
        bertac_data.dump_files(str(tmp_path / "notes.xml"))


def test_word_tokenizer_follows_the_one_word_rule_and_keeps_em_whole():
    texts = ["Café Müller opened in Düsseldorf, Germany.", "The café's owner: Pina Bausch!"]
    tokenizer = bertac_data.train_word_tokenizer(texts, vocab_size=100)
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["[PAD]", "[UNK]", "[EM]"]
    assert tokenizer.pad_token_id == 0 and tokenizer.mask_token == "[EM]"
    for text in texts:
        assert tokenizer.tokenize(text) == bertac_data.split_words(text)
    assert bertac_data.split_words("Café Müller, Düsseldorf!") == ["cafe", "muller", ",", "dusseldorf", "!"]
    encoded = tokenizer("[EM] opened in Zürich.")
    assert tokenizer.convert_ids_to_tokens(encoded["input_ids"]) == ["[EM]", "opened", "in", "[UNK]", "."]
    assert set(encoded) == {"input_ids", "attention_mask"}


def test_pairs_are_cut_around_em_with_no_warning_about_their_uncut_length():
    """A sentence longer than the word tokenizer's maximum is cut to `max_words` around [EM], and transformers'
    "Token indices sequence length is longer..." warning, about a length never used, is not printed."""
    import datasets
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging as hf_logging

    words = [f"w{i}" for i in range(20)]
    tokenizer = bertac_data.train_word_tokenizer([" ".join(words)], vocab_size=100, model_max_length=8)
    masked = " ".join([*words[:12], "[EM]", *words[12:]])
    pairs = datasets.Dataset.from_dict({"masked": [masked], "entity": [" ".join(words)]})
    with CaptureLogger(hf_logging.get_logger("transformers.tokenization_utils_base")) as log:
        encoded = bertac_data.encode_pairs(pairs, tokenizer, max_words=8)
    window = tokenizer.convert_ids_to_tokens(encoded[0]["input_ids"])
    assert window == [*words[8:12], "[EM]", *words[12:15]] and len(encoded[0]["entity_ids"]) == 8
    assert "Token indices sequence length" not in log.out


def test_embedding_table_takes_fasttext_rows_keeps_random_rows_and_a_zero_pad_row(tmp_path):
    tokenizer = bertac_data.train_word_tokenizer(["paris is big", "paris rome"], vocab_size=100)
    vectors = tmp_path / "cased.vec"
    vectors.write_text("3 4\nParis 1 2 3 4\nparis 9 9 9 9\nrome 5 6 7 8\n")  # the first (most frequent) form wins
    found = bertac_data.read_word_vectors(vectors, set(tokenizer.get_vocab()))
    table, count = bertac_data.embedding_table(tokenizer, found, dim=4, seed=0)
    vocab = tokenizer.get_vocab()
    assert count == 2
    assert table[vocab["paris"]].tolist() == [1, 2, 3, 4] and table[vocab["rome"]].tolist() == [5, 6, 7, 8]
    assert table[0].abs().sum() == 0
    others = table[[vocab[w] for w in ("is", "big", "[UNK]", "[EM]")]]
    assert others.abs().max() <= 0.1 and others.abs().sum() > 0
    assert torch.equal(table, bertac_data.embedding_table(tokenizer, found, dim=4, seed=0)[0])
    with pytest.raises(ValueError, match="word_embedding_dim=4"):
        bertac_data.embedding_table(tokenizer, found, dim=3, seed=0)


# ----------------------------------------------------------------------------------------------- pretrain.py
def test_export_reloads_without_this_repository_and_encodes_text_in_two_lines(reference_run, tmp_path):
    export = reference_run / "export"
    files = {p.name for p in export.iterdir()}
    assert {"config.json", "model.safetensors", "configuration_bertac.py", "modeling_bertac.py", "tokenizer.json",
            "README.md", "loss_curve.png", "collapse_signal.png", "discriminator_accuracy.png"} <= files
    weights = load_file(export / "model.safetensors")
    assert weights["cnn.embeddings.weight"].shape[1] == 32 and weights["cnn.embeddings.weight"][0].abs().sum() == 0
    card = (export / "README.md").read_text()
    assert "![cosine_related, cosine_unrelated](collapse_signal.png)" in card and "@inproceedings{oh2021bertac" in card
    assert "fastText trained on the pretraining sentences" in card
    # Word vectors were trained once and cached under the output folder.
    assert len(list((reference_run / "word_vectors").glob("fasttext-32d-*.vec"))) == 1

    from transformers import AutoModel, AutoTokenizer

    texts = ["[EM] is Thailand's main international air hub.", "The airport opened near [EM] in 2006."]
    tokenizer = AutoTokenizer.from_pretrained(export)
    reference = AutoModel.from_pretrained(export).eval()(**tokenizer(texts, padding=True,
                                                                     return_tensors="pt")).pooler_output
    result = json.loads(run_isolated(f"""
        import json, torch
        from transformers import AutoModel, AutoTokenizer
        path = {str(export)!r}
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        model = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
        with torch.no_grad():
            vectors = [model(**tokenizer(text, return_tensors="pt")).pooler_output[0].tolist() for text in {texts!r}]
        print(json.dumps({{"vectors": vectors, "class": type(model).__name__, "module": type(model).__module__}}))
    """).strip().splitlines()[-1])
    assert result["class"] == "BertacCnnModel" and "transformers_modules" in result["module"]
    torch.testing.assert_close(torch.tensor(result["vectors"]), reference, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_interrupted_run_resumes_bitwise(reference_run, tmp_path):
    out = tmp_path / "interrupted"
    args = [*TINY, "--output_dir", str(out), "--max_steps", str(REFERENCE_STEPS), "--logging_steps", "1",
            "--save_steps", "10", "--save_total_limit", "100", "--validation_documents", "2"]
    terminate_when([sys.executable, PRETRAIN, *args], out / "checkpoint-10" / "trainer_state.json", env())
    stopped_at = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert 10 <= stopped_at < REFERENCE_STEPS and not (out / "export").exists()

    resumed_run = pretrain(*args, "--resume_from_checkpoint", "true")
    assert "Reusing the fastText vectors" in resumed_run.stderr  # cached in OUTPUT_DIR/word_vectors, not retrained
    final, expected = out / f"checkpoint-{REFERENCE_STEPS}", reference_run / f"checkpoint-{REFERENCE_STEPS}"
    resumed_logs, reference_logs = step_logs(final / "trainer_state.json"), step_logs(expected / "trainer_state.json")
    keys = ("step", "d_loss", "f_loss", "d_accuracy_real", "d_accuracy_fake", "cosine_unrelated")
    assert [[e[k] for k in keys] for e in resumed_logs] == [[e[k] for k in keys] for e in reference_logs]
    resumed, reference = load_file(final / "model.safetensors"), load_file(expected / "model.safetensors")
    assert all(torch.equal(resumed[name], reference[name]) for name in reference)
    # RMSProp state of every network (R, D and F) carried over exactly.
    resumed_state = torch.load(final / "optimizer.pt", weights_only=False)["state"]
    reference_state = torch.load(expected / "optimizer.pt", weights_only=False)["state"]
    assert len(reference_state) == 12  # F: projection + 2 convolutions (w, b); R: the same; D: w, b
    assert all(torch.equal(resumed_state[i][k], reference_state[i][k])
               for i in reference_state for k in reference_state[i])


@pytest.mark.multiprocess
def test_two_processes_train_like_one_process_with_the_global_batch(reference_run, tmp_path):
    """CPU DDP over gloo: both updates of a step all-reduce their gradients, so 2 x 8 pairs give the weights of
    1 x 16."""
    vectors = next((reference_run / "word_vectors").glob("*.vec"))
    out = tmp_path / "ddp"
    pretrain(*TINY, "--per_device_train_batch_size", "8", "--output_dir", str(out), "--max_steps", "10",
             "--logging_steps", "1", "--save_steps", "10", "--validation_documents", "2",
             "--word_vectors", str(vectors), launcher=two_process_launcher())
    assert "| batch (sequences per update) | 16 | 4000 |" in (out / "export" / "README.md").read_text()
    two, one = (load_file(out / "checkpoint-10" / "model.safetensors"),
                load_file(reference_run / "checkpoint-10" / "model.safetensors"))
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-6)
    assert not torch.equal(two["discriminator.weight"], torch.zeros_like(two["discriminator.weight"]))


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(reference_run, tmp_path):
    vectors = next((reference_run / "word_vectors").glob("*.vec"))
    out = tmp_path / "diverging"
    result = pretrain(*TINY, "--output_dir", str(out), "--max_steps", "20", "--save_steps", "1",
                      "--save_total_limit", "100", "--learning_rate", "1e8", "--validation_documents", "0",
                      "--word_vectors", str(vectors), check=False)
    assert result.returncode == 3 and "Traceback" not in result.stderr  # diverged (docs/reliability.md)
    failed_at = int(re.search(r"at step (\d+); training stopped before that update", result.stderr).group(1))
    last_good = out / f"checkpoint-{failed_at - 1}"
    assert f"The last good checkpoint, {last_good}, is kept." in result.stderr
    # Every step before the bad one was saved (--save_steps 1), the bad state never was, nor an export.
    assert sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")) == list(range(1, failed_at))
    assert not (out / "export").exists()
    assert all(torch.isfinite(t).all() for t in load_file(last_good / "model.safetensors").values())


def test_bad_input_gets_one_clear_line(tmp_path):
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"text": "not a dump"}\n')
    result = pretrain(*TINY, "--dataset", str(notes), "--output_dir", str(tmp_path / "run"), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "is not a MediaWiki XML dump" in result.stderr
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").glob("checkpoint-*"))


@pytest.mark.slow
def test_real_data_gan_run_moves_d_off_chance_with_finite_losses(tmp_path):
    """30 real articles (~3,500 pairs), the paper's RMSProp at 2e-4, 120 steps of 64 pairs. D first learns to tell
    R(e) from F(m) (both accuracies above chance), then F catches up; every loss and norm stays finite."""
    out = tmp_path / "run"
    pretrain("--model", "bertac_cnn", "--model_size", "tiny", "--max_documents", "30", "--per_device_train_batch_size",
             "64", "--max_steps", "120", "--logging_steps", "5", "--save_steps", "120", "--validation_documents", "3",
             "--output_dir", str(out))
    logs = step_logs(out / "checkpoint-120" / "trainer_state.json")
    assert len(logs) == 24
    keys = ("d_loss", "f_loss", "d_accuracy_real", "d_accuracy_fake", "real_norm", "fake_norm", "cosine_related",
            "cosine_unrelated")
    assert all(math.isfinite(entry[key]) for entry in logs for key in keys)
    balanced = [(entry["d_accuracy_real"] + entry["d_accuracy_fake"]) / 2 for entry in logs]
    assert max(balanced) > 0.6, balanced  # D discriminates at some point: not stuck at chance
    assert any(entry["d_accuracy_real"] > 0.5 and entry["d_accuracy_fake"] > 0.5 for entry in logs)
    assert logs[-1]["fake_norm"] > logs[0]["fake_norm"]  # unnormalised outputs grow, as the note on BERTAC says
    # The held-out pairs are evaluated with the same outputs (eval_loss is D's objective).
    final_eval = [e for e in json.loads((out / "export" / "training_log.json").read_text()) if "eval_d_loss" in e][-1]
    assert final_eval["eval_loss"] == pytest.approx(final_eval["eval_d_loss"], abs=1e-4)
    assert math.isfinite(final_eval["eval_cosine_unrelated"]) and 0 <= final_eval["eval_d_accuracy_fake"] <= 1


@pytest.mark.slow
def test_self_supervised_ablation_trains_through_pretrain(reference_run, tmp_path):
    vectors = next((reference_run / "word_vectors").glob("*.vec"))
    out = tmp_path / "self_supervised"
    pretrain(*TINY, "--output_dir", str(out), "--max_steps", "60", "--logging_steps", "10", "--save_steps", "60",
             "--validation_documents", "0", "--learning_rate", "2e-3", "--word_vectors", str(vectors),
             "--config_overrides", "pretraining_objective=self_supervised")
    logs = step_logs(out / "checkpoint-60" / "trainer_state.json")
    assert all("d_loss" not in entry for entry in logs)
    assert logs[-1]["mse_loss"] < 0.7 * logs[0]["mse_loss"], [entry["mse_loss"] for entry in logs]
    weights = load_file(out / "export" / "model.safetensors")
    assert "entity_projection.weight" in weights and not any(name.startswith("real_encoder") for name in weights)


@pytest.mark.parametrize("objective", ["gan", "self_supervised"])
def test_pretraining_head_answers_without_entities(objective):
    """Inference (no entity_ids): F(m) and, in the GAN, D's logits on it; no loss. A GAN step still needs pairs."""
    torch.manual_seed(0)
    model = BertacCnnForPreTraining(tiny_config(pretraining_objective=objective)).eval()
    ids = torch.randint(3, 60, (4, 9))
    with torch.no_grad():
        out = model(ids)
        expected = model.cnn(ids).pooler_output
    assert out.loss is None and out.real_representation is None
    torch.testing.assert_close(out.fake_representation, expected)
    if objective == "gan":
        torch.testing.assert_close(out.fake_logits, model.discriminator(expected))
        with pytest.raises(ValueError, match="entity_ids"):
            model(ids, gan_step="generator")
    else:
        assert out.fake_logits is None


def test_resize_token_embeddings_grows_the_frozen_word_table():
    torch.manual_seed(0)
    model = BertacCnnForPreTraining(tiny_config())
    old = model.get_input_embeddings().weight.clone()
    table = model.resize_token_embeddings(63, pad_to_multiple_of=8)
    assert table is model.cnn.embeddings and table.num_embeddings == 64 == model.config.vocab_size
    assert "cnn.embeddings.weight" not in dict(model.named_parameters())  # still a frozen buffer
    torch.testing.assert_close(table.weight[:60], old)
    torch.testing.assert_close(table.weight[60:], old.mean(0).expand(4, -1))  # mean resizing
    model.resize_token_embeddings(70, mean_resizing=False)
    assert table.weight[64:].abs().max() <= 0.1  # the authors' vector of a word without a fastText vector
    ids, entities = torch.tensor([[3, 65, 69, 0]]), torch.tensor([[66, 0]])
    assert torch.isfinite(model(ids, entity_ids=entities).loss)
    with pytest.raises(ValueError, match=r"\[PAD\] or \[EM\]"):
        model.resize_token_embeddings(2)
