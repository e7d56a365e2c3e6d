"""TEAMS and its ELECTRA baseline: shapes, shared layers, candidate sets, RTD labels, loss weighting, the paper's
ablations, save/load in a fresh process, and pretraining on real text that lowers every loss."""

import json
import math

import pytest
import torch
from torch.nn import functional as F

from encoder_zoo import models  # noqa: F401  (registers the Auto classes)
from encoder_zoo.models.teams.configuration_teams import TeamsConfig
from encoder_zoo.models.teams.modeling_teams import (
    TeamsForMaskedLM,
    TeamsForPreTraining,
    TeamsForQuestionAnswering,
    TeamsForSequenceClassification,
    TeamsForTokenClassification,
    TeamsModel,
    sample_candidates,
    sample_replacements,
)

VOCAB = 120
MASK_ID = 4


def tiny_config(**overrides) -> TeamsConfig:
    dims = dict(vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0)
    return TeamsConfig(**{**dims, **overrides})


def masked_batch(batch_size=3, length=20, seed=0):
    """Random ids, 15-25% of the positions masked ([MASK] id in input, originals in labels), last row padded."""
    generator = torch.Generator().manual_seed(seed)
    original = torch.randint(5, VOCAB, (batch_size, length), generator=generator)
    attention_mask = torch.ones_like(original)
    attention_mask[-1, length - 6:] = 0
    masked = (torch.rand(batch_size, length, generator=generator) < 0.2) & attention_mask.bool()
    masked[:, 1] = True
    labels = torch.where(masked, original, torch.full_like(original, -100))
    input_ids = torch.where(masked, torch.full_like(original, MASK_ID), original)
    return dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels), original


def test_pretraining_shapes_and_sparse_logits():
    torch.manual_seed(0)
    config = tiny_config()
    model = TeamsForPreTraining(config)
    batch, _ = masked_batch()
    out = model(**batch)
    n_masked = int((batch["labels"] != -100).sum())
    assert out.mlm_logits.shape == (n_masked, VOCAB)  # generator logits only at masked positions
    assert out.mws_logits.shape == (n_masked, config.num_negatives + 1)  # never full-vocabulary in the discriminator
    assert out.candidate_ids.shape == (n_masked, config.num_negatives + 1)
    assert out.rtd_logits.shape == batch["input_ids"].shape == out.corrupted_input_ids.shape
    for name in ("loss", "mlm_loss", "rtd_loss", "mws_loss", "rtd_accuracy", "mws_accuracy"):
        assert out[name].dim() == 0 and torch.isfinite(out[name]), name
    # At init the MWS choice among K+1 candidates is near uniform.
    assert abs(out.mws_loss.item() - math.log(config.num_negatives + 1)) < 0.5


def test_bare_model_and_heads_shapes_and_losses():
    torch.manual_seed(0)
    config = tiny_config(num_labels=3)
    batch, _ = masked_batch()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    hidden = TeamsModel(config)(**inputs).last_hidden_state
    assert hidden.shape == (3, 20, 32)
    out = TeamsForSequenceClassification(config)(**inputs, labels=torch.tensor([0, 2, 1]))
    assert out.logits.shape == (3, 3) and out.loss.item() > 0
    out = TeamsForQuestionAnswering(config)(**inputs, start_positions=torch.tensor([1, 2, 3]),
                                            end_positions=torch.tensor([2, 4, 5]))
    assert out.start_logits.shape == out.end_logits.shape == (3, 20) and out.loss.item() > 0
    out = TeamsForTokenClassification(config)(**inputs, labels=torch.randint(0, 3, (3, 20)))
    assert out.logits.shape == (3, 20, 3) and out.loss.item() > 0
    regression = TeamsForSequenceClassification(tiny_config(num_labels=1))
    out = regression(**inputs, labels=torch.tensor([0.5, 1.0, 2.0]))
    assert torch.allclose(out.loss, F.mse_loss(out.logits.squeeze(-1), torch.tensor([0.5, 1.0, 2.0])))


def test_bottom_half_of_generator_layers_are_the_discriminators_own_modules():
    config = tiny_config(num_hidden_layers=8)  # generator: 4 layers, the bottom 2 shared
    model = TeamsForPreTraining(config)
    generator_layers = model.generator_layers()
    assert config.generator_num_hidden_layers == 4 and len(generator_layers) == 4
    assert generator_layers[0] is model.teams.layer[0] and generator_layers[1] is model.teams.layer[1]
    assert all(layer is not model.teams.layer[i] for i, layer in enumerate(generator_layers[2:], start=2))
    # One parameter set: no shared weight is stored twice.
    ids = [id(p) for p in model.parameters()]
    assert len(ids) == len(set(ids))
    assert not any(name.startswith("generator.layer.") and name.split(".")[2] in ("2", "3")
                   for name in model.state_dict())
    assert sum(1 for name in model.state_dict() if name.startswith("generator.layer.")) > 0
    # Embeddings are tied: the generator decodes with the discriminator's word embeddings.
    assert model.get_input_embeddings() is model.teams.embeddings.word_embeddings


