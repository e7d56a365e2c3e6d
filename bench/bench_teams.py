"""Train-step throughput of `TeamsForPreTraining` vs a reference ELECTRA step built from transformers'
`ElectraForMaskedLM` (generator) and `ElectraForPreTraining` (discriminator), side by side in one run on the same
masked batches of real Wikipedia text. A train step is forward + backward + AdamW update of everything trained.

Compared, at one size preset:
  teams         TEAMS (MLM + 5 RTD + 2 MWS, attention task heads, half-depth generator sharing its bottom half)
  hf_electra    the reference: transformers' ELECTRA generator + discriminator at TEAMS's sizes (generator of half
                depth at full width), embeddings tied, generator logits over every position, loss MLM + 50 RTD
  electra       our `--model electra` (ELECTRA's narrow full-depth generator) on TEAMS's code path
  hf_electra_narrow  transformers' ELECTRA with that same narrow generator (parity check of our ELECTRA path)

    python bench/bench_teams.py [--size small] [--seq_length 128] [--batch_size 32] [--steps 8]
    python bench/bench_teams.py --bf16        # on a GPU: tokens/s and MFU in bf16
"""

from __future__ import annotations

import torch
from bench_spanbert import PEAK_FLOPS, VOCAB, batches
from common import device_and_dtype, timed_train_steps, train_step_parser, write_result

KINDS = ("teams", "hf_electra", "electra", "hf_electra_narrow")


class HfElectraStep(torch.nn.Module):
    """ELECTRA's joint step with transformers' classes: tied embeddings, Gumbel sampling in fp32, MLM + 50 RTD."""

    def __init__(self, generator_config, discriminator_config):
        super().__init__()
        from transformers import ElectraForMaskedLM, ElectraForPreTraining

        self.generator = ElectraForMaskedLM(generator_config)
        self.discriminator = ElectraForPreTraining(discriminator_config)
        # Tie the embeddings (word, position, type and their LayerNorm), as ELECTRA does.
        self.discriminator.electra.embeddings = self.generator.electra.embeddings

    def forward(self, input_ids, attention_mask, labels):
        generated = self.generator(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        masked = labels != -100
        with torch.no_grad():
            logits = generated.logits[masked].float()
            uniform = torch.rand_like(logits).clamp(1e-9, 1 - 1e-7)
            sampled = (logits - torch.log(-torch.log(uniform))).argmax(-1)
        original = torch.where(masked, labels, input_ids)
        corrupted = original.clone()
        corrupted[masked] = sampled
        discriminated = self.discriminator(
            input_ids=corrupted, attention_mask=attention_mask, labels=(corrupted != original).long()
        )
        return generated.loss + 50.0 * discriminated.loss


def build(kind, size):
    from transformers import ElectraConfig

    from encoder_zoo import models  # noqa: F401
    from encoder_zoo.models.teams.configuration_teams import TeamsConfig
    from encoder_zoo.models.teams.modeling_teams import TeamsForPreTraining
    from encoder_zoo.training.recipes.teams import RECIPES

    torch.manual_seed(0)
    recipe = RECIPES["electra" if kind in ("electra", "hf_electra_narrow") else "teams"]
    dims = dict(recipe.sizes[size], vocab_size=VOCAB, max_position_embeddings=512)
    if kind in ("teams", "electra"):
        return TeamsForPreTraining(TeamsConfig(**dims, **recipe.config_overrides))
    config = TeamsConfig(**dims, **recipe.config_overrides)  # resolved generator sizes
    shared = dict(vocab_size=VOCAB, embedding_size=config.embedding_size, max_position_embeddings=512)
    discriminator = ElectraConfig(**shared, hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
                                  num_attention_heads=config.num_attention_heads,
                                  intermediate_size=config.intermediate_size)
    generator = ElectraConfig(**shared, hidden_size=config.generator_hidden_size,
                              num_hidden_layers=config.generator_num_hidden_layers,
                              num_attention_heads=config.generator_num_attention_heads,
                              intermediate_size=config.generator_intermediate_size)
    return HfElectraStep(generator, discriminator)


def measure(size, data, steps, device, dtype):
    models_ = {kind: build(kind, size).to(device).train() for kind in KINDS}
    generator = torch.Generator().manual_seed(0)
    # Ours sample from the collator's per-example draws, as pretrain.py's batches carry them (made on the host, by
    # the DataLoader, outside the step); the references draw Gumbel noise in the step.
    draws = {id(batch): torch.rand(*batch["input_ids"].shape, models_["teams"].config.sampler_draws,
                                   generator=generator) for batch in data}

    def inputs(kind, batch):
        chosen = {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}
        if kind in ("teams", "electra"):
            chosen["sampler_uniforms"] = draws[id(batch)]
        return chosen

    stats = timed_train_steps(models_, data, steps, device, dtype, inputs)
    return ({kind: stats[kind]["tokens"] / stats[kind]["seconds"] for kind in KINDS},
            {k: stats[k]["params"] for k in KINDS})


def main():
    options = train_step_parser(__doc__, seq_length=128, batch_size=32, steps=8).parse_args()
    device, dtype = device_and_dtype(options)
    data = batches(options.seq_length, options.batch_size, 4, scheme="subword")
    throughput, params = measure(options.size, data, options.steps, device, dtype)
    result = {
        "size": options.size, "seq_length": options.seq_length, "batch_size": options.batch_size,
        "vocab_size": VOCAB, "device": str(device), "dtype": str(dtype), "steps": options.steps,
        **{f"{kind}_tokens_per_s": round(throughput[kind], 1) for kind in KINDS},
        "teams_vs_hf_electra": round(throughput["teams"] / throughput["hf_electra"], 2),
        "electra_vs_hf_electra_narrow": round(throughput["electra"] / throughput["hf_electra_narrow"], 2),
        **{f"{kind}_params_M": round(params[kind] / 1e6, 2) for kind in KINDS},
    }
    if device.type == "cuda":
        # 6 * params * tokens counts the dense model (the sparse heads only lower the true count): a conservative MFU.
        peak = next((v for k, v in PEAK_FLOPS.items() if k in torch.cuda.get_device_name()), None)
        if peak:
            result["teams_mfu"] = round(6 * params["teams"] * throughput["teams"] / peak, 3)
    write_result(f"teams_{options.size}_{device.type}", result)


if __name__ == "__main__":
    main()
