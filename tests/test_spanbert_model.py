"""SpanBERT model tests on tiny configs (transformers' model-tester style)."""

import json

import pytest
import torch
from helpers import run_isolated
from transformers import AutoModel, AutoModelForPreTraining

from encoder_zoo import models  # (registers the families)
from encoder_zoo.models.spanbert.configuration_spanbert import AUTO_MAP, SpanBertConfig
from encoder_zoo.models.spanbert.modeling_spanbert import (
    SpanBertForMaskedLM,
    SpanBertForPreTraining,
    SpanBertForQuestionAnswering,
    SpanBertForSequenceClassification,
    SpanBertForTokenClassification,
    SpanBertModel,
)


class SpanBertModelTester:
    batch_size, seq_length, vocab_size, hidden_size = 3, 24, 99, 32

    def config(self, **overrides):
        kwargs = dict(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            sbo_position_embedding_size=12, max_span_targets=6,
        )
        return SpanBertConfig(**{**kwargs, **overrides})

    def inputs(self, seed=0):
        generator = torch.Generator().manual_seed(seed)
        input_ids = torch.randint(5, self.vocab_size, (self.batch_size, self.seq_length), generator=generator)
        attention_mask = torch.ones_like(input_ids)
        attention_mask[0, -5:] = 0
        # One merged span per row at positions 5..8 with outside boundaries 4 and 9, and a lone masked token at 15.
        labels = torch.full_like(input_ids, -100)
        labels[:, 5:9] = input_ids[:, 5:9]
        labels[:, 15] = input_ids[:, 15]
        span_left = torch.full_like(input_ids, -1)
        span_right = torch.full_like(input_ids, -1)
        span_left[:, 5:9], span_right[:, 5:9] = 4, 9
        span_left[:, 15], span_right[:, 15] = 14, 16
        return dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels, span_left=span_left,
                    span_right=span_right)


tester = SpanBertModelTester()


def test_bare_model_shapes_and_hidden_states():
    model = SpanBertModel(tester.config(attn_implementation="eager")).eval()  # SDPA returns no attention maps
    inputs = tester.inputs()
    out = model(inputs["input_ids"], attention_mask=inputs["attention_mask"], output_hidden_states=True,
                output_attentions=True)
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state)
    assert out.last_hidden_state.shape == (tester.batch_size, tester.seq_length, tester.hidden_size)
    assert len(out.hidden_states) == 3 and len(out.attentions) == 2
    assert out.attentions[0].shape == (tester.batch_size, 4, tester.seq_length, tester.seq_length)


def test_pretraining_logits_only_at_targets_and_loss_is_weighted_sum():
    config = tester.config(mlm_loss_weight=0.5, sbo_loss_weight=2.0)
    model = SpanBertForPreTraining(config).eval()
    inputs = tester.inputs()
    out = model(**inputs)
    n_targets = int((inputs["labels"] != -100).sum())
    n_sbo = int((inputs["span_left"] >= 0).sum())
    assert out.mlm_logits.shape == (n_targets, tester.vocab_size)
    assert out.sbo_logits.shape == (n_sbo, tester.vocab_size)
    torch.testing.assert_close(out.loss, 0.5 * out.mlm_loss + 2.0 * out.sbo_loss)
    # The sparse MLM loss equals the dense cross-entropy of transformers' convention.
    dense = SpanBertForMaskedLM(config).eval()
    dense.load_state_dict(model.state_dict(), strict=False)
    dense_out = dense(inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=inputs["labels"])
    torch.testing.assert_close(out.mlm_loss, dense_out.loss)


