"""The GPU levers, proven on CPU: the fixed-size target buffer (`--target_buffer`: a train step without a
data-dependent shape, so without a host sync or a graph break) and the unpadded encoder (`--unpad`: real tokens
only, attention per sequence), each against today's padded gather: the same losses and gradients."""

import pytest
import torch
import torch._dynamo
from test_packing import NO_DROPOUT, losses_and_gradients, spanbert, varied_batch
from transformers import AutoTokenizer

from encoder_zoo.models.spanbert.configuration_spanbert import SpanBertConfig
from encoder_zoo.models.spanbert.modeling_spanbert import SpanBertForPreTraining
from encoder_zoo.models.teams import modeling_teams
from encoder_zoo.models.teams.configuration_teams import TeamsConfig
from encoder_zoo.training.data.blocks import add_example_index, pack_blocks
from encoder_zoo.training.data.corpus import load_corpus
from encoder_zoo.training.data.packing import check_unpad, pack_batch, with_target_buffer
from encoder_zoo.training.data.resources import minilm_path
from encoder_zoo.training.masking.spans import SpanMaskingCollator, max_targets


def build_spanbert(tokenizer, **overrides):
    torch.manual_seed(0)
    return SpanBertForPreTraining(SpanBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, **NO_DROPOUT, **overrides))


def build_teams(tokenizer, **overrides):
    torch.manual_seed(0)
    return modeling_teams.TeamsForPreTraining(TeamsConfig(
        vocab_size=len(tokenizer), embedding_size=16, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, **NO_DROPOUT, **overrides))


SUBWORD = dict(scheme="subword", span_boundary_targets=False)
RECIPES = {  # name: (model builder(tokenizer, **config), collator options), tiny forms of the recipes
    "spanbert": (build_spanbert, dict(scheme="span", span_boundary_targets=True)),
    "bert": (lambda tok, **kw: build_spanbert(tok, use_span_boundary_objective=False, **kw), SUBWORD),
    "teams": (build_teams, SUBWORD),
    "electra": (lambda tok, **kw: build_teams(  # ELECTRA's narrower generator has a config of its own
        tok, pretraining_tasks="rtd", task_head_type="ffn", layer_tying="none", generator_hidden_size=16,
        generator_num_attention_heads=1, generator_intermediate_size=32, **kw), SUBWORD),
}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def blocks(tokenizer):
    """Real Wikipedia blocks of 64 word pieces at most, of many lengths (tests/test_packing.py's)."""
    return add_example_index(pack_blocks(load_corpus(max_documents=40), tokenizer, max_seq_length=64))


def buffered_batch(tokenizer, blocks, name):
    """TEAMS and ELECTRA sample for real, from the collator's draws (`sampler_uniforms`, as pretrain.py's batches
    carry them): keyed by example and position, they give each target the same draws in every layout."""
    draws = dict(sampler_draws=6) if name in ("teams", "electra") else {}
    collator = SpanMaskingCollator(tokenizer, random_token_distribution="uniform", seed=3, target_buffer=True,
                                   **RECIPES[name][1], **draws)
    batch = collator(varied_batch(blocks))
    return batch, {k: v for k, v in batch.items() if k != "target_positions"}


def assert_same(result, reference, loss_rtol, gradient_atol):
    (losses, gradients), (reference_losses, reference_gradients) = result, reference
    assert losses.keys() == reference_losses.keys() and gradients.keys() == reference_gradients.keys()
    for name in reference_losses:
        torch.testing.assert_close(losses[name], reference_losses[name], rtol=loss_rtol, atol=0, msg=name)
    for name in reference_gradients:
        torch.testing.assert_close(gradients[name], reference_gradients[name], rtol=0, atol=gradient_atol, msg=name)


def test_target_buffer_lists_each_rows_targets_in_a_fixed_size(tokenizer, blocks):
    batch, _ = buffered_batch(tokenizer, blocks, "spanbert")
    labels, slots = batch["labels"], batch["target_positions"]
    assert slots.shape == (labels.shape[0], max_targets(0.15, labels.shape[1]))  # the shape's, not the masks'
    for row in range(labels.shape[0]):
        masked = (labels[row] != -100).nonzero().squeeze(1)
        assert slots[row, : len(masked)].tolist() == masked.tolist()
        assert (slots[row, len(masked):] == -1).all()
    assert (slots == -1).any()  # short rows leave slots empty
    packed = pack_batch(batch)  # packing shifts the buffer's positions with their rows and keeps its size
    assert packed["target_positions"].shape == (1, slots.numel())
    assert torch.equal(packed["labels"][0][packed["target_positions"][0][packed["target_positions"][0] >= 0]],
                       labels[labels != -100])


