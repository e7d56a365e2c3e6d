"""Two-tower cloze model tests on tiny configs (transformers' model-tester style)."""

import json

import pytest
import torch
from helpers import run_isolated
from torch.nn import functional as F
from transformers import AutoModel, AutoModelForPreTraining, AutoModelForSequenceClassification

from encoder_zoo import models  # (registers the families)
from encoder_zoo.models.cloze.configuration_cloze import AUTO_MAP, TwoTowerClozeConfig
from encoder_zoo.models.cloze.modeling_cloze import (
    TwoTowerCloze,
    TwoTowerClozeForMaskedLM,
    TwoTowerClozeForQuestionAnswering,
    TwoTowerClozeForSequenceClassification,
    TwoTowerClozeForTokenClassification,
    TwoTowerClozeModel,
    additive_mask,
    boundary_positions,
    combination_visibility,
)


class ClozeModelTester:
    batch_size, seq_length, vocab_size, hidden_size = 3, 16, 99, 32
    bos, eos, sep, pad = 1, 2, 3, 0

    def config(self, **overrides):
        # Init std d^-0.5 (fairseq's scale; 0.02 is that of d = 2500): with no LayerNorm after the combination FFN the
        # outputs start at the init's scale, and the information-flow tests below need outputs of order 1.
        kwargs = dict(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            activation_dropout=0.0, pad_token_id=self.pad, bos_token_id=self.bos, eos_token_id=self.eos,
            sep_token_id=self.sep, initializer_range=self.hidden_size**-0.5,
        )
        return TwoTowerClozeConfig(**{**kwargs, **overrides})

    def inputs(self, seed=0):
        """`<s> x <s>` rows; row 0 is right-padded by 5. Labels: every real token except the boundaries."""
        generator = torch.Generator().manual_seed(seed)
        input_ids = torch.randint(5, self.vocab_size, (self.batch_size, self.seq_length), generator=generator)
        attention_mask = torch.ones_like(input_ids)
        attention_mask[0, -5:] = 0
        input_ids[:, 0] = self.bos
        input_ids[0, -6], input_ids[0, -5:] = self.eos, self.pad
        input_ids[1:, -1] = self.eos
        labels = input_ids.masked_fill((attention_mask == 0) | (input_ids == self.bos) | (input_ids == self.eos), -100)
        return dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)


tester = ClozeModelTester()


def model_with_seed(cls, seed=0, **overrides):
    torch.manual_seed(seed)
    return cls(tester.config(**overrides)).eval()


def peak(values):
    return values.max().item() if values.numel() else 0.0


def low(values):
    return values.min().item() if values.numel() else float("inf")


def change_token(input_ids, row, position):
    changed = input_ids.clone()
    changed[row, position] = 5 + (changed[row, position] - 5 + 17) % (tester.vocab_size - 5)
    return changed


def test_bare_model_shapes_tower_states_and_hidden_states():
    model = model_with_seed(TwoTowerClozeModel)
    inputs = tester.inputs()
    out = model(inputs["input_ids"], attention_mask=inputs["attention_mask"], output_tower_states=True,
                output_hidden_states=True)
    shape = (tester.batch_size, tester.seq_length, tester.hidden_size)
    assert out.last_hidden_state.shape == out.forward_states.shape == out.backward_states.shape == shape
    assert len(out.hidden_states) == 3 and out.hidden_states[0].shape == (*shape[:2], 2 * tester.hidden_size)
    # The last block's states are the towers' outputs before their final LayerNorm.
    forward_last, backward_last = out.hidden_states[-1].split(tester.hidden_size, dim=-1)
    torch.testing.assert_close(model.forward_tower.final_layer_norm(forward_last), out.forward_states)
    torch.testing.assert_close(model.backward_tower.final_layer_norm(backward_last), out.backward_states)
    plain = model(inputs["input_ids"], attention_mask=inputs["attention_mask"])
    assert plain.forward_states is None and plain.hidden_states is None
    as_tuple = model(inputs["input_ids"], attention_mask=inputs["attention_mask"], return_dict=False)
    torch.testing.assert_close(as_tuple[0], out.last_hidden_state)


@pytest.mark.parametrize(
    "head, kwargs, field, shape",
    [
        (TwoTowerClozeForSequenceClassification, dict(labels=torch.tensor([0, 2, 1])), "logits", (3, 3)),
        (TwoTowerClozeForTokenClassification, dict(labels=torch.zeros(3, 16, dtype=torch.long)), "logits", (3, 16, 3)),
        (TwoTowerClozeForQuestionAnswering,
         dict(start_positions=torch.tensor([1, 2, 3]), end_positions=torch.tensor([2, 3, 4])), "start_logits", (3, 16)),
    ],
)
def test_task_heads_shapes_and_losses(head, kwargs, field, shape):
    model = model_with_seed(head, num_labels=3)
    inputs = tester.inputs()
    out = model(inputs["input_ids"], attention_mask=inputs["attention_mask"], **kwargs)
    assert getattr(out, field).shape == shape
    assert out.loss is not None and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if n.startswith("cloze.combination."))


