"""bench/bench_gpu.py: its model-FLOP count (the numerator of MFU) equals what torch's FlopCounterMode sees a train
step execute, for every model it times; and its CPU smoke mode writes a result file."""

import json
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_gpu  # noqa: E402

KINDS = [kind for pair in bench_gpu.PAIRS.values() for kind in pair[:2]]


@pytest.fixture(scope="module")
def full_rows():
    """Unpadded 32-token rows per masking scheme: on them the executed FLOPs are exactly the model FLOPs."""
    rows = {}
    for scheme in ("span", "subword"):
        batch = bench_gpu.batches(32, 16, 1, scheme, documents=200)[0]
        full = batch["attention_mask"].bool().all(1)
        assert full.sum() >= 4
        rows[scheme] = {key: value[full][:4] for key, value in batch.items()}
    return rows


def eager_attention(model):
    """Eager attention everywhere: its matmuls are ordinary ops that FlopCounterMode counts."""
    for module in model.modules():
        if hasattr(module, "config") and hasattr(module.config, "_attn_implementation"):
            module.config._attn_implementation = "eager"


@pytest.mark.parametrize("kind", KINDS)
def test_model_flop_count_matches_the_executed_matmuls(kind, full_rows):
    scheme = next(pair[2] for pair in bench_gpu.PAIRS.values() if kind in pair[:2])
    model = bench_gpu.build(kind, "tiny", "eager")
    eager_attention(model)
    inputs = bench_gpu.step_inputs(kind, full_rows[scheme], packing=False)
    counter = FlopCounterMode(display=False)
    torch.manual_seed(0)
    with counter:
        output = model(**inputs)
        (output if torch.is_tensor(output) else output.loss).backward()
    counted = bench_gpu.train_step_flops(kind, model, inputs)
    assert counted == counter.get_total_flops()


def test_packing_counts_each_sequence_over_its_own_length(full_rows):
    model = bench_gpu.build("bert", "tiny", "sdpa")
    padded = bench_gpu.step_inputs("bert", full_rows["subword"], packing=False)
    packed = bench_gpu.step_inputs("bert", full_rows["subword"], packing=True)
    assert bench_gpu.train_step_flops("bert", model, packed) == bench_gpu.train_step_flops("bert", model, padded)


def test_smoke_mode_runs_on_cpu_and_writes_the_rows(tmp_path):
    record = bench_gpu.main(["--smoke", "--pairs", "bert", "--output", str(tmp_path / "gpu.json")])
    row = json.loads((tmp_path / "gpu.json").read_text())["bert@32"]
    assert record["bert@32"] == row and record["machine"]["cpu"]
    assert row["ours_model"] == row["reference_model"].replace("BertForMaskedLM", "SpanBertForPreTraining")
    assert row["ours_packed"] and row["ours_tokens_per_s"] > 0 and row["reference_tokens_per_s"] > 0
    assert row["speedup"] == round(row["ours_tokens_per_s"] / row["reference_tokens_per_s"], 2)


def test_profile_shares_add_up_and_a_time_limit_keeps_what_ran(tmp_path):
    output = tmp_path / "gpu.json"
    record = bench_gpu.main(["--smoke", "--pairs", "bert", "spanbert", "--profile", "--time_limit", "0.5",
                             "--output", str(output)])
    written = json.loads(output.read_text())
    assert written == json.loads(json.dumps(record))
    assert "bert@32" in written and "spanbert@32" not in written, "the limit passed during the first cell"
    assert written["stopped_early"].endswith("before spanbert@32")
    profile = written["bert@32"]["ours_profile"]
    assert abs(sum(profile["kinds"].values()) - 1) < 0.01
    assert profile["top"] and all(0 < row["share"] <= 1 for row in profile["top"])
    assert bench_gpu.kernel_kind("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "matmul"
    assert bench_gpu.kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_bprop") == "attention"
    assert bench_gpu.kernel_kind("triton_per_fused_add_native_dropout_native_layer_norm_9") == "fused (triton)"


def test_regional_compilation_compiles_each_encoder_layer_and_leaves_the_heads_eager():
    """--compile_scope layers: every block of a stack of identical blocks is compiled in place (generator and
    discriminator alike), nothing else, so compiling costs about one block's time."""
    for kind in ("bert", "teams"):
        model = bench_gpu.build(kind, "tiny", "sdpa")
        assert bench_gpu.compile_layers(model) is model
        compiled = {name for name, module in model.named_modules() if module._compiled_call_impl is not None}
        layers = {name for name, module in model.named_modules()
                  if name.rsplit(".", 1)[-1].isdigit() and ".layer." in f".{name}"}
        assert compiled and compiled == layers, (kind, compiled ^ layers)


def test_each_compiled_cell_starts_from_fresh_dynamo_caches(monkeypatch):
    """Every model's layers share one code object, so cells compiled in one process would pile their graphs on it
    until dynamo's recompile limit sends the later cells' layers to eager: each compiled cell resets dynamo first."""
    events = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: events.append("reset"))
    monkeypatch.setattr(bench_gpu, "compile_layers", lambda model: events.append("compile") or model)
    options = bench_gpu.parse(["--smoke", "--compile", "ours", "--compile_scope", "layers", "--steps", "1",
                               "--warmup", "0"])
    data = bench_gpu.batches(32, 2, 1, "subword", documents=50)
    for kind in ("bert", "hf_bert_mlm", "teams"):
        bench_gpu.measure(kind, options, data, torch.device("cpu"))
    assert events == ["reset", "compile", "reset", "compile"], events  # the reference (not compiled) untouched


@pytest.mark.slow
def test_regional_compilation_gives_the_eager_loss_and_gradients():
    torch.manual_seed(0)
    batch = bench_gpu.step_inputs("bert", bench_gpu.batches(32, 4, 1, "subword", documents=200)[0], False)
    eager = bench_gpu.build("bert", "tiny", "sdpa").eval()
    regional = bench_gpu.build("bert", "tiny", "sdpa").eval()
    regional.load_state_dict(eager.state_dict())
    bench_gpu.compile_layers(regional)
    losses = [model(**batch).loss for model in (eager, regional)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-5)
    for (name, a), b in zip(eager.named_parameters(), regional.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_a_failing_lever_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    """--keep_going (bench/gpu_run.sh): a variant that fails on the device records its error; the others still run."""
    measure = bench_gpu.measure

    def failing(kind, options, data, device, variant="base"):
        if variant == "buffer":
            raise RuntimeError("no kernel image is available")
        return measure(kind, options, data, device, variant)

    monkeypatch.setattr(bench_gpu, "measure", failing)
    record = bench_gpu.main(["--smoke", "--pairs", "bert", "--variants", "buffer", "unpad", "--keep_going",
                             "--output", str(tmp_path / "gpu.json")])
    row = record["bert@32"]
    assert row["ours[buffer]_error"] == "RuntimeError: no kernel image is available"
    assert row["ours[unpad]_tokens_per_s"] > 0 and row["ours[unpad]_attention"] == "sdpa_varlen"
    assert "| bert | 32 | buffer | failed: RuntimeError" in bench_gpu.markdown({"bert@32": row})
