"""HIRE on tiny configs: shapes, the paper's equations, each ablation, padding invariance, save/load, real fine-tune."""

import json

import numpy as np
import pytest
import torch
from helpers import local_paths_in, run_isolated
from huggingface_hub import ModelCard
from transformers import AutoTokenizer, BertConfig

from encoder_zoo import models  # noqa: F401
from encoder_zoo.models.hire.configuration_hire import HireConfig
from encoder_zoo.models.hire.modeling_hire import HireModel, HireRobertaForSequenceClassification, MaskedBiGRU
from encoder_zoo.training.data.resources import minilm_path

BACKBONE = BertConfig(vocab_size=120, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).to_dict()


def config(**overrides):
    return HireConfig(**{"backbone_config": BACKBONE, "num_labels": 3, "gru_hidden_size": 8, "classifier_dropout": 0.0,
                         "gru_dropout": 0.0, **overrides})


def inputs(seed=0, pad_row1=3):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 120, (2, 10), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 10 - pad_row1 :] = 0
    return input_ids, attention_mask


def backbone_states(model, input_ids, attention_mask):
    return model.hire.backbone(input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states


def test_shapes_and_importance_distribution():
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config()).eval()
    ids, mask = inputs()
    out = model(ids, attention_mask=mask, labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and out.layer_importance.shape == (2, 4)  # l + 1 = 4 hidden states
    torch.testing.assert_close(out.layer_importance.sum(-1), torch.ones(2))
    assert torch.isfinite(out.loss)
    hire = model.hire(ids, attention_mask=mask)
    assert hire.last_hidden_state.shape == (2, 10, 2 * 8)  # F = 2d


def test_equations_A_M_and_output_layer_by_hand():
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config()).eval()
    ids, mask = inputs()
    out = model(ids, attention_mask=mask)
    states = backbone_states(model, ids, mask)
    stacked = torch.stack(states)
    extractor = model.hire.extractor
    # u_i from the shared GRU on each layer alone, alpha = ReLU(w^T u + b), s = softmax(alpha).
    for row in range(2):
        length = int(mask[row].sum())
        alphas = []
        for layer in range(4):
            _, final = extractor.summarizer(stacked[layer, row : row + 1, :length], torch.tensor([length]))
            u = final.permute(1, 0, 2).reshape(-1)  # 4d: both layers, both directions
            alphas.append(torch.relu(extractor.importance(u)))
        s = torch.softmax(torch.cat(alphas), 0)
        torch.testing.assert_close(out.layer_importance[row], s, rtol=1e-5, atol=1e-6)
        A = (s[:, None, None] * stacked[:, row, :length]).sum(0)
        R = states[-1][row, :length]
        M = torch.cat([R, A, R + A, R * A], -1)
        F, _ = model.hire.fusion(M[None], torch.tensor([length]))
        q = model.classifier.out_proj(torch.tanh(model.classifier.dense(F[0, 0])))
        torch.testing.assert_close(out.logits[row], q, rtol=1e-4, atol=1e-5)


def test_without_hire_fuses_R_with_itself():
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config(use_hire=False)).eval()
    assert model.hire.extractor is None
    ids, mask = inputs()
    out = model(ids, attention_mask=mask)
    assert out.layer_importance is None
    R = backbone_states(model, ids, mask)[-1][:1, :10]
    F, _ = model.hire.fusion(torch.cat([R, R, R + R, R * R], -1), torch.tensor([10]))
    head = model.classifier
    torch.testing.assert_close(out.logits[0], head.out_proj(torch.tanh(head.dense(F[0, 0]))), rtol=1e-4, atol=1e-5)


def test_without_fusion_A_goes_to_the_output_layer():
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config(use_fusion=False)).eval()
    assert model.hire.fusion is None and model.classifier.dense.in_features == 16  # d, not 2d
    ids, mask = inputs()
    out = model(ids, attention_mask=mask)
    stacked = torch.stack(backbone_states(model, ids, mask))
    A = torch.einsum("bl,lbtd->btd", out.layer_importance, stacked)
    # A at every real token; zeros at padding.
    torch.testing.assert_close(model.hire(ids, attention_mask=mask).last_hidden_state, A * mask[..., None])


@pytest.mark.parametrize("selection, expected", [("all", [0.25] * 4), ("first_k", [0.5, 0.5, 0, 0]),
                                                 ("last_k", [0, 0, 0.5, 0.5])])