def test_shared_layers_get_gradient_from_both_losses():
    torch.manual_seed(0)
    model = TeamsForPreTraining(tiny_config(num_hidden_layers=8))
    batch, _ = masked_batch()
    shared = model.teams.layer[0].attention.self.query.weight
    generator_only = model.generator.layer[0].attention.self.query.weight
    discriminator_only = model.teams.layer[5].attention.self.query.weight

    out = model(**batch)
    grad_mlm = torch.autograd.grad(out.mlm_loss, [shared, generator_only, discriminator_only], allow_unused=True)
    out = model(**batch)
    grad_disc = torch.autograd.grad(out.rtd_loss + out.mws_loss, [shared, generator_only, discriminator_only],
                                    allow_unused=True)
    assert grad_mlm[0].abs().sum() > 0 and grad_disc[0].abs().sum() > 0  # the shared layer learns from both
    assert grad_mlm[1].abs().sum() > 0 and grad_disc[1] is None  # no gradient through the sampling
    assert grad_mlm[2] is None and grad_disc[2].abs().sum() > 0


@pytest.mark.parametrize("strategy", ["sampled", "hardest"])
def test_candidate_sets_are_original_plus_k_distinct_non_originals(strategy):
    torch.manual_seed(0)
    logits = torch.randn(500, 50, dtype=torch.bfloat16) * 3
    originals = logits.float().argmax(-1)  # the hardest case: the original is the generator's favourite
    candidates = sample_candidates(logits, originals, 5, strategy)
    assert candidates.shape == (500, 6) and candidates.dtype == torch.long
    assert torch.equal(candidates[:, 0], originals)
    assert not (candidates[:, 1:] == originals[:, None]).any()
    assert all(len(set(row.tolist())) == 6 for row in candidates)
    if strategy == "hardest":
        expected = logits.float().scatter(1, originals[:, None], float("-inf")).topk(5).indices
        assert torch.equal(candidates[:, 1:], expected)


def test_sampled_negatives_follow_the_generator_distribution_without_replacement():
    torch.manual_seed(0)
    probs = torch.tensor([0.0, 0.5, 0.3, 0.15, 0.05])
    logits = probs.clamp_min(1e-9).log().expand(20000, -1)
    originals = torch.zeros(20000, dtype=torch.long)
    first = sample_candidates(logits, originals, 1, "sampled")[:, 1]
    frequency = torch.bincount(first, minlength=5).float() / 20000
    assert torch.allclose(frequency[1:], probs[1:], atol=0.02)  # one draw = a draw from the softmax
    both = sample_candidates(logits, originals, 2, "sampled")[:, 1:]
    # P(token 3 among two draws w/o replacement) = sum over first draws of the chance it is picked first or second.
    p = probs[1:]
    p_three = p[2] + sum(p[i] * p[2] / (1 - p[i]) for i in (0, 1, 3))
    assert abs((both == 3).any(dim=1).float().mean() - p_three) < 0.02


def plackett_luce_pairs(probs: torch.Tensor) -> dict[tuple[int, int], float]:
    """P(first pick a, second pick b) drawing two tokens without replacement from `probs` (token 0 is the original,
    never drawn): the law Gumbel top-2 draws."""
    rest = probs.clone()
    rest[0] = 0
    rest = rest / rest.sum()
    return {(a, b): float(rest[a] * rest[b] / (1 - rest[a])) for a in range(1, len(probs))
            for b in range(1, len(probs)) if a != b}


