"""HIRE on tiny configs: shapes, the paper's equations, each ablation, padding invariance, save/load, real fine-tune."""

import json

import pytest
import torch
from helpers import run_isolated
from transformers import AutoTokenizer, BertConfig

import models  # noqa: F401
from models.hire.configuration_hire import HireConfig
from models.hire.modeling_hire import HireModel, HireRobertaForSequenceClassification, MaskedBiGRU
from training.resources import minilm_path

BACKBONE = BertConfig(vocab_size=120, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).to_dict()


def config(**overrides):
    return HireConfig(**{"backbone_config": BACKBONE, "num_labels": 3, "gru_hidden_size": 8, "classifier_dropout": 0.0, **overrides})


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
            alphas.append(torch.relu(extractor.score(u)))
        s = torch.softmax(torch.cat(alphas), 0)
        torch.testing.assert_close(out.layer_importance[row], s, rtol=1e-5, atol=1e-6)
        A = (s[:, None, None] * stacked[:, row, :length]).sum(0)
        R = states[-1][row, :length]
        M = torch.cat([R, A, R + A, R * A], -1)
        F, _ = model.hire.fusion(M[None], torch.tensor([length]))
        q = model.out_proj(torch.tanh(model.dense(F[0, 0])))
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
    torch.testing.assert_close(out.logits[0], model.out_proj(torch.tanh(model.dense(F[0, 0]))), rtol=1e-4, atol=1e-5)


def test_without_fusion_A_goes_to_the_output_layer():
    torch.manual_seed(0)
    model = HireRobertaForSequenceClassification(config(use_fusion=False)).eval()
    assert model.hire.fusion is None and model.dense.in_features == 16  # d, not 2d
    ids, mask = inputs()
    out = model(ids, attention_mask=mask)
    stacked = torch.stack(backbone_states(model, ids, mask))
    A = torch.einsum("bl,lbtd->btd", out.layer_importance, stacked)
    torch.testing.assert_close(model.hire(ids, attention_mask=mask).last_hidden_state, A)


@pytest.mark.parametrize("selection, expected", [("all", [0.25] * 4), ("first_k", [0.5, 0.5, 0, 0]), ("last_k", [0, 0, 0.5, 0.5])])
def test_fixed_mean_weightings(selection, expected):
    model = HireRobertaForSequenceClassification(config(layer_weighting="mean", layer_selection=selection, num_selected_layers=2)).eval()
    ids, mask = inputs()
    importance = model(ids, attention_mask=mask).layer_importance
    torch.testing.assert_close(importance, torch.tensor([expected, expected]))


def test_fixed_random_weighting_is_the_same_for_every_example_and_saved():
    model = HireRobertaForSequenceClassification(config(layer_weighting="random", layer_selection="last_k", num_selected_layers=3)).eval()
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
    from glue.tasks import load_rotten_tomatoes

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

    from glue.hire_importance import mean_importance, plot_importance
    from glue.init_hire import main as init_hire
    from glue.run_glue import main as run_glue

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
    assert 0 <= results["tasks"]["rotten_tomatoes"]["median"]["accuracy"] <= 1
    fine_tuned = str(tmp_path / "glue" / "rotten_tomatoes" / "seed-42")
    scores = mean_importance(fine_tuned, "rotten_tomatoes", max_examples=16)
    assert scores.shape == (3,) and abs(scores.sum() - 1) < 1e-5
    png = plot_importance({"rotten_tomatoes": scores, "uniform": [1 / 3] * 3}, tmp_path / "importance.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