def test_sbo_equations_match_a_manual_computation():
    model = SpanBertForPreTraining(tester.config()).eval()
    inputs = tester.inputs()
    out = model(**inputs, output_hidden_states=True)
    hidden = out.hidden_states[-1]
    sbo = model.sbo
    # Row 1, position 7: boundaries 4 and 9, relative position 7 - 4 - 1 = 2 (p_3 in the paper's 1-based notation).
    h0 = torch.cat([hidden[1, 4], hidden[1, 9], sbo.position_embeddings.weight[2]])
    linear1, act1, norm1, linear2, act2, norm2 = sbo.mlp
    h1 = norm1(act1(linear1(h0)))
    y = norm2(act2(linear2(h1)))
    expected = y @ model.spanbert.embeddings.word_embeddings.weight.T + sbo.bias
    row = ((inputs["span_left"] >= 0).nonzero().tolist()).index([1, 7])
    torch.testing.assert_close(out.sbo_logits[row], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("nsp", [False, True], ids=["spanbert", "with-nsp"])
def test_last_layer_runs_its_feed_forward_only_where_a_head_reads_and_changes_nothing(nsp):
    """Training runs the last layer's feed-forward block at masked tokens, SBO boundaries and (NSP) [CLS] only; the
    full encoder (taken when hidden states are asked for) gives the same outputs and gradients."""
    torch.manual_seed(0)
    model = SpanBertForPreTraining(tester.config(use_next_sentence_prediction=nsp)).train()  # no dropout: same draws
    inputs = tester.inputs()
    if nsp:
        inputs["next_sentence_label"] = torch.tensor([0, 1, 0])
    rows_seen = []
    hook = model.spanbert.encoder.layer[-1].intermediate.register_forward_pre_hook(
        lambda module, args: rows_seen.append(args[0].shape[:-1].numel()))

    def run(**extra):
        out = model(**inputs, **extra)
        out.loss.backward()
        gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        return out, gradients

    fast, fast_gradients = run()
    full, full_gradients = run(output_hidden_states=True)
    hook.remove()
    read = (inputs["labels"] != -100).clone()
    targets = inputs["span_left"] >= 0
    read[targets.nonzero()[:, 0], inputs["span_left"][targets]] = True
    read[targets.nonzero()[:, 0], inputs["span_right"][targets]] = True
    if nsp:
        read[:, 0] = True
    assert rows_seen == [int(read.sum()), tester.batch_size * tester.seq_length]
    for name in ("loss", "mlm_logits", "sbo_logits", *(("nsp_logits",) if nsp else ())):
        torch.testing.assert_close(fast[name], full[name], rtol=0, atol=1e-6, msg=name)
    assert fast_gradients.keys() == full_gradients.keys()
    for name in full_gradients:
        torch.testing.assert_close(fast_gradients[name], full_gradients[name], rtol=1e-5, atol=1e-7, msg=name)


def test_sbo_prediction_depends_only_on_boundaries_and_relative_position():
    model = SpanBertForPreTraining(tester.config()).eval()
    inputs = tester.inputs()
    base = model(**inputs)
    hidden = model.spanbert(inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state
    # Perturb the encoder's states everywhere except the two boundaries of row 0's span (4 and 9).
    perturbed = hidden.clone()
    keep = torch.zeros_like(perturbed, dtype=torch.bool)
    keep[0, [4, 9]] = True
    perturbed = torch.where(keep, hidden, hidden + torch.randn_like(hidden))
    rows, cols = (inputs["span_left"] >= 0).nonzero(as_tuple=True)
    left, right = inputs["span_left"][rows, cols], inputs["span_right"][rows, cols]
    logits = model.sbo(perturbed[rows, left], perturbed[rows, right], cols - left - 1)
    in_row0_span = (rows == 0) & (cols >= 5) & (cols <= 8)
    torch.testing.assert_close(logits[in_row0_span], base.sbo_logits[in_row0_span])
    assert not torch.allclose(logits[~in_row0_span], base.sbo_logits[~in_row0_span])
    # Different relative positions give different predictions from the same boundaries.
    assert not torch.allclose(base.sbo_logits[in_row0_span][0], base.sbo_logits[in_row0_span][1])


def test_decoders_are_tied_to_input_embeddings_with_their_own_biases():
    model = SpanBertForPreTraining(tester.config())
    embeddings = model.spanbert.embeddings.word_embeddings.weight
    assert model.sbo.decoder.weight is embeddings
    assert model.cls.predictions.decoder.weight is embeddings
    assert model.sbo.bias is not model.cls.predictions.bias


@pytest.mark.parametrize("head", [SpanBertForPreTraining, SpanBertForMaskedLM])
def test_resize_token_embeddings_grows_every_decoder_and_bias_and_keeps_the_old_logits(head):
    torch.manual_seed(0)
    model = head(tester.config()).eval()
    inputs = tester.inputs()
    if head is SpanBertForMaskedLM:
        inputs = {k: v for k, v in inputs.items() if not k.startswith("span_")}
    before = model(**inputs)
    model.resize_token_embeddings(tester.vocab_size + 5)
    after = model(**inputs)
    embeddings = model.spanbert.embeddings.word_embeddings.weight
    for name in ("mlm_logits", "sbo_logits", "logits"):
        if before.get(name) is not None:
            assert after[name].shape[-1] == tester.vocab_size + 5
            torch.testing.assert_close(after[name][..., : tester.vocab_size], before[name])
    for decoder in [model.cls.predictions.decoder, *([model.sbo.decoder] if head is SpanBertForPreTraining else [])]:
        assert decoder.weight is embeddings and decoder.bias.shape == (tester.vocab_size + 5,)
    if head is SpanBertForPreTraining:
        assert model.sbo.decoder.bias is model.sbo.bias
    assert torch.isfinite(after.loss)


def test_bert_baseline_has_no_sbo_head_and_same_encoder():
    model = SpanBertForPreTraining(tester.config(use_span_boundary_objective=False)).eval()
    assert model.sbo is None
    inputs = tester.inputs()
    out = model(**inputs)
    assert out.sbo_loss is None and out.sbo_logits is None
    torch.testing.assert_close(out.loss, out.mlm_loss)
    assert not any(name.startswith("sbo.") for name in model.state_dict())


def test_batch_without_sbo_targets_has_zero_sbo_loss():
    model = SpanBertForPreTraining(tester.config()).eval()
    inputs = tester.inputs()
    inputs["span_left"].fill_(-1)
    inputs["span_right"].fill_(-1)
    out = model(**inputs)
    assert out.sbo_loss.item() == 0.0 and torch.isfinite(out.loss)


def test_sbo_loss_is_the_summed_loss_over_targets_plus_one_as_the_authors_code_or_the_mean():
    """The authors' `span_bert_loss` divides the summed SBO cross-entropy by (number of targets + 1): 5 targets here,
    so the default weighs the mean 5/6; `sbo_loss_normalization="mean"` is the plain mean."""
    model = SpanBertForPreTraining(tester.config()).eval()
    inputs = tester.inputs()
    inputs["span_left"][1:] = -1  # one row of SBO targets: positions 5..8 and 15
    inputs["span_right"][1:] = -1
    out = model(**inputs)
    targets = inputs["input_ids"][0, [5, 6, 7, 8, 15]]
    by_hand = sum(-torch.log_softmax(out.sbo_logits[i].float(), -1)[t] for i, t in enumerate(targets.tolist()))
    torch.testing.assert_close(out.sbo_loss, by_hand / 6)  # 5 targets + 1
    torch.testing.assert_close(out.loss, out.mlm_loss + by_hand / 6)
    model.config.sbo_loss_normalization = "mean"
    torch.testing.assert_close(model(**inputs).sbo_loss, by_hand / 5)
    with pytest.raises(Exception, match="sbo_loss_normalization"):
        tester.config(sbo_loss_normalization="sum")


def test_sbo_targets_past_max_span_targets_are_dropped_not_clamped():
    """A 9-token span with max_span_targets=6: the SBO trains its first 6 tokens only (the authors' code), never
    the last 3 at the clamped position embedding p_6."""
    model = SpanBertForPreTraining(tester.config()).eval()
    inputs = tester.inputs()
    inputs["labels"][:, 3:12] = inputs["input_ids"][:, 3:12]
    inputs["span_left"][:, 3:12], inputs["span_right"][:, 3:12] = 2, 12
    out = model(**inputs)
    kept = {key: value.clone() for key, value in inputs.items()}
    kept["span_left"][:, 9:12] = kept["span_right"][:, 9:12] = -1
    reference = model(**kept)
    assert out.sbo_logits.shape[0] == int((kept["span_left"] >= 0).sum()) == tester.batch_size * (6 + 1)
    torch.testing.assert_close(out.sbo_loss, reference.sbo_loss)
    torch.testing.assert_close(out.mlm_loss, reference.mlm_loss)  # MLM still predicts all nine


@pytest.mark.parametrize(
    "head, kwargs, field, shape",
    [
        (SpanBertForSequenceClassification, dict(labels=torch.tensor([0, 2, 1])), "logits", (3, 3)),
        (SpanBertForTokenClassification, dict(labels=torch.zeros(3, 24, dtype=torch.long)), "logits", (3, 24, 3)),
        (SpanBertForQuestionAnswering,
         dict(start_positions=torch.tensor([1, 2, 3]), end_positions=torch.tensor([2, 3, 4])), "start_logits", (3, 24)),
        (SpanBertForMaskedLM, dict(labels=torch.full((3, 24), -100).index_fill_(1, torch.tensor([3]), 7)), "logits",
         (3, 24, 99)),
    ],
)
def test_task_heads_shapes_and_losses(head, kwargs, field, shape):
    model = head(tester.config(num_labels=3)).eval()
    inputs = tester.inputs()
    out = model(inputs["input_ids"], attention_mask=inputs["attention_mask"], **kwargs)
    assert getattr(out, field).shape == shape
    assert out.loss is not None and torch.isfinite(out.loss)
    out.loss.backward()


@pytest.mark.parametrize("name, kwargs", [
    ("ForSequenceClassification", dict(labels=torch.tensor([0, 2, 1]))),
    ("ForTokenClassification", dict(labels=torch.randint(0, 3, (3, 24), generator=torch.Generator().manual_seed(1)))),
    ("ForQuestionAnswering", dict(start_positions=torch.tensor([1, 2, 3]), end_positions=torch.tensor([2, 3, 30]))),
])
def test_task_heads_are_transformers_bert_heads_over_the_same_weights(name, kwargs):
    """The fine-tuning heads repeat transformers' BERT heads (their prologue is the same in each, by design): with
    BERT's weights they give BERT's logits and loss. Sequence classification reads BERT's pooler where NSP trained
    one (here); without NSP there is none, and it reads `[CLS]` itself."""
    import transformers

    labels = 2 if name == "ForQuestionAnswering" else 3  # BERT's QA layer has num_labels outputs, ours 2
    config = tester.config(num_labels=labels, use_next_sentence_prediction=True, attn_implementation="eager")
    torch.manual_seed(0)
    ours = getattr(models.spanbert.modeling_spanbert, f"SpanBert{name}")(config).eval()
    bert = transformers.BertConfig(**{k: v for k, v in config.to_dict().items()
                                      if k in transformers.BertConfig.__annotations__}, num_labels=labels)
    bert._attn_implementation = "eager"
    theirs = getattr(transformers, f"Bert{name}")(bert).eval()
    theirs.load_state_dict({k.replace("spanbert.", "bert.", 1): v for k, v in ours.state_dict().items()})
    inputs = tester.inputs()
    ours_out, theirs_out = (model(inputs["input_ids"], attention_mask=inputs["attention_mask"], **kwargs)
                            for model in (ours, theirs))
    for field in ("loss", "logits", "start_logits", "end_logits"):
        if field in theirs_out:
            torch.testing.assert_close(ours_out[field], theirs_out[field], rtol=1e-5, atol=1e-6)


def test_regression_head_uses_mse():
    model = SpanBertForSequenceClassification(tester.config(num_labels=1)).eval()
    inputs = tester.inputs()
    labels = torch.tensor([0.5, -1.0, 2.0])
    out = model(inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels)
    torch.testing.assert_close(out.loss, torch.nn.functional.mse_loss(out.logits.squeeze(-1), labels))


def test_attention_implementations_agree():
    torch.manual_seed(0)
    eager = SpanBertModel(tester.config()).eval()
    eager.set_attn_implementation("eager")
    sdpa = SpanBertModel(tester.config()).eval()
    sdpa.load_state_dict(eager.state_dict())
    sdpa.set_attn_implementation("sdpa")
    inputs = tester.inputs()
    mask = inputs["attention_mask"].bool()
    a = eager(inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state[mask]
    b = sdpa(inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state[mask]
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_input_longer_than_position_table_gets_a_clear_error():
    model = SpanBertModel(tester.config())
    with pytest.raises(ValueError, match="truncate"):
        model(torch.ones(1, 65, dtype=torch.long))


def test_every_auto_class_is_registered_locally():
    config = tester.config()
    assert set(config.auto_map) == set(AUTO_MAP)
    assert isinstance(AutoModel.from_config(config), SpanBertModel)
    assert isinstance(AutoModelForPreTraining.from_config(config), SpanBertForPreTraining)


def test_save_load_round_trip_in_fresh_process_without_this_repository(tmp_path):
    torch.manual_seed(0)
    model = SpanBertForPreTraining(tester.config()).eval()
    model.save_pretrained(tmp_path)
    assert ({"config.json", "model.safetensors", "modeling_spanbert.py", "configuration_spanbert.py"}
            <= {p.name for p in tmp_path.iterdir()})
    inputs = tester.inputs()
    with torch.no_grad():
        expected_loss = model(**inputs).loss.item()
        expected_hidden = model.spanbert(inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state
    torch.save({k: v for k, v in inputs.items()}, tmp_path / "inputs.pt")
    out = run_isolated(f"""
        import json, torch
        from transformers import (AutoModel, AutoModelForPreTraining, AutoModelForSequenceClassification,
                                  AutoModelForQuestionAnswering, AutoModelForTokenClassification, AutoModelForMaskedLM)
        path = {str(tmp_path)!r}
        inputs = torch.load(path + "/inputs.pt")
        result = {{}}
        with torch.no_grad():
            pre = AutoModelForPreTraining.from_pretrained(path, trust_remote_code=True).eval()
            result["pretraining_loss"] = pre(**inputs).loss.item()
            bare = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
            result["hidden"] = bare(inputs["input_ids"],
                                    attention_mask=inputs["attention_mask"]).last_hidden_state.tolist()
            for auto in (AutoModelForSequenceClassification, AutoModelForQuestionAnswering,
                         AutoModelForTokenClassification, AutoModelForMaskedLM):
                model = auto.from_pretrained(path, trust_remote_code=True)
                result[auto.__name__] = type(model).__module__.startswith("transformers_modules")
        print(json.dumps(result))
    """)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["pretraining_loss"] == pytest.approx(expected_loss, rel=1e-5)
    torch.testing.assert_close(torch.tensor(result["hidden"]), expected_hidden, rtol=1e-5, atol=1e-5)
    assert all(result[name] for name in ("AutoModelForSequenceClassification", "AutoModelForQuestionAnswering",
                                         "AutoModelForTokenClassification", "AutoModelForMaskedLM"))


def nsp_inputs(seed=0):
    """tester.inputs() as two segments (token types 0 then 1) with their next-sentence labels."""
    inputs = tester.inputs(seed)
    inputs["token_type_ids"] = (torch.arange(tester.seq_length) >= 12).long().expand(tester.batch_size, -1).clone()
    inputs["next_sentence_label"] = torch.tensor([0, 1, 1])
    return inputs


def test_next_sentence_prediction_head_shapes_loss_and_weight_names():
    config = tester.config(use_next_sentence_prediction=True, nsp_loss_weight=0.5)
    model = SpanBertForPreTraining(config).eval()
    inputs = nsp_inputs()
    out = model(**inputs)
    assert out.nsp_logits.shape == (tester.batch_size, 2)
    # BERT's pooler (dense + tanh over [CLS]) and Linear(H, 2), under BertForPreTraining's weight names.
    hidden = model.spanbert(inputs["input_ids"], attention_mask=inputs["attention_mask"],
                            token_type_ids=inputs["token_type_ids"]).last_hidden_state
    pooler, classifier = model.spanbert.pooler.dense, model.cls.seq_relationship
    expected_logits = classifier(torch.tanh(pooler(hidden[:, 0])))
    torch.testing.assert_close(out.nsp_logits, expected_logits)
    expected_nsp = torch.nn.functional.cross_entropy(expected_logits, inputs["next_sentence_label"])
    torch.testing.assert_close(out.nsp_loss, expected_nsp)
    torch.testing.assert_close(out.loss, out.mlm_loss + out.sbo_loss + 0.5 * expected_nsp)
    accuracy = (expected_logits.argmax(-1) == inputs["next_sentence_label"]).float().mean()
    torch.testing.assert_close(out.nsp_accuracy, accuracy)
    names = set(model.state_dict())
    assert {"spanbert.pooler.dense.weight", "cls.seq_relationship.weight", "cls.seq_relationship.bias"} <= names
    # The segment embeddings matter: B's token type changes the prediction.
    flipped = dict(inputs, token_type_ids=torch.zeros_like(inputs["token_type_ids"]))
    assert not torch.allclose(model(**flipped).nsp_logits, out.nsp_logits)
    out.loss.backward()
    assert (model.cls.seq_relationship.weight.grad.abs().sum() > 0
            and model.spanbert.pooler.dense.weight.grad.abs().sum() > 0)


def test_next_sentence_labels_and_head_must_match():
    with_head = SpanBertForPreTraining(tester.config(use_next_sentence_prediction=True)).eval()
    without = SpanBertForPreTraining(tester.config()).eval()
    inputs = nsp_inputs()
    with pytest.raises(ValueError, match="no NSP head"):
        without(**inputs)
    # MLM labels without NSP labels: the MLM and SBO losses, and the NSP head still scores the pair.
    no_nsp_label = with_head(**{k: v for k, v in inputs.items() if k != "next_sentence_label"})
    assert no_nsp_label.nsp_loss is None and no_nsp_label.nsp_logits.shape == (3, 2)
    torch.testing.assert_close(no_nsp_label.loss, no_nsp_label.mlm_loss + no_nsp_label.sbo_loss)
    # Without labels the head still scores the pair, as BertForPreTraining does.
    assert with_head(inputs["input_ids"], attention_mask=inputs["attention_mask"]).nsp_logits.shape == (3, 2)
    # Single-segment SpanBERT keeps no pooler and no NSP weights.
    assert without.spanbert.pooler is None and not any("pooler" in n or "seq_relationship" in n
                                                       for n in without.state_dict())
    assert SpanBertModel(tester.config())(inputs["input_ids"]).pooler_output is None


def test_nsp_export_reloads_through_every_auto_class_in_a_fresh_process(tmp_path):
    torch.manual_seed(0)
    model = SpanBertForPreTraining(tester.config(use_next_sentence_prediction=True)).eval()
    model.save_pretrained(tmp_path)
    inputs = nsp_inputs()
    encoder_inputs = {k: inputs[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        expected = model(**inputs)
        pooled = model.spanbert(**encoder_inputs).pooler_output
    torch.save(inputs, tmp_path / "inputs.pt")
    out = run_isolated(f"""
        import json, torch
        from transformers import (AutoModel, AutoModelForPreTraining, AutoModelForSequenceClassification,
                                  AutoModelForQuestionAnswering, AutoModelForTokenClassification)
        path = {str(tmp_path)!r}
        inputs = torch.load(path + "/inputs.pt")
        encoder_inputs = {{k: inputs[k] for k in ("input_ids", "attention_mask", "token_type_ids")}}
        result = {{}}
        with torch.no_grad():
            pre = AutoModelForPreTraining.from_pretrained(path, trust_remote_code=True).eval()
            out = pre(**inputs)
            result["loss"], result["nsp_loss"] = out.loss.item(), out.nsp_loss.item()
            bare = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
            result["pooled"] = bare(**encoder_inputs).pooler_output.tolist()
            classifier, info = AutoModelForSequenceClassification.from_pretrained(
                path, trust_remote_code=True, num_labels=2, output_loading_info=True)
            result["classifier_missing"] = sorted(info["missing_keys"])
            result["classifier_pooler"] = classifier.spanbert.pooler.dense.weight[:2, :2].tolist()
            classifier.eval()
            dense = classifier.spanbert(**encoder_inputs).pooler_output
            result["classifier_reads_pooler"] = torch.allclose(
                classifier(**encoder_inputs).logits, classifier.classifier(dense))
            for auto in (AutoModelForQuestionAnswering, AutoModelForTokenClassification):
                head = auto.from_pretrained(path, trust_remote_code=True)
                result[auto.__name__] = head.spanbert.pooler is None  # the pooler is dropped where nothing reads it
        print(json.dumps(result))
    """)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["loss"] == pytest.approx(expected.loss.item(), rel=1e-5)
    assert result["nsp_loss"] == pytest.approx(expected.nsp_loss.item(), rel=1e-5)
    torch.testing.assert_close(torch.tensor(result["pooled"]), pooled, rtol=1e-5, atol=1e-5)
    # The trained pooler loads into the sequence classifier; only the new classifier is initialised.
    assert result["classifier_missing"] == ["classifier.bias", "classifier.weight"]
    torch.testing.assert_close(torch.tensor(result["classifier_pooler"]), model.spanbert.pooler.dense.weight[:2, :2])
    assert result["classifier_reads_pooler"]
    assert result["AutoModelForQuestionAnswering"] and result["AutoModelForTokenClassification"]


@pytest.mark.parametrize("nsp", [False, True], ids=["spanbert", "with-nsp"])
def test_pretraining_head_answers_without_labels_as_bert_for_pretraining(nsp):
    """Without labels: MLM logits at every position (those of the masked-LM head with the same weights), NSP logits
    with the NSP head, SBO logits only where span boundaries are given, no loss; `outputs[0]` is the MLM logits."""
    torch.manual_seed(0)
    model = SpanBertForPreTraining(tester.config(use_next_sentence_prediction=nsp)).eval()
    masked_lm = SpanBertForMaskedLM(tester.config(use_next_sentence_prediction=nsp)).eval()
    masked_lm.load_state_dict(model.state_dict(), strict=False)
    inputs = nsp_inputs() if nsp else tester.inputs()
    encoder_inputs = {k: inputs[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in inputs}
    with torch.no_grad():
        out = model(**encoder_inputs)
        dense = masked_lm(**encoder_inputs).logits
        assert out.loss is None and out.sbo_logits is None
        assert out.mlm_logits.shape == (tester.batch_size, tester.seq_length, tester.vocab_size)
        torch.testing.assert_close(out.mlm_logits, dense)
        assert (out.nsp_logits is not None and out.nsp_logits.shape == (tester.batch_size, 2)) == nsp
        torch.testing.assert_close(model(**encoder_inputs, return_dict=False)[0], out.mlm_logits)
        # A prediction mask gives the rows of those positions only; span boundaries add the SBO predictions.
        mask = inputs["labels"] != -100
        picked = model(**encoder_inputs, prediction_mask=mask, span_left=inputs["span_left"],
                       span_right=inputs["span_right"])
        torch.testing.assert_close(picked.mlm_logits, dense[mask])
        trained = model(**inputs)
        torch.testing.assert_close(picked.sbo_logits, trained.sbo_logits, rtol=1e-5, atol=1e-5)
        assert trained.mlm_logits.shape == (int(mask.sum()), tester.vocab_size)  # with labels: targets only
        # NSP labels alone train NSP alone.
        if nsp:
            only_nsp = model(**encoder_inputs, next_sentence_label=inputs["next_sentence_label"])
            torch.testing.assert_close(only_nsp.loss, only_nsp.nsp_loss)
    with pytest.raises(ValueError, match="prediction_mask"):
        model(**inputs, prediction_mask=mask)


def test_nsp_pretraining_head_reloads_and_resizes_without_next_sentence_labels(tmp_path):
    """bert_2seq_nsp's pretraining head: forward without NSP labels, save -> reload -> same outputs, resize."""
    torch.manual_seed(0)
    model = SpanBertForPreTraining(tester.config(use_next_sentence_prediction=True)).eval()
    inputs = nsp_inputs()
    inputs.pop("next_sentence_label")
    with torch.no_grad():
        before = model(**inputs)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        after = reloaded(**inputs)
    for name in ("loss", "mlm_logits", "sbo_logits", "nsp_logits"):
        torch.testing.assert_close(after[name], before[name])
    reloaded.resize_token_embeddings(tester.vocab_size + 3)
    grown = reloaded(**inputs)
    assert grown.mlm_logits.shape[-1] == tester.vocab_size + 3 and torch.isfinite(grown.loss)