@pytest.mark.parametrize("drawn_from", ["uniforms", "gumbel"])
def test_both_samplers_draw_the_plackett_luce_law(drawn_from):
    """The collator-keyed sampler (inverse CDF from given uniforms) and Gumbel top-k draw ordered candidate pairs and
    replacements with the same law: a chi-square test against the exact probabilities (200,000 draws each)."""
    from scipy.stats import chisquare

    n = 200_000
    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    logits = probs.log().expand(n, -1)
    originals = torch.zeros(n, dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    uniforms = torch.rand(n, 3, generator=generator) if drawn_from == "uniforms" else None
    torch.manual_seed(1)
    replacements = sample_replacements(logits, uniforms=None if uniforms is None else uniforms[:, 0])
    pairs = sample_candidates(logits, originals, 2, uniforms=None if uniforms is None else uniforms[:, 1:])[:, 1:]
    observed = torch.bincount(replacements, minlength=6).double()
    assert chisquare(observed.numpy(), (probs.double() / probs.double().sum() * n).numpy()).pvalue > 1e-3
    law = plackett_luce_pairs(probs)
    counts = torch.bincount(pairs[:, 0] * 6 + pairs[:, 1], minlength=36).double()
    observed = [float(counts[a * 6 + b]) for a, b in law]
    assert sum(observed) == n  # every pair is two distinct non-originals
    assert chisquare(observed, [law[key] / sum(law.values()) * n for key in law]).pvalue > 1e-3


def test_keyed_candidates_stay_distinct_when_the_softmax_underflows():
    """Fewer tokens with fp32 mass than K: the keyed sampler still returns K distinct non-originals (the most likely
    ones left, as Gumbel top-k all but surely would), never the original."""
    logits = torch.tensor([[0.0, -300.0, -400.0, 60.0, -500.0, 5.0]]).expand(4, -1)
    originals = torch.tensor([3, 3, 0, 5])
    uniforms = torch.tensor([[0.0, 0.5, 0.999], [0.999, 0.999, 0.999], [0.3, 0.3, 0.3], [0.0, 0.0, 0.0]])
    candidates = sample_candidates(logits, originals, 3, uniforms=uniforms)
    assert torch.equal(candidates[:, 0], originals)
    assert all(len(set(row.tolist())) == 4 for row in candidates)
    assert candidates[0, 1:].tolist() == [0, 5, 1] and candidates[2, 1:].tolist() == [3, 5, 1]


def test_keyed_draws_corrupt_an_example_alike_whatever_shares_its_batch():
    """With `sampler_uniforms` (a row's draws), an example's replacements and candidates do not depend on the other
    rows of its batch: the same example beside two different ones is corrupted the same way."""
    torch.manual_seed(0)
    model = TeamsForPreTraining(tiny_config()).eval()
    batch, _ = masked_batch(batch_size=3, seed=1)
    batch["attention_mask"][-1] = 1
    generator = torch.Generator().manual_seed(2)
    draws = torch.rand(*batch["input_ids"].shape, tiny_config().sampler_draws, generator=generator)

    def run(rows):
        return model(**{key: value[rows] for key, value in batch.items()}, sampler_uniforms=draws[rows])

    first, second = run([0, 1]), run([0, 2])
    assert torch.equal(first.corrupted_input_ids[0], second.corrupted_input_ids[0])
    targets = int((batch["labels"][0] != -100).sum())
    assert torch.equal(first.candidate_ids[:targets], second.candidate_ids[:targets])
    with pytest.raises(ValueError, match="sampler_draws=6"):
        model(**batch, sampler_uniforms=draws[..., :2])


def test_rtd_labels_mark_replaced_tokens_and_a_sampled_original_counts_as_original():
    torch.manual_seed(0)
    model = TeamsForPreTraining(tiny_config())
    batch, original = masked_batch()
    forced = 7  # make the generator always sample token 7
    with torch.no_grad():
        model.generator.bias[forced] = 1e4
    rows, cols = (batch["labels"] != -100).nonzero(as_tuple=True)
    batch["labels"][rows[::2], cols[::2]] = forced  # half of the masked originals are token 7
    original[rows[::2], cols[::2]] = forced
    out = model(**batch)
    masked = batch["labels"] != -100
    assert torch.equal(out.corrupted_input_ids[masked], torch.full_like(out.corrupted_input_ids[masked], forced))
    assert torch.equal(out.corrupted_input_ids[~masked], original[~masked])
    expected = (masked & (original != forced)).float()
    assert torch.equal(out.rtd_labels, expected)
    assert out.rtd_labels[rows[::2], cols[::2]].sum() == 0  # sampled == original -> "original"
    # RTD is averaged over non-padding tokens only.
    real = batch["attention_mask"].bool()
    manual = F.binary_cross_entropy_with_logits(out.rtd_logits[real], expected[real])
    assert torch.allclose(out.rtd_loss, manual)


def test_loss_is_the_configured_weighted_sum():
    batch, _ = masked_batch()
    for weights in ((1.0, 5.0, 2.0), (0.5, 1.0, 3.0)):
        torch.manual_seed(0)
        model = TeamsForPreTraining(tiny_config(mlm_loss_weight=weights[0], rtd_loss_weight=weights[1],
                                                mws_loss_weight=weights[2]))
        out = model(**batch)
        expected = weights[0] * out.mlm_loss + weights[1] * out.rtd_loss + weights[2] * out.mws_loss
        assert torch.allclose(out.loss, expected)
        n_masked = (batch["labels"] != -100).sum()
        mws_manual = F.cross_entropy(out.mws_logits, torch.zeros(int(n_masked), dtype=torch.long))
        assert torch.allclose(out.mws_loss, mws_manual)  # mean over masked positions, original is candidate 0


def test_in_place_gumbel_sampling_draws_exactly_the_textbook_samples():
    """The samplers work in place on one noise buffer; on a fixed seed they draw what the plain formulas draw."""
    logits = torch.randn(300, 50) * 2
    originals = torch.randint(0, 50, (300,))
    torch.manual_seed(3)
    replacements = sample_replacements(logits)
    candidates = sample_candidates(logits, originals, 5)
    torch.manual_seed(3)
    tiny = torch.finfo(torch.float32).tiny
    gumbel = lambda: -torch.log(-torch.log(torch.rand(logits.shape).clamp(tiny, 1 - 1e-7)))  # noqa: E731
    expected_replacements = (logits + gumbel()).argmax(-1)
    scores = logits.scatter(1, originals[:, None], float("-inf")) + gumbel()
    expected_candidates = torch.cat([originals[:, None], scores.topk(5).indices], dim=1)
    assert torch.equal(replacements, expected_replacements) and torch.equal(candidates, expected_candidates)
    assert torch.equal(logits, logits.clone())  # the caller's logits are left alone


def test_generator_top_layer_runs_its_feed_forward_at_masked_positions_only():
    """The generator's output is read at masked positions only, so its top layer's feed-forward block runs there
    alone; the logits are those of the full generator."""
    torch.manual_seed(0)
    model = TeamsForPreTraining(tiny_config()).eval()
    batch, _ = masked_batch()
    rows_seen = []
    top = model.generator_layers()[-1]
    hook = top.intermediate.register_forward_pre_hook(lambda module, args: rows_seen.append(args[0].shape[:-1].numel()))
    with torch.no_grad():
        out = model(**batch)
        hidden = model.teams.embed(batch["input_ids"])
        mask = model.teams.attention_mask_for(hidden, batch["attention_mask"])
        for layer in model.generator_layers():
            hidden = layer(hidden, mask)
    hook.remove()
    rows, cols = (batch["labels"] != -100).nonzero(as_tuple=True)
    expected = F.linear(model.generator.predictions(hidden[rows, cols]), model.teams.embeddings.word_embeddings.weight,
                        model.generator.bias)
    assert rows_seen[0] == rows.numel()
    torch.testing.assert_close(out.mlm_logits, expected, rtol=0, atol=1e-6)


def test_mws_scores_are_dot_products_with_candidate_embedding_rows():
    torch.manual_seed(0)
    model = TeamsForPreTraining(tiny_config())
    batch, _ = masked_batch()
    out = model(**batch)
    candidates = out.candidate_ids
    embeddings = model.teams.embeddings.word_embeddings.weight
    # Recompute from the top discriminator layer with the output's corrupted input.
    top = model.teams(out.corrupted_input_ids, attention_mask=batch["attention_mask"]).last_hidden_state
    rows, cols = (batch["labels"] != -100).nonzero(as_tuple=True)
    head = model.mws_head
    query = head.LayerNorm(head.activation(head.dense(top[rows, cols])))
    manual = (query[:, None, :] * embeddings[candidates]).sum(-1)
    assert torch.allclose(out.mws_logits, manual, atol=1e-5)


def test_ablations_change_what_they_claim():
    # Only RTD (ELECTRA-style): no MWS head, no task layer, RTD on the top layer.
    model = TeamsForPreTraining(tiny_config(pretraining_tasks="rtd"))
    out = model(**masked_batch()[0])
    assert (model.mws_head is None and model.teams.rtd_layer is None and out.mws_loss is None
            and out.rtd_loss is not None)
    # Only MWS.
    model = TeamsForPreTraining(tiny_config(pretraining_tasks="mws"))
    out = model(**masked_batch()[0])
    assert model.rtd_head is None and out.rtd_loss is None and out.mws_loss is not None
    # FFN task heads: both tasks read the top layer, no extra transformer layer.
    assert TeamsForPreTraining(tiny_config(task_head_type="ffn")).teams.rtd_layer is None
    # Where the task layers sit (Table 3): test_task_head_placements_build_the_layers_they_name.
    # Tying: none / full / bottom half; generator depth.
    assert len(TeamsForPreTraining(tiny_config(layer_tying="none")).generator.layer) == 2
    full = TeamsForPreTraining(tiny_config(layer_tying="full", generator_num_hidden_layers=3))
    assert len(full.generator.layer) == 0 and all(a is b for a, b in zip(full.generator_layers(), full.teams.layer))
    assert len(TeamsForPreTraining(tiny_config(generator_num_hidden_layers=4)).generator_layers()) == 4
    # K.
    out = TeamsForPreTraining(tiny_config(num_negatives=3))(**masked_batch()[0])
    assert out.mws_logits.shape[1] == 4
    with pytest.raises(ValueError, match="pretraining_tasks"):
        tiny_config(pretraining_tasks="mlm")
    with pytest.raises(ValueError, match="width"):
        tiny_config(generator_hidden_size=16)  # a narrower generator cannot share layers


def run_discriminator(model, corrupted, attention_mask):
    """The discriminator by hand: every backbone layer's output, then the task layers the config places."""
    teams, config = model.teams, model.config
    hidden = teams.embed(corrupted)
    mask = teams.attention_mask_for(hidden, attention_mask)
    outputs = []
    for layer in teams.layer:
        hidden = layer(hidden, mask)
        outputs.append(hidden)
    source = outputs[config.task_source_layer - 1]
    rtd = teams.rtd_layer(source, mask) if teams.rtd_layer is not None else outputs[-1]
    mws = teams.mws_layer(source, mask) if teams.mws_layer is not None else outputs[-1]
    return outputs, rtd, mws


def layer_parameters(config):
    from transformers.models.electra.modeling_electra import ElectraLayer

    return sum(p.numel() for p in ElectraLayer(config).parameters())


# placement -> (layer feeding the RTD task layer, layer feeding the MWS task layer, extra discriminator layers);
# None where the task has no layer of its own and its head reads layer L directly.
PLACEMENTS = {
    "penultimate": (3, None, 1),  # the paper: layer L is MWS's task layer, an extra one on L-1 is RTD's
    "last": (4, 4, 2),  # Table 3 "Add task head on 12th layer": two extra layers on layer L
    "last_rtd_only": (4, None, 1),  # the former rtd_head_source="last"
}


@pytest.mark.parametrize("placement", [*PLACEMENTS, "ffn"])
def test_task_head_placements_build_the_layers_they_name(placement):
    torch.manual_seed(0)
    config = tiny_config(task_head_type="ffn") if placement == "ffn" else tiny_config(task_heads_on_layer=placement)
    rtd_source, mws_source, extra = PLACEMENTS.get(placement, (None, None, 0))
    model = TeamsForPreTraining(config).eval()
    teams = model.teams

    # Structure and parameter counts: L backbone layers plus exactly the extra task layers the option names.
    assert len(teams.layer) == 4
    assert (teams.rtd_layer is not None) == (rtd_source is not None)
    assert (teams.mws_layer is not None) == (mws_source is not None)
    plain = sum(p.numel() for p in TeamsForPreTraining(tiny_config(task_head_type="ffn")).teams.parameters())
    assert sum(p.numel() for p in teams.parameters()) == plain + extra * layer_parameters(config)

    # Which layer feeds which head: hooks on the real forward against the discriminator run by hand. (The MWS layer
    # runs its feed-forward block at the masked positions only: its input is its attention block's.)
    seen = {}
    hooks = [module.register_forward_pre_hook(lambda m, args, name=name: seen.__setitem__(name, args[0]))
             for name, module in (("rtd_layer", teams.rtd_layer),
                                  ("mws_layer", teams.mws_layer.attention if teams.mws_layer is not None else None),
                                  ("rtd_head", model.rtd_head), ("mws_head", model.mws_head)) if module is not None]
    batch, _ = masked_batch()
    with torch.no_grad():
        out = model(**batch)
        outputs, rtd_states, mws_states = run_discriminator(model, out.corrupted_input_ids, batch["attention_mask"])
    for hook in hooks:
        hook.remove()
    rows, cols = (batch["labels"] != -100).nonzero(as_tuple=True)
    if rtd_source is not None:
        torch.testing.assert_close(seen["rtd_layer"], outputs[rtd_source - 1])
    if mws_source is not None:
        torch.testing.assert_close(seen["mws_layer"], outputs[mws_source - 1])
    torch.testing.assert_close(seen["rtd_head"], rtd_states)
    torch.testing.assert_close(seen["mws_head"], mws_states[rows, cols])
    if rtd_source is None:  # the head reads the top layer itself
        torch.testing.assert_close(seen["rtd_head"], outputs[-1])
    if mws_source is None:
        torch.testing.assert_close(seen["mws_head"], outputs[-1][rows, cols])

    # The losses from those states: RTD over real tokens, MWS over masked ones, weighted 1 / 5 / 2.
    with torch.no_grad():
        rtd_logits = model.rtd_head(rtd_states)
        real = batch["attention_mask"].bool()
        rtd_loss = F.binary_cross_entropy_with_logits(rtd_logits[real], out.rtd_labels[real])
        embeddings = teams.embeddings.word_embeddings.weight
        mws_logits = model.mws_head(mws_states[rows, cols], embeddings[out.candidate_ids])
        mws_loss = F.cross_entropy(mws_logits, torch.zeros_like(rows))
    torch.testing.assert_close(out.rtd_logits, rtd_logits)
    torch.testing.assert_close(out.mws_logits, mws_logits)
    torch.testing.assert_close(out.rtd_loss, rtd_loss)
    torch.testing.assert_close(out.mws_loss, mws_loss)
    torch.testing.assert_close(out.loss, out.mlm_loss + 5 * rtd_loss + 2 * mws_loss)

    # Fine-tuning keeps the MWS task layer (the paper's "effectively 13 layers" on layer L) and drops RTD's.
    encoder = TeamsModel(config).eval()
    assert encoder.rtd_layer is None and (encoder.mws_layer is not None) == (mws_source is not None)
    missing, unexpected = encoder.load_state_dict(teams.state_dict(), strict=False)
    assert not missing and all(key.startswith("rtd_layer.") for key in unexpected)
    with torch.no_grad():
        encoded = encoder(input_ids=out.corrupted_input_ids, attention_mask=batch["attention_mask"]).last_hidden_state
    torch.testing.assert_close(encoded, mws_states)
    if rtd_source is not None:
        rtd_encoder = TeamsModel(tiny_config(task_heads_on_layer=placement, finetune_representation="rtd")).eval()
        rtd_encoder.load_state_dict(teams.state_dict(), strict=False)
        assert rtd_encoder.mws_layer is None
        with torch.no_grad():
            encoded = rtd_encoder(input_ids=out.corrupted_input_ids, attention_mask=batch["attention_mask"])
        torch.testing.assert_close(encoded.last_hidden_state, rtd_states)


def test_old_rtd_head_source_configs_still_load_with_their_weights(tmp_path):
    assert tiny_config(rtd_head_source="last").task_heads_on_layer == "last_rtd_only"
    assert tiny_config(rtd_head_source="penultimate").task_heads_on_layer == "penultimate"
    # Ignored before where no RTD task layer exists; still ignored, not an error.
    assert tiny_config(rtd_head_source="last", task_head_type="ffn").task_heads_on_layer == "penultimate"
    assert not hasattr(tiny_config(rtd_head_source="last"), "rtd_head_source")
    with pytest.raises(ValueError, match="rtd_head_source"):
        tiny_config(rtd_head_source="middle")
    with pytest.raises(ValueError, match="task_heads_on_layer alone"):
        tiny_config(rtd_head_source="last", task_heads_on_layer="last")
    with pytest.raises(ValueError, match="task_heads_on_layer"):
        tiny_config(task_heads_on_layer="first")
    with pytest.raises(ValueError, match="task_head_type='attention'"):
        tiny_config(task_heads_on_layer="last", task_head_type="ffn")

    # A checkpoint saved when the field was rtd_head_source="last" reloads with every weight in place.
    torch.manual_seed(0)
    model = TeamsForPreTraining(tiny_config(task_heads_on_layer="last_rtd_only")).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["rtd_head_source"] = "last"
    del saved["task_heads_on_layer"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    reloaded, info = TeamsForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert reloaded.config.task_heads_on_layer == "last_rtd_only"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor)


def test_finetuning_from_rtd_head_outputs_reads_the_rtd_task_layer():
    torch.manual_seed(0)
    pretraining = TeamsForPreTraining(tiny_config()).eval()
    batch, _ = masked_batch()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    encoder = TeamsModel(tiny_config(finetune_representation="rtd")).eval()
    encoder.load_state_dict(pretraining.teams.state_dict())
    teams = pretraining.teams
    mask = teams.attention_mask_for(teams.embed(inputs["input_ids"]), inputs["attention_mask"])
    hidden = teams.embed(inputs["input_ids"])
    for layer in teams.layer[:3]:
        hidden = layer(hidden, mask)
    expected = teams.rtd_layer(hidden, mask)
    assert torch.allclose(encoder(**inputs).last_hidden_state, expected, atol=1e-5)
    mws_encoder = TeamsModel(tiny_config()).eval()
    assert mws_encoder.rtd_layer is None  # the default encoder has no RTD layer to carry
    with pytest.raises(ValueError, match="finetune_representation"):
        tiny_config(finetune_representation="rtd", task_head_type="ffn")


def test_electra_recipe_is_the_same_code_path_with_a_narrow_untied_generator():
    from encoder_zoo.training.recipes.teams import RECIPES

    recipe = RECIPES["electra"]
    dims = {**recipe.sizes["tiny"], **recipe.config_overrides}
    config = TeamsConfig(vocab_size=VOCAB, max_position_embeddings=64, **dims)
    model = TeamsForPreTraining(config)
    assert config.generator_hidden_size < config.hidden_size and config.num_shared_generator_layers == 0
    assert model.teams.rtd_layer is None and model.mws_head is None and config.rtd_loss_weight == 50.0
    out = model(**masked_batch()[0])
    assert torch.allclose(out.loss, out.mlm_loss + 50.0 * out.rtd_loss)
    assert TeamsConfig(**{**dims, "vocab_size": VOCAB}).generator_num_hidden_layers == config.num_hidden_layers


def test_attention_implementations_agree():
    torch.manual_seed(0)
    batch, _ = masked_batch()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    eager = TeamsModel(tiny_config(_attn_implementation="eager")).eval()
    sdpa = TeamsModel(tiny_config(_attn_implementation="sdpa")).eval()
    sdpa.load_state_dict(eager.state_dict())
    real = inputs["attention_mask"].bool()
    assert torch.allclose(eager(**inputs).last_hidden_state[real], sdpa(**inputs).last_hidden_state[real], atol=1e-5)


def test_save_load_round_trip_keeps_pretraining_state_and_loads_as_encoder(tmp_path):
    from helpers import run_isolated

    torch.manual_seed(0)
    model = TeamsForPreTraining(tiny_config()).eval()
    model.save_pretrained(tmp_path)
    batch, _ = masked_batch()
    ids = batch["input_ids"].tolist()
    with torch.no_grad():
        expected = model.teams(input_ids=batch["input_ids"]).last_hidden_state[0, :3, :3].tolist()
    generator_bias = model.generator.bias[:3].tolist()
    out = run_isolated(f"""
        import json, torch
        from transformers import AutoModel, AutoModelForPreTraining, AutoModelForSequenceClassification
        path = {str(tmp_path)!r}
        ids = torch.tensor({ids})
        encoder = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
        full = AutoModelForPreTraining.from_pretrained(path, trust_remote_code=True).eval()
        classifier = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True, num_labels=2)
        with torch.no_grad():
            hidden = encoder(input_ids=ids).last_hidden_state[0, :3, :3].tolist()
        print(json.dumps({{
            "encoder": type(encoder).__name__, "full": type(full).__name__, "classifier": type(classifier).__name__,
            "module": type(encoder).__module__, "hidden": hidden,
            "generator_bias": full.generator.bias[:3].tolist(),
            "shared": full.generator_layers()[0] is full.teams.layer[0],
            "has_heads": full.rtd_head is not None and full.mws_head is not None,
        }}))
    """)
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["encoder"], result["full"], result["classifier"]) == (
        "TeamsModel", "TeamsForPreTraining", "TeamsForSequenceClassification")
    assert result["module"].startswith("transformers_modules")
    assert torch.allclose(torch.tensor(result["hidden"]), torch.tensor(expected), atol=1e-5)
    assert result["generator_bias"] == pytest.approx(generator_bias)
    assert result["shared"] and result["has_heads"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["teams", "electra"])
