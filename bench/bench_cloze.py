"""Train-step throughput of the two-tower cloze model vs transformers' `BertForMaskedLM` with the same depth and
width per tower, side by side in one run on the same full-length blocks of real Wikipedia text. A train step is
forward + backward + AdamW update.

The cloze model runs two towers plus a combination layer and predicts EVERY token; BERT predicts the 15% it masks.
So besides input tokens/s the result reports predicted tokens/s and time per predicted token.

    python bench/bench_cloze.py [--size small] [--seq_length 128] [--batch_size 32] [--steps 8]
    python bench/bench_cloze.py --size base --bf16      # on a GPU
"""

from __future__ import annotations

import torch
from bench_spanbert import PEAK_FLOPS, VOCAB, batches
from common import device_and_dtype, timed_train_steps, train_step_parser, write_result

KINDS = ("cloze", "hf_bert_mlm")


def build(kind, size):
    from transformers import BertConfig, BertForMaskedLM

    from encoder_zoo import models  # noqa: F401
    from encoder_zoo.models.cloze.configuration_cloze import TwoTowerClozeConfig
    from encoder_zoo.models.cloze.modeling_cloze import TwoTowerCloze
    from encoder_zoo.training.recipes.cloze import CLOZE_SIZES

    dims = CLOZE_SIZES[size]
    torch.manual_seed(0)
    if kind == "cloze":
        return TwoTowerCloze(TwoTowerClozeConfig(vocab_size=VOCAB, max_position_embeddings=512, **dims))
    return BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=dims["hidden_size"],
                                      num_hidden_layers=dims["num_hidden_layers"],
                                      num_attention_heads=dims["num_attention_heads"],
                                      intermediate_size=dims["intermediate_size"]))


def step_inputs(kind, batch):
    if kind == "hf_bert_mlm":
        return {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}
    # The cloze model reads the unmasked text and predicts every real token but the leading boundary marker.
    original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
    labels = original.masked_fill(batch["attention_mask"] == 0, -100)
    labels[:, 0] = -100
    return {"input_ids": original, "attention_mask": batch["attention_mask"], "labels": labels}


def measure(size, data, steps, device, dtype):
    models_ = {kind: build(kind, size).to(device).train() for kind in KINDS}
    stats = timed_train_steps(models_, data, steps, device, dtype, step_inputs)
    return ({k: stats[k]["seconds"] for k in KINDS}, {k: stats[k]["tokens"] for k in KINDS},
            {k: stats[k]["targets"] for k in KINDS}, {k: stats[k]["params"] for k in KINDS})


def main():
    options = train_step_parser(__doc__, seq_length=128, batch_size=32, steps=8).parse_args()
    device, dtype = device_and_dtype(options)
    data = batches(options.seq_length, options.batch_size, 4, scheme="subword")
    seconds, tokens, predicted, params = measure(options.size, data, options.steps, device, dtype)
    result = {
        "size": options.size, "seq_length": options.seq_length, "batch_size": options.batch_size, "vocab_size": VOCAB,
        "device": str(device), "dtype": str(dtype), "steps": options.steps,
        **{f"{kind}_tokens_per_s": round(tokens[kind] / seconds[kind], 1) for kind in KINDS},
        **{f"{kind}_predicted_tokens_per_s": round(predicted[kind] / seconds[kind], 1) for kind in KINDS},
        **{f"{kind}_us_per_predicted_token": round(1e6 * seconds[kind] / predicted[kind], 1) for kind in KINDS},
        "tokens_per_s_ratio": round((tokens["cloze"] / seconds["cloze"])
                                    / (tokens["hf_bert_mlm"] / seconds["hf_bert_mlm"]), 2),
        "time_per_predicted_token_ratio": round((seconds["cloze"] / predicted["cloze"])
                                                / (seconds["hf_bert_mlm"] / predicted["hf_bert_mlm"]), 2),
        **{f"{kind}_params_M": round(params[kind] / 1e6, 2) for kind in KINDS},
    }
    if device.type == "cuda":
        peak = next((v for k, v in PEAK_FLOPS.items() if k in torch.cuda.get_device_name()), None)
        if peak:
            result["cloze_mfu"] = round(6 * params["cloze"] * tokens["cloze"] / seconds["cloze"] / peak, 3)
    write_result(f"cloze_{options.size}_{device.type}", result)


if __name__ == "__main__":
    main()