def test_pretraining_logits_only_at_labelled_positions_and_tied_projection():
    model = model_with_seed(TwoTowerCloze)
    inputs = tester.inputs()
    out = model(**inputs)
    labelled = inputs["labels"] != -100
    assert out.logits.shape == (int(labelled.sum()), tester.vocab_size)
    torch.testing.assert_close(out.cloze_loss, F.cross_entropy(out.logits, inputs["labels"][labelled]))
    assert out.loss is out.cloze_loss and out.bilm_loss is None and out.forward_logits is None
    assert model.lm_head.weight is model.cloze.embeddings.word_embeddings.weight
    # The cloze logits are the pretraining-mask combination outputs projected by the input embeddings.
    hidden = model.cloze(inputs["input_ids"], attention_mask=inputs["attention_mask"],
                         combination_mask="cloze").last_hidden_state
    torch.testing.assert_close(out.logits, hidden[labelled] @ model.cloze.embeddings.word_embeddings.weight.T)
    # Without labels every position is predicted, as a masked LM's head does, and there is no loss; a
    # prediction_mask picks rows instead.
    unlabelled = model(inputs["input_ids"], attention_mask=inputs["attention_mask"])
    assert unlabelled.loss is None and unlabelled.logits.shape == (tester.batch_size, tester.seq_length,
                                                                   tester.vocab_size)
    torch.testing.assert_close(unlabelled.logits[labelled], out.logits)
    picked = model(inputs["input_ids"], attention_mask=inputs["attention_mask"], prediction_mask=labelled)
    torch.testing.assert_close(picked.logits, out.logits)
    assert model(**inputs, return_dict=False)[0] is not None and model(**inputs, return_dict=False)[0].dim() == 0


@pytest.mark.parametrize("query_combination", ["sum", "concat"])
def test_cloze_prediction_never_sees_the_token_it_predicts(query_combination):
    model = model_with_seed(TwoTowerCloze, query_combination=query_combination)
    inputs = tester.inputs()
    input_ids, attention_mask = inputs["input_ids"][1:2], inputs["attention_mask"][1:2]
    everywhere = input_ids.clone()  # labels at every position: logits row i is position i
    with torch.no_grad():
        base = model(input_ids, attention_mask=attention_mask, labels=everywhere).logits
        for position in range(tester.seq_length):
            changed = model(change_token(input_ids, 0, position), attention_mask=attention_mask,
                            labels=everywhere).logits
            torch.testing.assert_close(changed[position], base[position], rtol=0, atol=1e-5)
            others = torch.arange(tester.seq_length) != position
            assert (changed[others] - base[others]).abs().max() > 1e-3


@pytest.mark.parametrize("mode, sees_token", [("none", True), ("curr", True), ("cloze", False)])
def test_finetuning_combination_mask(mode, sees_token):
    model = model_with_seed(TwoTowerClozeModel, finetune_combination_mask=mode)
    inputs = tester.inputs()
    input_ids, attention_mask = inputs["input_ids"][1:2], inputs["attention_mask"][1:2]
    with torch.no_grad():
        base = model(input_ids, attention_mask=attention_mask).last_hidden_state[0]
        for position in (0, 7, tester.seq_length - 1):
            changed = model(change_token(input_ids, 0, position), attention_mask=attention_mask).last_hidden_state[0]
            moved = (changed[position] - base[position]).abs().max()
            assert (moved > 1e-3) if sees_token else (moved < 1e-6)