def test_pretraining_on_real_text_lowers_every_loss(tmp_path, model):
    from test_pretrain import real_text_run, train_logs

    out = tmp_path / "run"
    logs = train_logs(real_text_run(model, out, steps=200, logging_steps=20))
    final = lambda key: sum(entry[key] for entry in logs[-3:]) / 3  # noqa: E731
    # Generator: from ~ln(4000) = 8.3 nats, a drop of over 1 nat, and more masked tokens right.
    assert final("mlm_loss") < logs[0]["mlm_loss"] - 1.0
    assert final("mlm_accuracy") > logs[0]["mlm_accuracy"] + 0.02
    # RTD: from ln 2 at init to at least the replaced-token base rate (~0.42 nats at 15% masking).
    assert final("rtd_loss") < 0.85 * logs[0]["rtd_loss"] and final("rtd_accuracy") > 0.8
    if model == "teams":
        # MWS falls while the generator's negatives are easy, then tracks their difficulty: as the generator learns
        # the unigram distribution its samples become as plausible as the original to a tiny discriminator, and
        # the loss returns towards chance, ln 6 (it leaves chance again only after thousands of steps).
        mws = [entry["mws_loss"] for entry in logs]
        assert min(mws) < mws[0] - 0.1, mws
        assert final("mws_loss") < math.log(6) + 0.03, mws
        assert max(entry["mws_accuracy"] for entry in logs) > 1 / 6 + 0.15
    export = out / "export"
    assert (export / "model.safetensors").exists() and (export / "README.md").exists()
    # The card draws the validation losses with the training ones, and the accuracies in their own figure.
    card = (export / "README.md").read_text()
    assert "![Training and validation accuracies](accuracy.png)" in card and (export / "accuracy.png").exists()