def test_fixed_mean_weightings(selection, expected):
    model = HireRobertaForSequenceClassification(config(layer_weighting="mean", layer_selection=selection,
                                                        num_selected_layers=2)).eval()
    ids, mask = inputs()
    importance = model(ids, attention_mask=mask).layer_importance
    torch.testing.assert_close(importance, torch.tensor([expected, expected]))


def test_fixed_random_weighting_is_the_same_for_every_example_and_saved():
    model = HireRobertaForSequenceClassification(config(layer_weighting="random", layer_selection="last_k",
                                                        num_selected_layers=3)).eval()
    ids, mask = inputs()
    importance = model(ids, attention_mask=mask).layer_importance
    torch.testing.assert_close(importance[0], importance[1])
    assert importance[0, 0] == 0 and len(set(importance[0, 1:].tolist())) == 3
    assert "hire.extractor.fixed_scores" in model.state_dict()


@pytest.mark.parametrize("layers", [0, 1, 2, 3])
def test_fusion_gru_depth(layers):
    model = HireRobertaForSequenceClassification(config(fusion_layers=layers)).eval()
    ids, mask = inputs()
    out = model.hire(ids, attention_mask=mask).last_hidden_state
    if layers == 0:
        assert model.hire.fusion is None and out.shape[-1] == 4 * 16  # M itself
    else:
        assert model.hire.fusion.num_layers == layers and out.shape[-1] == 16


def test_invalid_ablation_settings_are_rejected():
    with pytest.raises(ValueError, match="fusion_layers"):
        config(fusion_layers=4)
    with pytest.raises(ValueError, match="dynamic"):
        config(layer_selection="last_k")


def test_predictions_do_not_depend_on_padding():
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config()).eval()
    ids, _ = inputs()
    alone = model(ids[:1, :6], attention_mask=torch.ones(1, 6, dtype=torch.long))
    for extra in (2, 9):
        padded = torch.cat([ids[:1, :6], torch.zeros(1, extra, dtype=torch.long)], 1)
        mask = torch.cat([torch.ones(1, 6), torch.zeros(1, extra)], 1).long()
        out = model(padded, attention_mask=mask)
        torch.testing.assert_close(out.logits, alone.logits, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.layer_importance, alone.layer_importance, rtol=1e-5, atol=1e-6)


def test_shared_summariser_runs_all_layers_in_one_call(monkeypatch):
    model = HireModel(config()).eval()
    calls = []
    original = MaskedBiGRU.forward

    def counting(self, x, lengths):
        calls.append((self is model.extractor.summarizer, x.shape[0]))
        return original(self, x, lengths)

    monkeypatch.setattr(MaskedBiGRU, "forward", counting)
    ids, mask = inputs()
    model(ids, attention_mask=mask)
    assert calls.count((True, 4 * 2)) == 1  # (l + 1) x batch sequences, one call