def test_towers_read_only_their_own_direction():
    model = model_with_seed(TwoTowerClozeModel)
    inputs = tester.inputs()
    input_ids, attention_mask = inputs["input_ids"][1:2], inputs["attention_mask"][1:2]
    with torch.no_grad():
        base = model(input_ids, attention_mask=attention_mask, output_tower_states=True)
        for k in (0, 6, tester.seq_length - 1):
            out = model(change_token(input_ids, 0, k), attention_mask=attention_mask, output_tower_states=True)
            forward_moved = (out.forward_states[0] - base.forward_states[0]).abs().amax(-1)
            backward_moved = (out.backward_states[0] - base.backward_states[0]).abs().amax(-1)
            position = torch.arange(tester.seq_length)
            assert peak(forward_moved[position < k]) < 1e-6 and forward_moved[position >= k].min() > 1e-5
            assert peak(backward_moved[position > k]) < 1e-6 and backward_moved[position <= k].min() > 1e-5


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_gives_no_nan_and_the_unpadded_outputs(side):
    model = model_with_seed(TwoTowerCloze, loss_type="cloze+bilm")
    bare = model.cloze
    generator = torch.Generator().manual_seed(1)
    lengths = [16, 9, 3, 1]
    input_ids = torch.full((len(lengths), 16), tester.pad)
    attention_mask = torch.zeros_like(input_ids)
    rows = [torch.randint(5, tester.vocab_size, (n,), generator=generator) for n in lengths]
    for r, row in enumerate(rows):
        span = slice(0, len(row)) if side == "right" else slice(16 - len(row), 16)
        input_ids[r, span], attention_mask[r, span] = row, 1
    with torch.no_grad():
        for mode in ("none", "curr", "cloze"):
            out = bare(input_ids, attention_mask=attention_mask, combination_mask=mode, output_tower_states=True)
            for name in ("last_hidden_state", "forward_states", "backward_states"):
                assert torch.isfinite(getattr(out, name)).all(), (mode, name)
            for r, row in enumerate(rows):
                alone = bare(row[None], combination_mask=mode, output_tower_states=True)
                real = attention_mask[r].bool()
                for name in ("last_hidden_state", "forward_states", "backward_states"):
                    torch.testing.assert_close(getattr(out, name)[r, real], getattr(alone, name)[0], rtol=1e-4,
                                               atol=1e-5)
        pretraining = model(input_ids, attention_mask=attention_mask,
                            labels=input_ids.masked_fill(attention_mask == 0, -100))
        assert torch.isfinite(pretraining.logits).all() and torch.isfinite(pretraining.loss)


def test_loss_variants_and_their_weighted_sum():
    inputs = tester.inputs()
    labelled = inputs["labels"] != -100
    outputs = {}
    for loss_type in ("cloze", "bilm", "cloze+bilm"):
        outputs[loss_type] = model_with_seed(TwoTowerCloze, loss_type=loss_type)(**inputs)
    cloze, bilm, both = outputs["cloze"], outputs["bilm"], outputs["cloze+bilm"]
    assert bilm.logits is None and bilm.cloze_loss is None and bilm.loss is bilm.bilm_loss
    torch.testing.assert_close(both.cloze_loss, cloze.cloze_loss)
    torch.testing.assert_close(both.bilm_loss, bilm.bilm_loss)
    torch.testing.assert_close(both.loss, cloze.loss + 0.15 * bilm.loss)
    # bilm: the forward tower at i-1 and the backward tower at i+1 each predict token i; the two means averaged.
    model = model_with_seed(TwoTowerCloze, loss_type="bilm")
    states = model.cloze(inputs["input_ids"], attention_mask=inputs["attention_mask"], output_tower_states=True)
    rows, cols = labelled.nonzero(as_tuple=True)  # boundaries are unlabelled, so every target has both neighbours
    embeddings = model.cloze.embeddings.word_embeddings.weight
    forward_logits = states.forward_states[rows, cols - 1] @ embeddings.T
    backward_logits = states.backward_states[rows, cols + 1] @ embeddings.T
    torch.testing.assert_close(bilm.forward_logits, forward_logits)
    torch.testing.assert_close(bilm.backward_logits, backward_logits)
    # Without labels each tower predicts at every position: F_i scores token i + 1, B_i scores token i - 1.
    free = model(inputs["input_ids"], attention_mask=inputs["attention_mask"])
    assert free.forward_logits.shape == free.backward_logits.shape == (*labelled.shape, tester.vocab_size)
    torch.testing.assert_close(free.forward_logits[rows, cols - 1], forward_logits)
    torch.testing.assert_close(free.backward_logits[rows, cols + 1], backward_logits)
    targets = inputs["labels"][rows, cols]
    expected = (F.cross_entropy(forward_logits, targets) + F.cross_entropy(backward_logits, targets)) / 2
    torch.testing.assert_close(bilm.bilm_loss, expected)
    bilm.loss.backward()
    assert model.cloze.combination.attention.q_proj.weight.grad is None  # bilm never runs the combination layer