def test_a_teams_pretraining_checkpoint_fine_tunes_through_glue_and_qa(tmp_path):
    """The exported pretraining state (generator and heads included) feeds both harnesses as-is."""
    from transformers import AutoTokenizer

    from encoder_zoo.glue.run_glue import main as run_glue
    from encoder_zoo.qa.run_qa import main as run_qa
    from encoder_zoo.training.data.resources import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    checkpoint = tmp_path / "teams"
    TeamsForPreTraining(tiny_config(vocab_size=len(tokenizer), max_position_embeddings=128)).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    glue = run_glue(["--model_name_or_path", str(checkpoint), "--trust_remote_code", "--task_name", "rotten_tomatoes",
                     "--max_train_samples", "32", "--max_eval_samples", "16", "--max_seq_length", "64",
                     "--num_train_epochs", "1", "--per_device_train_batch_size", "8",
                     "--output_dir", str(tmp_path / "glue")])
    assert 0 <= glue["tasks"]["rotten_tomatoes"]["median"]["accuracy"] <= 100
    qa = run_qa(["--model_name_or_path", str(checkpoint), "--trust_remote_code", "--dataset", "wiki_cloze",
                 "--max_train_samples", "24", "--max_eval_samples", "12", "--max_seq_length", "128",
                 "--doc_stride", "32", "--max_question_length", "48", "--num_train_epochs", "1",
                 "--per_device_train_batch_size", "8", "--output_dir", str(tmp_path / "qa")])
    assert {"exact_match", "f1"} <= set(qa["eval"]) or {"exact", "f1"} <= set(qa["eval"])
    from transformers import AutoModelForQuestionAnswering

    assert (type(AutoModelForQuestionAnswering.from_pretrained(tmp_path / "qa", trust_remote_code=True)).__name__
            == "TeamsForQuestionAnswering")