def test_masked_bigru_is_a_bidirectional_gru():
    torch.manual_seed(0)
    masked = MaskedBiGRU(5, 4, num_layers=2)
    reference = torch.nn.GRU(5, 4, num_layers=2, bidirectional=True, batch_first=True)
    with torch.no_grad():
        for layer in range(2):
            for suffix, gru in (("", masked.forward_layers[layer]), ("_reverse", masked.backward_layers[layer])):
                for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                    getattr(reference, f"{name}_l{layer}{suffix}").copy_(getattr(gru, f"{name}_l0"))
    x = torch.randn(3, 7, 5)
    lengths = torch.tensor([7, 4, 1])
    out, final = masked(x, lengths)
    for row, length in enumerate(lengths.tolist()):
        expected_out, expected_final = reference(x[row : row + 1, :length])
        torch.testing.assert_close(out[row, :length], expected_out[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(final[:, row], expected_final[:, 0], rtol=1e-5, atol=1e-6)


def test_save_load_round_trip_in_fresh_process(tmp_path):
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config(layer_weighting="random")).eval()
    model.save_pretrained(tmp_path)
    ids, mask = inputs()
    expected = model(ids, attention_mask=mask)
    out = run_isolated(f"""
        import json, torch
        from transformers import AutoModelForSequenceClassification, AutoModel
        model = AutoModelForSequenceClassification.from_pretrained({str(tmp_path)!r}, trust_remote_code=True).eval()
        bare = AutoModel.from_pretrained({str(tmp_path)!r}, trust_remote_code=True)
        ids, mask = torch.tensor({ids.tolist()}), torch.tensor({mask.tolist()})
        out = model(ids, attention_mask=mask)
        print(json.dumps({{"logits": out.logits.tolist(), "importance": out.layer_importance.tolist(),
                          "backbone": type(model.hire.backbone).__name__, "bare": type(bare).__name__}}))
    """)
    result = json.loads(out.strip().splitlines()[-1])
    torch.testing.assert_close(torch.tensor(result["logits"]), expected.logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(result["importance"]), expected.layer_importance, rtol=1e-5, atol=1e-6)
    assert result["backbone"] == "BertModel" and result["bare"] == "HireModel"


@pytest.mark.slow
def test_short_fine_tune_on_real_sentiment_reduces_loss():
    from encoder_zoo.glue.tasks import load_rotten_tomatoes

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    model = HireRobertaForSequenceClassification.from_backbone_pretrained(minilm_path(), num_labels=2).train()
    data = load_rotten_tomatoes()["train"].shuffle(seed=0).select(range(640))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses, importance_start = [], None
    for step in range(40):
        batch = data[step * 16 : (step + 1) * 16]
        encoded = tokenizer(batch["sentence"], padding=True, truncation=True, max_length=40, return_tensors="pt")
        out = model(**encoded, labels=torch.tensor(batch["label"]))
        importance_start = importance_start if importance_start is not None else out.layer_importance.detach()
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(out.loss.item())
    assert sum(losses[-8:]) / 8 < sum(losses[:8]) / 8 - 0.1, losses
    # The scores are trained: the importance distribution moves away from where it started.
    assert (out.layer_importance.detach().mean(0) - importance_start.mean(0)).abs().max() > 1e-3


def test_hire_fine_tunes_through_run_glue_and_plots_importance(tmp_path):
    from transformers import BertModel

    from encoder_zoo.glue.hire_importance import mean_importance, plot_importance
    from encoder_zoo.glue.init_hire import main as init_hire
    from encoder_zoo.glue.run_glue import main as run_glue

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    backbone = tmp_path / "backbone"
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(backbone)
    tokenizer.save_pretrained(backbone)
    init = init_hire(["--backbone", str(backbone), "--output_dir", str(tmp_path / "init"), "--gru_hidden_size", "8"])
    results = run_glue(["--model_name_or_path", init, "--trust_remote_code", "--ignore_mismatched_sizes",
                        "--task_name", "rotten_tomatoes", "--max_train_samples", "32", "--max_eval_samples", "16",
                        "--num_train_epochs", "1", "--per_device_train_batch_size", "8", "--max_seq_length", "32",
                        "--output_dir", str(tmp_path / "glue")])
    assert 0 <= results["tasks"]["rotten_tomatoes"]["median"]["accuracy"] <= 100
    fine_tuned = str(tmp_path / "glue" / "rotten_tomatoes" / "seed-42")
    scores = mean_importance(fine_tuned, "rotten_tomatoes", max_examples=16)
    assert scores.shape == (3,) and abs(scores.sum() - 1) < 1e-5
    png = plot_importance({"rotten_tomatoes": scores, "uniform": [1 / 3] * 3}, tmp_path / "importance.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_importance_heatmap_writes_cell_values_and_marks_the_uniform_level():
    from encoder_zoo.glue.hire_importance import importance_figure

    near_uniform = np.array([0.135, 0.14, 0.145, 0.15, 0.165, 0.125, 0.14])
    fig = importance_figure({"sst": near_uniform, "other": near_uniform[::-1]})
    heatmap, bar = fig.axes
    assert [t.get_text() for t in heatmap.texts][:7] == [f"{v:.3f}" for v in near_uniform] and len(heatmap.texts) == 14
    labels = [t.get_text() for t in bar.get_yticklabels()]
    assert "uniform 1/7 = 0.143" in labels
    # Near-uniform scores stay pale: the scale spans 0 (a layer ignored) to 2/7 (twice the uniform share).
    image = heatmap.images[0]
    assert (image.norm.vmin, image.norm.vcenter, image.norm.vmax) == pytest.approx((0, 1 / 7, 2 / 7))
    assert max(abs(image.norm(v) - 0.5) for v in near_uniform) < 0.1


def test_hire_over_a_zoo_encoder_reloads_without_this_repository(tmp_path):
    """A remote-code encoder (a tiny SpanBERT export): its code is saved next to HIRE's and loads with it."""
    from helpers import save_tiny_spanbert

    backbone = save_tiny_spanbert(tmp_path / "spanbert", "SpanBertModel")
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification.from_backbone_pretrained(backbone, num_labels=3,
                                                                          gru_hidden_size=8).eval()
    model.save_pretrained(tmp_path / "hire")
    files = {p.name for p in (tmp_path / "hire").iterdir()}
    assert {"configuration_spanbert.py", "modeling_spanbert.py", "hire_backbone.py", "modeling_hire.py"} <= files
    saved = json.loads((tmp_path / "hire" / "config.json").read_text())["backbone_config"]
    assert saved["model_type"] == "spanbert" and saved["auto_map"]["AutoModel"] == "modeling_spanbert.SpanBertModel"
    ids, mask = inputs()
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
    out = run_isolated(f"""
        import json, torch
        from transformers import AutoConfig, AutoModelForSequenceClassification
        path = {str(tmp_path / "hire")!r}
        model = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
        config = AutoConfig.from_pretrained(path, trust_remote_code=True)
        with torch.no_grad():
            logits = model(torch.tensor({ids.tolist()}), attention_mask=torch.tensor({mask.tolist()})).logits
        backbone = model.hire.backbone
        print(json.dumps({{"logits": logits.tolist(), "backbone": type(backbone).__name__,
                          "module": type(backbone).__module__, "config": type(config.backbone_config).__name__}}))
    """)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["backbone"] == "SpanBertModel" and result["config"] == "SpanBertConfig"
    assert result["module"].startswith("transformers_modules") and result["module"].endswith("modeling_spanbert")
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, rtol=1e-5, atol=1e-6)


def test_gru_dropout_sits_between_stacked_layers_in_training_only():
    assert HireConfig(backbone_config=BACKBONE).gru_dropout == 0.1  # appendix A.2
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config(gru_dropout=0.5))
    assert model.hire.extractor.summarizer.dropout.p == model.hire.fusion.dropout.p == 0.5
    seen = {}
    for name, gru in (("extractor", model.hire.extractor.summarizer), ("fusion", model.hire.fusion)):
        for layer in (0, 1):
            gru.forward_layers[layer].register_forward_pre_hook(
                lambda module, args, key=(name, layer): seen.__setitem__(key, args[0].detach().clone()))
    ids, mask = inputs()
    model.eval()
    with torch.no_grad():
        reference = model(ids, attention_mask=mask).logits
        clean = dict(seen)
        torch.testing.assert_close(model(ids, attention_mask=mask).logits, reference)  # eval: no dropout
    model.train()
    with torch.no_grad():
        dropped = model(ids, attention_mask=mask).logits
    assert (dropped - reference).abs().max() > 1e-4
    # The extractor's layer 0 reads the hidden states untouched; its layer 1 reads layer 0's outputs with half of them
    # zeroed and the rest doubled. (The fusion GRU's input moved with the dropped-out importance scores.)
    torch.testing.assert_close(seen[("extractor", 0)], clean[("extractor", 0)])
    kept = seen[("extractor", 1)] != 0
    torch.testing.assert_close(seen[("extractor", 1)][kept], 2 * clean[("extractor", 1)][kept])
    for name in ("extractor", "fusion"):
        assert (seen[(name, 0)] != 0).all() and 0.35 < (seen[(name, 1)] != 0).float().mean() < 0.65