def test_bilm_towers_never_see_the_token_they_predict():
    model = model_with_seed(TwoTowerCloze, loss_type="bilm")
    inputs = tester.inputs()
    input_ids = inputs["input_ids"][1:2]
    everywhere = input_ids.clone()
    # Row j of forward_logits predicts token j + 1 from F_j; row j of backward_logits predicts token j from B_{j+1}.
    with torch.no_grad():
        base = model(input_ids, labels=everywhere)
        for k in (1, 8, tester.seq_length - 1):
            out = model(change_token(input_ids, 0, k), labels=everywhere)
            forward_moved = (out.forward_logits - base.forward_logits).abs().amax(-1)
            backward_moved = (out.backward_logits - base.backward_logits).abs().amax(-1)
            target = torch.arange(1, tester.seq_length)  # targets of the forward rows
            assert peak(forward_moved[target <= k]) < 1e-6 and low(forward_moved[target > k]) > 1e-5
            target = torch.arange(0, tester.seq_length - 1)  # targets of the backward rows
            assert peak(backward_moved[target >= k]) < 1e-6 and low(backward_moved[target < k]) > 1e-5


@pytest.mark.parametrize("query_combination", ["sum", "concat"])
def test_combination_layer_by_hand_one_query_projection_and_no_final_layer_norm(query_combination):
    """f = h + FFN(LN(h)) with h = Attn(q, [F; B]) and no LayerNorm after it (fairseq); the concat query [F_{i-1};
    B_{i+1}] goes through the attention's own 2d -> d query projection, once."""
    model = model_with_seed(TwoTowerClozeModel, query_combination=query_combination)
    combination, d = model.combination, tester.hidden_size
    assert combination.attention.q_proj.in_features == (2 * d if query_combination == "concat" else d)
    linears = [m for m in combination.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 6  # q, k, v, out, fc1, fc2: no separate projection of the concatenated query
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in combination.modules()) == 3  # forward, backward, FFN pre-LN
    inputs = tester.inputs()
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    with torch.no_grad():
        towers = model.run_towers(ids, mask)
        forward = combination.forward_layer_norm(towers.forward_states) * mask[..., None]
        backward = combination.backward_layer_norm(towers.backward_states) * mask[..., None]
        previous_forward = torch.cat([torch.zeros_like(forward[:, :1]), forward[:, :-1]], 1)
        next_backward = torch.cat([backward[:, 1:], torch.zeros_like(backward[:, :1])], 1)
        if query_combination == "concat":
            query = torch.cat([previous_forward, next_backward], -1)
        else:
            query = previous_forward + next_backward
        visible = additive_mask(combination_visibility(mask.bool(), "cloze"), query.dtype)
        keys = torch.cat([combination.forward_layer_norm(towers.forward_states),
                          combination.backward_layer_norm(towers.backward_states)], 1)
        h = combination.attention(query, keys, visible)
        ffn = combination.ffn
        expected = h + ffn.fc2(F.relu(ffn.fc1(ffn.layer_norm(h))))
        out = model(ids, attention_mask=mask, combination_mask="cloze").last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(out[real], expected[real], rtol=1e-5, atol=1e-5)
    # Unnormalised: a LayerNorm after the FFN would give every row mean 0 and variance 1 (up to its affine, 1 and 0).
    assert out[real].std(-1).sub(1).abs().max() > 0.05


def test_concat_query_projection_is_trained():
    model = model_with_seed(TwoTowerCloze, query_combination="concat")
    model(**tester.inputs()).loss.backward()
    assert model.cloze.combination.attention.q_proj.weight.grad.abs().sum() > 0


def test_adaptive_softmax_output():
    model = model_with_seed(TwoTowerCloze, use_adaptive_softmax=True, adaptive_softmax_cutoff=[10, 40])
    assert model.lm_head is None and model.adaptive_softmax.cutoffs == [10, 40, tester.vocab_size]
    inputs = tester.inputs()
    out = model(**inputs)
    targets = inputs["labels"][inputs["labels"] != -100]
    # Logits are log-probabilities; the loss is their mean negative log-likelihood at the targets.
    torch.testing.assert_close(out.logits.logsumexp(-1), torch.zeros(len(targets)), rtol=0, atol=1e-5)
    torch.testing.assert_close(out.loss, -out.logits.gather(1, targets[:, None]).mean())
    out.loss.backward()
    assert TwoTowerClozeConfig(vocab_size=700, use_adaptive_softmax=True).adaptive_softmax_cutoff == [60, 220]