ELECTRA_CONFIG = dict(pretraining_tasks="rtd", task_head_type="ffn", layer_tying="none", generator_hidden_size=16,
                      generator_intermediate_size=32, generator_num_attention_heads=1)


@pytest.mark.parametrize("overrides", [{}, ELECTRA_CONFIG], ids=["teams", "electra"])
def test_resize_token_embeddings_grows_the_generator_output_and_its_bias(overrides):
    torch.manual_seed(0)
    model = TeamsForPreTraining(tiny_config(**overrides))
    batch, _ = masked_batch()
    model.resize_token_embeddings(VOCAB + 6)
    assert model.generator.bias.shape == (VOCAB + 6,) and model.generator.decoder.bias is model.generator.bias
    assert model.generator.decoder.weight is model.teams.embeddings.word_embeddings.weight
    output = model(**batch)
    assert output.mlm_logits.shape[-1] == VOCAB + 6 and torch.isfinite(output.loss)


@pytest.mark.parametrize("overrides", [{}, ELECTRA_CONFIG], ids=["teams", "electra"])
def test_inference_without_labels_scores_the_input_and_the_generator_is_a_masked_lm(overrides, tmp_path):
    torch.manual_seed(0)
    model = TeamsForPreTraining(tiny_config(**overrides)).eval()
    batch, original = masked_batch()
    with torch.no_grad():
        scored = model(original, attention_mask=batch["attention_mask"])
        assert scored.loss is None and scored.rtd_logits is not None and scored.rtd_logits.shape == original.shape
        # The discriminator's inference is its training pass on an uncorrupted input.
        trained = model(**batch)
        by_hand = model.discriminate(trained.corrupted_input_ids, batch["attention_mask"], None, None, None)
        torch.testing.assert_close(by_hand.rtd_logits, trained.rtd_logits)
        if model.mws_head is not None:
            candidates = torch.randint(5, VOCAB, (*original.shape, 3))
            candidates[..., 0] = original
            scores = model(original, attention_mask=batch["attention_mask"], candidate_ids=candidates).mws_logits
            assert scores.shape == candidates.shape
        else:
            with pytest.raises(ValueError, match="MWS head"):
                model(original, candidate_ids=torch.zeros(*original.shape, 2, dtype=torch.long))
    model.save_pretrained(tmp_path)
    masked_lm = TeamsForMaskedLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        full = masked_lm(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        sparse = masked_lm(**batch)
    assert full.shape == (*original.shape, VOCAB)
    targets = batch["labels"] != -100
    torch.testing.assert_close(sparse.logits, full[targets], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(sparse.logits, trained.mlm_logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, dict(task_heads_on_layer="last")], ids=["penultimate", "last"])
def test_pretraining_outputs_are_ordered_and_record_the_discriminator(overrides, tmp_path):
    """The tuple form starts with the loss (with labels) or the RTD logits (without); hidden states and attention
    maps are the discriminator trunk's (embeddings and layers 1..L), in both modes, and change nothing else."""
    torch.manual_seed(0)
    model = TeamsForPreTraining(tiny_config(attn_implementation="eager", **overrides)).eval()
    batch, original = masked_batch()
    with torch.no_grad():
        torch.manual_seed(1)
        trained = model(**batch)
        torch.manual_seed(1)
        as_tuple = model(**batch, return_dict=False)
        torch.manual_seed(1)
        recorded = model(**batch, output_hidden_states=True, output_attentions=True)
        scored = model(original, attention_mask=batch["attention_mask"], output_hidden_states=True,
                       output_attentions=True)
    torch.testing.assert_close(as_tuple[0], trained.loss)
    torch.testing.assert_close(recorded.loss, trained.loss)
    for out in (recorded, scored):
        assert len(out.hidden_states) == 4 + 1 and len(out.attentions) == 4
        assert out.hidden_states[0].shape == (*original.shape, 32) and out.attentions[0].shape == (3, 2, 20, 20)
    assert model(original, attention_mask=batch["attention_mask"], return_dict=False)[0].shape == original.shape
    # The discriminator's states on the uncorrupted text are TeamsModel's (the bare encoder of the same export).
    model.save_pretrained(tmp_path)
    bare = TeamsModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        encoder = bare(original, attention_mask=batch["attention_mask"], output_hidden_states=True)
    for mine, theirs in zip(scored.hidden_states[:4], encoder.hidden_states[:4]):
        torch.testing.assert_close(mine, theirs)


def test_masked_lm_holds_only_the_layers_the_generator_runs(tmp_path):
    config = tiny_config(generator_num_hidden_layers=4)  # bottom half: 2 shared discriminator layers
    TeamsForPreTraining(config).save_pretrained(tmp_path)
    masked_lm, info = TeamsForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert len(masked_lm.teams.layer) == 2 and masked_lm.teams.rtd_layer is None
    assert not info["missing_keys"] and not info["unexpected_keys"]
    batch, _ = masked_batch()
    masked_lm.train()(**batch).loss.backward()
    assert all(p.grad is not None for p in masked_lm.parameters())  # no parameter without a gradient (DDP, FSDP)
    out = masked_lm.eval()(batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    assert len(out.hidden_states) == 4 + 1 and out.logits.shape == (3, 20, VOCAB)