@pytest.mark.parametrize("weighting", ["mean", "random"])
def test_fixed_weightings_build_no_summariser_and_train_every_parameter(weighting):
    fixed = HireRobertaForSequenceClassification(config(layer_weighting=weighting))
    names = [name for name, _ in fixed.named_parameters()]
    assert fixed.hire.extractor.summarizer is None and fixed.hire.extractor.importance is None
    assert not any("summarizer" in name or "importance" in name for name in names)
    fixed(*inputs(), labels=torch.tensor([0, 1])).loss.backward()
    assert [n for n, p in fixed.named_parameters() if p.grad is None] == []  # DDP without find_unused_parameters
    # At RoBERTa-large size the dead summariser and scorer were 31.5M parameters.
    from transformers import RobertaConfig

    large = RobertaConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    with torch.device("meta"):
        counts = {w: sum(p.numel()
                         for p in HireModel(HireConfig(backbone_config=large, layer_weighting=w)).parameters())
                  for w in ("dynamic", weighting)}
    def gru_layer(inputs, d=1024):  # both directions: W_ih, W_hh, b_ih, b_hh of three gates
        return 2 * (3 * d * (inputs + d) + 6 * d)

    assert counts["dynamic"] - counts[weighting] == gru_layer(1024) + gru_layer(2048) + 4 * 1024 + 1 == 31_485_953