@pytest.mark.parametrize("name", list(RECIPES))
def test_target_buffer_gives_the_gathered_losses_and_gradients(tokenizer, blocks, name):
    buffered, plain = buffered_batch(tokenizer, blocks, name)
    model = RECIPES[name][0](tokenizer)
    reference = losses_and_gradients(model, plain)
    assert_same(losses_and_gradients(model, buffered), reference, loss_rtol=1e-6, gradient_atol=1e-6)
    out = model(**buffered)
    assert out.mlm_logits.shape[0] == buffered["target_positions"].numel()  # one row per slot


@pytest.mark.parametrize("layout", ["padded", "packed", "buffered"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_unpad_gives_the_padded_losses_and_gradients(tokenizer, blocks, name, layout, monkeypatch):
    buffered, plain = buffered_batch(tokenizer, blocks, name)
    reference = losses_and_gradients(RECIPES[name][0](tokenizer), plain)
    model = RECIPES[name][0](tokenizer, unpad=True)  # as pretrain.py --unpad builds it: SDPA becomes sdpa_varlen
    assert {m.config._attn_implementation for m in model.modules() if hasattr(m, "config")} == {"sdpa_varlen"}
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, *args, **kwargs: calls.append(q.shape) or sdpa(q, *args, **kwargs))
    batch = {"padded": plain, "packed": pack_batch(plain), "buffered": buffered}[layout]
    assert_same(losses_and_gradients(model, batch), reference, loss_rtol=1e-5, gradient_atol=1e-5)
    lengths = plain["attention_mask"].sum(1).tolist()
    assert [shape[-2] for shape in calls[: len(lengths)]] == lengths  # one attention call per sequence, unpadded


def test_unpad_puts_the_padding_back_in_teams_per_token_outputs(tokenizer, blocks):
    _, plain = buffered_batch(tokenizer, blocks, "teams")
    padded = build_teams(tokenizer)(**plain)
    unpadded = build_teams(tokenizer, unpad=True)(**plain)
    real = plain["attention_mask"].bool()
    for name in ("rtd_logits", "rtd_labels", "corrupted_input_ids"):
        assert unpadded[name].shape == padded[name].shape
        torch.testing.assert_close(unpadded[name][real], padded[name][real], atol=1e-5, rtol=0)


def test_unpad_keeps_the_attention_dropout(tokenizer, blocks):
    """The unpadded attention gets the layers' dropout rate in training, as SDPA does padded: with attention dropout
    alone, two training draws differ and an evaluation equals the padded model's."""
    _, plain = buffered_batch(tokenizer, blocks, "bert")
    padded = RECIPES["bert"][0](tokenizer).eval()(**plain).loss
    model = RECIPES["bert"][0](tokenizer, unpad=True).eval()
    for layer in model.spanbert.encoder.layer:
        layer.attention.self.dropout.p = 0.3
    torch.testing.assert_close(model(**plain).loss, padded, rtol=1e-5, atol=0)
    model.train()
    draws = [model(**plain).loss.item() for seed in (0, 1) if torch.manual_seed(seed)]
    assert draws[0] != draws[1] and padded.item() not in draws  # (a random model's loss moves little: exact compare)


@pytest.mark.parametrize("name", ["spanbert", "teams"])
def test_a_step_on_the_target_buffer_has_no_graph_break(tokenizer, blocks, name):
    """No data-dependent shape, so nothing to sync on: dynamo, which breaks the graph at `.item()`, `.nonzero()`,
    `.tolist()` and boolean-mask indexing (the CPU stand-in for CUDA's sync debug mode), traces the whole loss, padded
    and packed, as one graph. The gathered step breaks at its index sets, which shows the check can fail."""
    buffered, plain = buffered_batch(tokenizer, blocks, name)
    model = RECIPES[name][0](tokenizer)
    gathered = [(plain, False)] if name == "spanbert" else []  # (tests/test_compile.py shows TEAMS's breaks)
    for batch, one_graph in [(buffered, True), (pack_batch(buffered), True), *gathered]:
        torch._dynamo.reset()
        explained = torch._dynamo.explain(lambda **kw: model(**kw).loss)(**batch)
        assert (explained.graph_break_count == 0) == one_graph, explained.break_reasons


def test_unpad_and_target_buffer_refuse_what_they_cannot_run(tokenizer, blocks):
    from encoder_zoo import models

    with pytest.raises(ValueError, match="--unpad: TwoTowerCloze runs two causal towers.*without --unpad"):
        check_unpad(models.get_class("cloze", "AutoConfig"), models.get_class("cloze", "AutoModelForPreTraining"), {})
    with pytest.raises(ValueError, match="--unpad: next sentence prediction"):
        check_unpad(models.get_class("spanbert", "AutoConfig"),
                    models.get_class("spanbert", "AutoModelForPreTraining"), {"use_next_sentence_prediction": True})
    with pytest.raises(ValueError, match="--target_buffer: ClozeCollator makes no masked targets"):
        from encoder_zoo.training.recipes.cloze import ClozeCollator

        with_target_buffer(ClozeCollator(tokenizer))
    _, plain = buffered_batch(tokenizer, blocks, "spanbert")
    model = spanbert(tokenizer, attn="eager")
    model.config.unpad = True
    with pytest.raises(ValueError, match="config.unpad .*'eager' attention cannot tell apart.*sdpa_varlen"):
        model(**plain)
    assert spanbert(tokenizer).config._attn_implementation == "sdpa"  # unchanged without unpad


def test_the_flash_varlen_call_fits_the_kernels_signature_forward_and_backward():
    """The GPU branch of `sdpa_varlen`, on meta tensors (the kernel's shape functions): the call PyTorch's varlen flash
    kernel takes, with dropout, and the gradient autograd derives for it. Its numbers wait for a GPU (bench/gpu_run.sh
    compares them with the padded SDPA model)."""
    from encoder_zoo.models.spanbert.modeling_spanbert import flash_varlen_attention

    tokens, heads, head_dim = 100, 4, 64
    query, key, value = (torch.empty(tokens, heads, head_dim, device="meta", dtype=torch.bfloat16, requires_grad=True)
                         for _ in range(3))
    bounds = torch.tensor([0, 30, 100], dtype=torch.int32, device="meta")
    output = flash_varlen_attention(query, key, value, bounds, bounds, 70, 70, 0.1, head_dim**-0.5)
    assert output.shape == (tokens, heads, head_dim) and output.dtype == torch.bfloat16
    output.sum().backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in (query, key, value))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["spanbert", "teams"])