def test_sequence_classifier_reads_boundaries_and_separator_scaled_and_starts_at_zero():
    model = model_with_seed(TwoTowerClozeForSequenceClassification, num_labels=2)
    assert model.classifier.weight.abs().sum() == 0 and model.classifier.bias.abs().sum() == 0
    inputs = tester.inputs()
    input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
    input_ids[2, 7] = tester.sep  # row 2 is a pair: <s> a <sep> b <s>
    out = model(input_ids, attention_mask=attention_mask)
    assert out.logits.abs().sum() == 0
    first, last, separator = boundary_positions(input_ids, attention_mask.bool(), None, tester.sep)
    assert first.tolist() == [0, 0, 0] and last.tolist() == [10, 15, 15] and separator.tolist() == [-1, -1, 7]
    # Pairs from BERT-style tokenizers: the separator is the last token of segment 0.
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[1, 5:16] = 1
    assert boundary_positions(None, attention_mask.bool(), token_type_ids, None)[2].tolist() == [-1, 4, -1]

    with torch.no_grad():
        model.classifier.weight.normal_()
        model.classifier.bias.normal_()
    hidden = model.cloze(input_ids, attention_mask=attention_mask).last_hidden_state
    zero = torch.zeros(tester.hidden_size)
    features = torch.stack([
        torch.cat([hidden[0, 0], hidden[0, 10], zero]),
        torch.cat([hidden[1, 0], hidden[1, 15], zero]),
        torch.cat([hidden[2, 0], hidden[2, 15], hidden[2, 7]]),
    ])
    expected = (16 * features) @ model.classifier.weight.T + model.classifier.bias
    torch.testing.assert_close(model(input_ids, attention_mask=attention_mask).logits, expected)


def test_regression_head_uses_mse():
    model = model_with_seed(TwoTowerClozeForSequenceClassification, num_labels=1)
    with torch.no_grad():
        model.classifier.weight.normal_(std=0.01)
    inputs = tester.inputs()
    labels = torch.tensor([0.5, -1.0, 2.0])
    out = model(inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(-1), labels))


def test_attention_implementations_agree():
    eager = model_with_seed(TwoTowerCloze)
    eager.set_attn_implementation("eager")
    sdpa = model_with_seed(TwoTowerCloze)
    sdpa.set_attn_implementation("sdpa")
    inputs = tester.inputs()
    torch.testing.assert_close(eager(**inputs).logits, sdpa(**inputs).logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "field, value, options",
    [
        ("loss_type", "mlm", "'cloze', 'bilm', 'cloze\\+bilm'"),
        ("query_combination", "mean", "'sum', 'concat'"),
        ("finetune_combination_mask", "all", "'none', 'curr', 'cloze'"),
    ],
)
def test_unknown_choices_raise_naming_the_options(field, value, options):
    with pytest.raises(ValueError, match=f"{field}='{value}'.*{options}"):
        tester.config(**{field: value})