@pytest.mark.parametrize("use_fusion", [True, False])
def test_left_padding_gives_the_right_padding_prediction(use_fusion):
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config(use_fusion=use_fusion)).eval()
    ids, right_mask = inputs(pad_row1=4)
    length = int(right_mask[1].sum())
    left_ids, left_mask = ids.clone(), right_mask.clone()
    left_ids[1] = torch.cat([ids[1, length:], ids[1, :length]])  # the same 6 tokens, now after the padding
    left_mask[1] = torch.cat([right_mask[1, length:], right_mask[1, :length]])
    with torch.no_grad():
        right = model(ids, attention_mask=right_mask, output_hidden_states=True)
        left = model(left_ids, attention_mask=left_mask, output_hidden_states=True)
        right_states = model.hire(ids, attention_mask=right_mask).last_hidden_state
        left_states = model.hire(left_ids, attention_mask=left_mask).last_hidden_state
    torch.testing.assert_close(left.logits, right.logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(left.layer_importance, right.layer_importance, rtol=1e-5, atol=1e-6)
    # Outputs come back in the caller's layout: row 1's tokens sit at the end of the left-padded row.
    torch.testing.assert_close(left_states[1, -length:], right_states[1, :length], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(left.hidden_states[-1][1, -length:], right.hidden_states[-1][1, :length])


def test_config_exposes_the_encoder_as_its_text_config(tmp_path):
    hire = config()
    text = hire.get_text_config()
    assert text is hire.backbone_config and text.vocab_size == hire.backbone_config.vocab_size
    assert hire.get_text_config(decoder=True) is text and text.num_hidden_layers + 1 == hire.num_layers
    model = HireRobertaForSequenceClassification(hire)
    model.resize_token_embeddings(text.vocab_size + 5)
    assert model.config.get_text_config().vocab_size == model.get_input_embeddings().num_embeddings == text.vocab_size
    hire.save_pretrained(tmp_path)
    reloaded = HireConfig.from_pretrained(tmp_path)
    assert reloaded.get_text_config().vocab_size == text.vocab_size and reloaded.hidden_size == hire.hidden_size


def test_compiles_with_fullgraph():
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config()).eval()
    ids, mask = inputs()
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        # PyTorch's dynamo wraps GRUs only when asked (allow_rnn); HIRE itself has no data-dependent branch to break on.
        with torch._dynamo.config.patch(allow_rnn=True):
            compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
            logits = compiled(ids, attention_mask=mask).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)


def test_saved_config_has_no_local_path_and_the_encoders_special_tokens(tmp_path, caplog):
    from transformers.trainer_utils import align_special_tokens

    from encoder_zoo.glue.init_hire import main as init_hire

    init = init_hire(["--output_dir", str(tmp_path / "init"), "--gru_hidden_size", "8"])
    text = (tmp_path / "init" / "config.json").read_text()
    saved = json.loads(text)
    # No path: none at the top, an empty one in the encoder's config (as any sub-config's to_dict has it).
    assert "_name_or_path" not in saved and saved["backbone_config"]["_name_or_path"] == ""
    assert minilm_path() not in text and str(tmp_path) not in text
    # The folder is meant for the Hub: a generated card, and no local path in any file.
    card = ModelCard.load(tmp_path / "init" / "README.md")
    assert card.data.library_name == "transformers" and "hire" in card.data.tags and "custom_code" in card.data.tags
    for needle in ("HireRobertaForSequenceClassification", "layer weighting dynamic", "2-layer bidirectional GRU",
                   "@article{yang2019deepening", 'from_pretrained("<your-username>/init"',
                   "LoraConfig(target_modules=['query', 'value']"):
        assert needle in card.text, needle
    assert local_paths_in(tmp_path / "init", tmp_path) == []
    model = HireRobertaForSequenceClassification.from_pretrained(init)
    tokenizer = AutoTokenizer.from_pretrained(init)
    assert model.config.pad_token_id == tokenizer.pad_token_id == model.config.backbone_config.pad_token_id
    with caplog.at_level("WARNING"):
        align_special_tokens(model, tokenizer)
    assert "new PAD/BOS/EOS" not in caplog.text