def test_a_run_with_the_levers_on_resumes_bitwise(model, tmp_path):
    """`--unpad --target_buffer`: a run killed after its first checkpoint and resumed exports the uninterrupted
    run's bytes (tests/test_resume_exact.py's promise, levers on)."""
    import signal

    from helpers import pretrain
    from test_resume import start, wait_for
    from test_resume_exact import SMALL, STEPS

    def run_args(out):
        return [*SMALL, "--model", model, "--unpad", "--target_buffer", "--output_dir", str(out)]

    pretrain(*run_args(tmp_path / "uninterrupted"))
    out = tmp_path / "resumed"
    process = start(*run_args(out))
    wait_for(out / "checkpoint-3", process, timeout=300)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert not (out / f"checkpoint-{STEPS}").exists()
    pretrain(*run_args(out), "--resume_from_checkpoint", "true")
    assert ((out / "export" / "model.safetensors").read_bytes()
            == (tmp_path / "uninterrupted" / "export" / "model.safetensors").read_bytes())


@pytest.mark.slow
def test_the_device_script_runs_end_to_end_at_smoke(tmp_path):
    """bench/gpu_run.sh (`make gpu-run`) at SMOKE=1, narrowed to the levers' checks and one pair with levers and one
    without: every step runs, the lever checks pass, and the benchmarks write their cells."""
    import json
    import subprocess
    import sys

    from helpers import REPO, pretrain_env

    env = {**pretrain_env(), "SMOKE": "1", "OUT": str(tmp_path), "PYTHON": sys.executable, "CHECKS": "levers",
           "PAIRS": "bert cloze"}
    result = subprocess.run(["bash", "bench/gpu_run.sh"], env=env, cwd=REPO, capture_output=True, text=True,
                            timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checks = {c["name"]: c["status"] for c in json.loads((tmp_path / "gpu_check_cpu-smoke.json").read_text())["checks"]}
    assert checks == {name: "pass" for name in ("levers:spanbert", "levers:bert", "levers:teams", "levers:electra",
                                                "levers:pretrain", "levers:compile")}
    bench = json.loads((tmp_path / "bench_levers.json").read_text())
    assert bench["bert@32"]["variants"] == ["base", "buffer", "unpad+buffer"]
    assert bench["bert@32"]["ours[unpad+buffer]_attention"] == "sdpa_varlen"
    assert all(bench["bert@32"][f"{side}_tokens_per_s"] > 0 for side in ("ours", "ours[buffer]", "reference"))
    assert "variants" not in bench["cloze@32"] and bench["cloze@32"]["ours_tokens_per_s"] > 0  # no levers for cloze
    graphs = json.loads((tmp_path / "bench_cudagraphs.json").read_text())["bert@32"]
    assert graphs["ours[buffer+cudagraphs]_tokens_per_s"] > 0
    assert "torch" in (tmp_path / "environment.txt").read_text()