def test_masked_lm_view_gives_every_positions_cloze_logits_and_training_keeps_the_sparse_ones():
    pretraining, masked_lm = model_with_seed(TwoTowerCloze), model_with_seed(TwoTowerClozeForMaskedLM)
    inputs = tester.inputs()
    real = inputs["attention_mask"].bool()
    full = masked_lm(inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    assert full.shape == (tester.batch_size, tester.seq_length, tester.vocab_size)
    sparse = pretraining(inputs["input_ids"], attention_mask=inputs["attention_mask"], prediction_mask=real).logits
    torch.testing.assert_close(full[real], sparse)
    torch.testing.assert_close(pretraining(inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits, full)
    trained = masked_lm(**inputs)
    assert trained.logits.shape == (int((inputs["labels"] != -100).sum()), tester.vocab_size)
    torch.testing.assert_close(trained.loss, pretraining(**inputs).loss)


def test_gradient_checkpointing_gives_the_same_gradients():
    def gradients(checkpointing):
        model = model_with_seed(TwoTowerCloze, hidden_dropout_prob=0.1).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        torch.manual_seed(1)
        model(**tester.inputs()).loss.backward()
        return [p.grad for p in model.parameters()]

    for plain, checkpointed in zip(gradients(False), gradients(True)):
        torch.testing.assert_close(plain, checkpointed)


def test_unsupported_attention_outputs_and_flex_attention_are_refused_clearly():
    model = model_with_seed(TwoTowerClozeModel)
    with pytest.raises(ValueError, match="does not return attentions"):
        model(torch.ones(1, 5, dtype=torch.long), output_attentions=True)
    with pytest.raises(ValueError, match="does not return attentions"):
        model_with_seed(TwoTowerCloze)(torch.ones(1, 5, dtype=torch.long), output_attentions=True)
    with pytest.raises(ValueError, match="flex_attention.*'sdpa'"):
        TwoTowerClozeModel._from_config(tester.config(), attn_implementation="flex_attention")


def test_bad_inputs_get_clear_errors():
    model = model_with_seed(TwoTowerClozeModel)
    with pytest.raises(ValueError, match="64 positions.*truncate"):
        model(torch.ones(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="combination_mask='full'"):
        model(torch.ones(1, 5, dtype=torch.long), combination_mask="full")
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        tester.config(num_attention_heads=5)


def test_every_auto_class_is_registered_locally():
    config = tester.config()
    assert set(config.auto_map) == set(AUTO_MAP)
    assert isinstance(AutoModel.from_config(config), TwoTowerClozeModel)
    assert isinstance(AutoModelForPreTraining.from_config(config), TwoTowerCloze)
    assert isinstance(AutoModelForSequenceClassification.from_config(config), TwoTowerClozeForSequenceClassification)


def test_save_load_round_trip_in_fresh_process_without_this_repository(tmp_path):
    model = model_with_seed(TwoTowerCloze, query_combination="concat")
    model.save_pretrained(tmp_path)
    assert ({"config.json", "model.safetensors", "modeling_cloze.py", "configuration_cloze.py"}
            <= {p.name for p in tmp_path.iterdir()})
    inputs = tester.inputs()
    with torch.no_grad():
        expected = model(**inputs)
        expected_hidden = model.cloze(inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state
    torch.save(inputs, tmp_path / "inputs.pt")
    out = run_isolated(f"""
        import json, torch
        from transformers import AutoModel, AutoModelForPreTraining, AutoModelForSequenceClassification
        path = {str(tmp_path)!r}
        inputs = torch.load(path + "/inputs.pt")
        result = {{}}
        with torch.no_grad():
            pre = AutoModelForPreTraining.from_pretrained(path, trust_remote_code=True).eval()
            out = pre(**inputs)
            result["loss"], result["logits"] = out.loss.item(), out.logits.tolist()
            result["tied"] = pre.lm_head.weight is pre.cloze.embeddings.word_embeddings.weight
            bare = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
            result["hidden"] = bare(inputs["input_ids"],
                                    attention_mask=inputs["attention_mask"]).last_hidden_state.tolist()
            classifier = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True,
                                                                            num_labels=3).eval()
            result["classifier_logits"] = classifier(inputs["input_ids"],
                                                     attention_mask=inputs["attention_mask"]).logits.tolist()
            result["remote"] = [type(m).__module__.startswith("transformers_modules") for m in (pre, bare, classifier)]
        print(json.dumps(result))
    """)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["remote"] == [True, True, True] and result["tied"]
    assert result["loss"] == pytest.approx(expected.loss.item(), rel=1e-5)
    torch.testing.assert_close(torch.tensor(result["logits"]), expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(result["hidden"]), expected_hidden, rtol=1e-5, atol=1e-5)
    # The new classifier projection is zero-initialised on the load path too.
    assert torch.tensor(result["classifier_logits"]).abs().max() == 0


CHARACTER_CONFIG = dict(input_representation="char_cnn", use_adaptive_softmax=True, adaptive_softmax_cutoff=[10, 40],
                        character_embedding_size=8, character_filters=[[1, 8], [2, 8], [3, 16]], max_word_characters=6)
WORDS = ["[PAD]", "<s>", "</s>", "<sep>", "[UNK]", "the", "The", "é", "river", "riverside"]


def character_model(cls=TwoTowerCloze, seed=0):
    model = model_with_seed(cls, seed, **CHARACTER_CONFIG)
    (model.cloze if hasattr(model, "cloze") else model).set_word_vocabulary(WORDS + [f"w{i}" for i in range(89)])
    return model


def test_character_cnn_spells_words_and_embeds_them_by_hand():
    model = character_model(TwoTowerClozeModel)
    config, cnn = model.config, model.embeddings.character_cnn
    assert model.embeddings.word_embeddings is None and model.get_input_embeddings() is cnn
    assert not config.tie_word_embeddings and cnn.word_characters.dtype == torch.int16
    table = cnn.word_characters
    assert table.shape == (tester.vocab_size, 6)
    assert table[5].tolist() == [ord("t") + 1, ord("h") + 1, ord("e") + 1, 0, 0, 0]
    assert table[7].tolist()[:3] == [0xC3 + 1, 0xA9 + 1, 0]  # "é" is two UTF-8 bytes
    assert table[9].tolist() == [b + 1 for b in b"rivers"]  # cut at max_word_characters
    assert cnn.set_word_vocabulary(["riverside", "river"]) == 1 and table[2].abs().sum() == 0  # the count of cut words
    cnn.set_word_vocabulary(WORDS)
    assert [len(c.weight) for c in cnn.convolutions] == [8, 8, 16] and cnn.projection.in_features == 32
    torch.testing.assert_close(cnn.highways[0].gate.bias, torch.ones(32))  # the highway starts carrying its input

    ids = torch.tensor([[5, 6, 8, 9]])
    with torch.no_grad():
        vectors = cnn(ids)
        characters = cnn.character_embeddings(table[ids[0]].long()).transpose(1, 2)  # (4 words, 8, 6 bytes)
        pooled = torch.cat([F.relu(c(characters).max(-1).values) for c in cnn.convolutions], -1)
        gate = torch.sigmoid(cnn.highways[0].gate(pooled))
        highway = gate * pooled + (1 - gate) * F.relu(cnn.highways[0].transform(pooled))
        torch.testing.assert_close(vectors[0], cnn.projection(highway))
    assert vectors.shape == (1, 4, tester.hidden_size) and (vectors[0, 0] - vectors[0, 1]).abs().max() > 1e-4  # the/The
    # A word's vector depends on its spelling only: respell word 6 as "the" and it becomes word 5.
    cnn.set_word_vocabulary(WORDS[:6] + ["the"])
    with torch.no_grad():
        torch.testing.assert_close(cnn(torch.tensor([[6]])), cnn(torch.tensor([[5]])))
    inputs = tester.inputs()
    out = model(inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state
    assert out.shape == (tester.batch_size, tester.seq_length, tester.hidden_size)


def test_character_cnn_pretraining_uses_the_adaptive_softmax_and_trains_every_part():
    model = character_model().train()
    assert model.lm_head is None and model.adaptive_softmax.cutoffs == [10, 40, tester.vocab_size]
    model(**tester.inputs()).loss.backward()
    cnn = model.cloze.embeddings.character_cnn
    for part in (cnn.character_embeddings, cnn.convolutions[2], cnn.highways[0].gate, cnn.projection):
        assert part.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="no embedding matrix"):
        model.cloze.set_input_embeddings(torch.nn.Embedding(3, 3))
    with pytest.raises(ValueError, match="widest character filter"):
        tester.config(**{**CHARACTER_CONFIG, "max_word_characters": 2})
    with pytest.raises(ValueError, match="input_representation='bytes'"):
        tester.config(input_representation="bytes")


@pytest.mark.parametrize("size, millions", [("cnn_base", 177), ("cnn_large", 330)])
def test_cnn_presets_have_the_papers_parameter_counts(size, millions):
    from encoder_zoo.training.recipes.cloze import CLOZE_SIZES

    config = TwoTowerClozeConfig(vocab_size=700_000, **CLOZE_SIZES[size])
    assert config.character_filters == [[1, 128], [2, 256], [3, 384], [4, 512], [5, 512], [6, 512]]
    assert config.adaptive_softmax_cutoff == [60_000, 220_000] and config.character_embedding_size == 128
    with torch.device("meta"):
        model = TwoTowerCloze(config)
    # Table 1 counts every parameter but the adaptive softmax.
    count = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("adaptive_softmax."))
    assert abs(count / 1e6 - millions) / millions < 0.01, count


def test_character_model_round_trip_in_fresh_process_keeps_the_word_table(tmp_path):
    model = character_model()
    model.save_pretrained(tmp_path)
    inputs = tester.inputs()
    with torch.no_grad():
        expected = model.eval()(**inputs)
    torch.save(inputs, tmp_path / "inputs.pt")
    out = run_isolated(f"""
        import json, torch
        from transformers import AutoModel, AutoModelForPreTraining
        path = {str(tmp_path)!r}
        inputs = torch.load(path + "/inputs.pt")
        with torch.no_grad():
            pre = AutoModelForPreTraining.from_pretrained(path, trust_remote_code=True).eval()
            out = pre(**inputs)
            bare = AutoModel.from_pretrained(path, trust_remote_code=True)
        table = bare.embeddings.character_cnn.word_characters
        print(json.dumps({{"loss": out.loss.item(), "logits": out.logits.tolist(), "table": table.tolist(),
                          "dtype": str(table.dtype),
                          "remote": type(pre).__module__.startswith("transformers_modules")}}))
    """)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["remote"] and result["dtype"] == "torch.int16"
    assert result["table"] == model.cloze.embeddings.character_cnn.word_characters.tolist()
    assert result["loss"] == pytest.approx(expected.loss.item(), rel=1e-5)
    torch.testing.assert_close(torch.tensor(result["logits"]), expected.logits, rtol=1e-5, atol=1e-5)


def test_short_training_on_wikipedia_reduces_the_cloze_loss():
    from transformers import AutoTokenizer

    from encoder_zoo.training.data.resources import minilm_path, resource_path

    summaries = json.loads(resource_path("wikipedia_summaries").read_text())
    texts = [entry["extract"] for entry in list(summaries.values())[:200] if entry.get("extract")]
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())

    def batch(chunk):
        encoded = tokenizer(chunk, truncation=True, max_length=32, padding=True, return_tensors="pt",
                            return_special_tokens_mask=True)
        labels = encoded["input_ids"].masked_fill(encoded.pop("special_tokens_mask").bool(), -100)
        return dict(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"], labels=labels)

    held_out = batch(texts[-32:])
    train = [batch(texts[i:i + 8]) for i in range(0, 80, 8)]
    torch.manual_seed(0)
    config = TwoTowerClozeConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id, sep_token_id=tokenizer.sep_token_id, initializer_range=32**-0.5,
    )  # init at fairseq's scale, d^-0.5: at d = 32, 0.02 starts the unnormalised outputs, hence the logits, near 0
    model = TwoTowerCloze(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def held_out_loss():
        model.eval()
        with torch.no_grad():
            loss = model(**held_out).loss.item()
        model.train()
        return loss

    # One thread: these small matmuls gain little from two, and OpenMP slows down tenfold when the other core is busy.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        before = held_out_loss()
        for step in range(60):
            loss = model(**train[step % len(train)]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        after = held_out_loss()
    finally:
        torch.set_num_threads(threads)
    assert before > 9.5  # about ln(30522): nothing learnt yet
    assert after < before - 1.5, (before, after)  # about 2.3 nats in practice


@pytest.mark.parametrize("auto_name", sorted(set(AUTO_MAP) - {"AutoConfig"}))
def test_character_cnn_model_resizes_its_vocabulary_in_every_auto_class(auto_name, tmp_path):
    """resize_token_embeddings grows the word -> bytes table (new words spelled when given, else all padding) and the
    adaptive softmax's last band; old spellings and the CNN's weights stay; the export reloads at the new size."""
    cls = models.get_class("cloze", auto_name)
    model = character_model(cls)
    base = model.cloze if hasattr(model, "cloze") else model
    cnn = base.embeddings.character_cnn
    old_table = cnn.word_characters.clone()
    grown = model.resize_token_embeddings(tester.vocab_size + 3, pad_to_multiple_of=8,
                                          new_words=["riverbank", "Zürich"])
    size = 104  # 99 + 3, padded to a multiple of 8
    assert (grown is cnn
            and cnn.num_embeddings == size == model.config.vocab_size == model.config.get_text_config().vocab_size)
    assert torch.equal(cnn.word_characters[: tester.vocab_size], old_table)
    assert (cnn.word_characters[99].tolist() == [b + 1 for b in b"riverb"]
            and cnn.word_characters[100, 1] == ord("\xc3") + 1)
    assert cnn.word_characters[101:].abs().sum() == 0  # no spelling given: all padding bytes
    softmax = getattr(model, "adaptive_softmax", None)
    if softmax is not None:
        assert (softmax.n_classes == size and softmax.cutoffs == [10, 40, size]
                and softmax.tail[-1][1].out_features == size - 40)
    inputs = tester.inputs()
    inputs["input_ids"][:, 3] = torch.tensor([99, 100, 103])
    kwargs = {"labels": inputs["labels"]} if softmax is not None else {}
    if auto_name == "AutoModelForSequenceClassification":
        kwargs = {"labels": torch.tensor([0, 1, 0])}
    output = model.train()(inputs["input_ids"], attention_mask=inputs["attention_mask"], **kwargs)
    if softmax is not None:
        inputs["labels"][:, 3] = torch.tensor([99, 100, 103])  # the new words can be predicted too
        output = model(**inputs)
    value = output.loss if output.get("loss") is not None else output[0].float().sum()
    assert torch.isfinite(value)
    value.backward()
    model.save_pretrained(tmp_path)
    reloaded = cls.from_pretrained(tmp_path)
    reloaded_base = reloaded.cloze if hasattr(reloaded, "cloze") else reloaded
    assert torch.equal(reloaded_base.embeddings.character_cnn.word_characters, cnn.word_characters)


def test_adaptive_softmax_resizes_with_word_embeddings_and_refuses_to_empty_its_last_band():
    model = model_with_seed(TwoTowerCloze, use_adaptive_softmax=True, adaptive_softmax_cutoff=[10, 40])
    model.resize_token_embeddings(tester.vocab_size + 4)
    assert model.cloze.embeddings.word_embeddings.num_embeddings == model.adaptive_softmax.n_classes == 103
    inputs = tester.inputs()
    inputs["labels"][:, 2] = 102
    assert torch.isfinite(model(**inputs).loss)
    model.resize_token_embeddings(60)
    assert model.adaptive_softmax.n_classes == 60 and model.config.vocab_size == 60
    with pytest.raises(ValueError, match="last band starts at word 40"):
        model.resize_token_embeddings(40)
    with pytest.raises(ValueError, match="new_words spells new rows of a char_cnn model"):
        model.resize_token_embeddings(70, new_words=["a"])