def test_resize_token_embeddings_resizes_the_encoder_and_reloads(tmp_path):
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config()).eval()
    model.resize_token_embeddings(128)
    assert model.get_input_embeddings().num_embeddings == 128 and model.config.backbone_config.vocab_size == 128
    new_token = torch.tensor([[3, 125, 126, 7]])
    with torch.no_grad():
        expected = model(new_token).logits
    model.save_pretrained(tmp_path)
    reloaded = HireRobertaForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(new_token).logits, expected)


def test_peft_lora_for_sequence_classification_trains_the_real_head():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config())
    lora = peft.get_peft_model(model, peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS,
                                                      target_modules=["query", "value"]))
    head = lora.base_model.model.classifier
    assert isinstance(head, peft.utils.other.ModulesToSaveWrapper)
    assert not isinstance(lora.base_model.model.hire.extractor.importance, peft.utils.other.ModulesToSaveWrapper)
    before = {n: p.detach().clone() for n, p in lora.named_parameters() if "classifier" in n and p.requires_grad}
    assert any("out_proj" in n for n in before) and any("dense" in n for n in before)
    optimizer = torch.optim.SGD([p for p in lora.parameters() if p.requires_grad], lr=0.5)
    lora(*inputs(), labels=torch.tensor([0, 2])).loss.backward()
    optimizer.step()
    after = dict(lora.named_parameters())
    assert all((after[n] - value).abs().max() > 0 for n, value in before.items())


def test_checkpoints_from_before_the_head_moved_load_with_a_key_mapping(tmp_path):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config()).eval()
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    legacy = {k.removeprefix("classifier.").replace("extractor.importance", "extractor.score"): v
              for k, v in state.items()}
    save_file(legacy, tmp_path / "model.safetensors", metadata={"format": "pt"})
    reloaded = HireRobertaForSequenceClassification.from_pretrained(tmp_path, key_mapping={
        "^dense": "classifier.dense", "^out_proj": "classifier.out_proj",
        "extractor.score": "extractor.importance"}).eval()
    ids, mask = inputs()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)


def test_hire_importance_runs_checkpoint_code_only_when_asked(monkeypatch, tmp_path):
    """`glue/hire_importance.py` passes `trust_remote_code=True` only with `--trust_remote_code`, as the other
    scripts."""
    from encoder_zoo.glue import hire_importance
    from encoder_zoo.training.run import loading

    asked = []

    def record(auto_class, name, flag="--model_name_or_path", **kwargs):
        asked.append(kwargs.get("trust_remote_code"))
        raise OSError("stop here")

    monkeypatch.setattr(loading, "load_pretrained", record)
    for flags in ([], ["--trust_remote_code"]):
        with pytest.raises(OSError, match="stop here"):
            hire_importance.main(["--run", f"rotten_tomatoes={tmp_path}", "--output", str(tmp_path / "i.png"), *flags])
    assert asked == [False, True]


def test_hire_over_the_two_tower_cloze_encoder_reads_its_concatenated_towers():
    """The cloze encoder's hidden states are both towers' states side by side (2d wide): HIRE's extractor, fusion and
    head take that width (the zoo builds HIRE over whichever encoder ranks best)."""
    from encoder_zoo.models.cloze.configuration_cloze import TwoTowerClozeConfig

    cloze = TwoTowerClozeConfig(vocab_size=120, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                eos_token_id=2, sep_token_id=3)
    config = HireConfig(backbone_config=cloze, num_labels=3, gru_hidden_size=8, classifier_dropout=0.0)
    assert config.model_dim == 32 and config.num_layers == 3
    model = HireRobertaForSequenceClassification(config).eval()
    input_ids = torch.randint(4, 120, (2, 7))
    attention_mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    output = model(input_ids=input_ids, attention_mask=attention_mask, labels=torch.tensor([0, 2]))
    assert output.logits.shape == (2, 3) and torch.isfinite(output.loss)
    output.loss.backward()
    trained = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert any("backbone" in name for name in trained) and any("extractor" in name for name in trained), trained
