"""Runs one tiny export through every client a researcher points at it; prints `{client: "ok" | error}` as JSON.

Executed by tests/test_clients.py in a fresh process where this repository is not importable (`run_isolated`), with
`EXPORT`, `PRETRAINING_EXPORT`, `CLIENTS` and `LORA_TARGETS` prepended. Only torch, transformers and the client
libraries are used, and nothing here names a family: what each check expects it reads from the export (its auto_map,
its outputs, its forward's inputs).
"""

import inspect
import json
import math
import traceback

import torch
import transformers
from transformers import AutoConfig, AutoModelForPreTraining, AutoTokenizer, pipeline

TEXTS = ["The quick brown fox jumps over the lazy dog.", "A short second sentence."]
results = {}


def client(name):
    """Record whether the decorated check passes (it runs at once) only when the family is expected to support it."""

    def run(check):
        if name not in CLIENTS:  # noqa: F821 (prepended)
            return
        try:
            check()
            results[name] = "ok"
        except Exception as error:  # noqa: BLE001 (each client's failure is reported, the others still run)
            results[name] = f"{type(error).__name__}: {error}"[:400] + "\n" + traceback.format_exc()[-1500:]

    return run


tokenizer = AutoTokenizer.from_pretrained(EXPORT, trust_remote_code=True)  # noqa: F821
config = AutoConfig.from_pretrained(EXPORT, trust_remote_code=True)  # noqa: F821
# A standard copy (training/to_transformers.py) has no auto_map: the bare model and the Auto class of its architecture.
auto_map = getattr(config, "auto_map", None) or {"AutoModel": None, **{
    f"AutoModelFor{name.split('For', 1)[1]}": None for name in config.architectures if "For" in name}}
batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
length = int(batch["attention_mask"][0].sum())


def load(auto_name, **kwargs):
    torch.manual_seed(0)
    return getattr(transformers, auto_name).from_pretrained(EXPORT, trust_remote_code=True, **kwargs)  # noqa: F821


@client("feature-extraction")
def _():
    features = pipeline("feature-extraction", model=EXPORT, trust_remote_code=True)(TEXTS[0])  # noqa: F821
    assert len(features[0]) == length and all(math.isfinite(x) for x in features[0][0])


@client("fill-mask")
def _():
    fill = pipeline("fill-mask", model=EXPORT, trust_remote_code=True, top_k=3)  # noqa: F821
    predictions = fill(f"The quick brown {tokenizer.mask_token} jumps over the lazy dog.")
    assert len(predictions) == 3 and all(isinstance(p["token_str"], str) and 0 <= p["score"] <= 1 for p in predictions)


@client("text-classification")
def _():
    classify = pipeline("text-classification", model=EXPORT, trust_remote_code=True)  # noqa: F821
    assert {"label", "score"} <= set(classify(TEXTS[0])[0])


@client("pretraining-head inference")
def _():
    """AutoModelForPreTraining without labels, as transformers' BertForPreTraining / ElectraForPreTraining answer:
    every head whose inputs are given scores the text; no loss; the tuple form starts with the first output."""
    path = PRETRAINING_EXPORT  # noqa: F821 (prepended: the export itself, or another, e.g. BERTAC's part-1 CNN)
    model = AutoModelForPreTraining.from_pretrained(path, trust_remote_code=True).eval()
    inputs = batch
    if path != EXPORT:  # noqa: F821 (another export reads the text with its own tokenizer)
        words = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        inputs = words(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        output = model(**inputs)
        first = model(**inputs, return_dict=False)[0]
    shape, vocab = tuple(inputs["input_ids"].shape), model.config.vocab_size
    assert output.get("loss") is None
    assert torch.equal(first, output.to_tuple()[0])
    scores = dict(output)  # a standard copy's heads under the zoo's names: ElectraForPreTraining's RTD, BERT's MLM
    if "logits" in scores and scores["logits"].shape == shape:
        scores["rtd_logits"] = scores.pop("logits")
    if "prediction_logits" in scores:
        scores["mlm_logits"] = scores.pop("prediction_logits")
    if "rtd_logits" in scores:  # replaced-token detection: one score per token
        assert scores["rtd_logits"].shape == shape
        if getattr(model, "mws_head", None) is not None:
            candidates = torch.randint(1000, 2000, (*shape, 4))
            assert model(**inputs, candidate_ids=candidates).mws_logits.shape == candidates.shape
    for name in ("mlm_logits", "logits"):  # a token-prediction head: the vocabulary at every position
        if name in scores:
            assert scores[name].shape == (*shape, vocab), name
    assert output.get("sbo_logits") is None  # no span boundaries given
    if "fake_representation" in output:  # BERTAC's CNN: one vector (and one discriminator score) per sentence
        width = model.config.num_filters * len(model.config.filter_windows)
        assert output.fake_representation.shape == (shape[0], width) and output.fake_logits.shape == (shape[0],)
    top = scores.get("mlm_logits", scores.get("logits"))
    if top is not None:  # fill the mask: the most likely token at every position is a real vocabulary entry
        assert 0 <= int(top.argmax(-1).max()) < vocab and torch.isfinite(top).all()


def labels_for(model, auto_name, input_ids):
    """Training inputs of the pretraining heads: one masked target at position 2 of every row (and its span, for a
    head with span boundary targets)."""
    labels = torch.full_like(input_ids, -100)
    labels[:, 2] = input_ids[:, 2]
    extra = {"labels": labels}
    if auto_name == "AutoModelForPreTraining" and "span_left" in inspect.signature(model.forward).parameters:
        span_left, span_right = torch.full_like(input_ids, -1), torch.full_like(input_ids, -1)
        span_left[:, 2], span_right[:, 2] = 1, 3
        extra.update(span_left=span_left, span_right=span_right)
    if auto_name == "AutoModelForSequenceClassification":
        extra = {"labels": torch.tensor([0, 1])}
    if auto_name == "AutoModelForQuestionAnswering":
        extra = {"start_positions": torch.tensor([1, 1]), "end_positions": torch.tensor([2, 2])}
    if auto_name == "AutoModelForTokenClassification":
        extra = {"labels": torch.zeros_like(input_ids)}
    return extra


@client("resize_token_embeddings")
def _():
    import tempfile

    grown = AutoTokenizer.from_pretrained(EXPORT, trust_remote_code=True)  # noqa: F821
    grown.add_tokens(["hyperparameterisation", "encoderzoo"])
    encoded = grown(["Our hyperparameterisation of encoderzoo models.", TEXTS[1]], padding=True, return_tensors="pt")
    assert int(encoded["input_ids"].max()) >= len(tokenizer)
    for auto_name in sorted(set(auto_map) - {"AutoConfig"}):
        model = load(auto_name)
        model.resize_token_embeddings(len(grown), pad_to_multiple_of=8)
        size = model.get_input_embeddings().weight.shape[0]
        assert size >= len(grown) and size % 8 == 0, auto_name
        assert getattr(model.config.get_text_config(), "vocab_size", size) == size, auto_name  # HIRE: its backbone's
        output = model(**encoded, **labels_for(model, auto_name, encoded["input_ids"]))
        loss = output.get("loss")
        loss = loss if loss is not None else next(v for v in output.values() if torch.is_tensor(v)).float().sum()
        assert torch.isfinite(loss), auto_name
        loss.backward()
        if auto_name != "AutoModel":  # one save/reload round-trip per family is enough
            continue
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            reloaded = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True)
            assert reloaded.get_input_embeddings().weight.shape[0] == size, auto_name


@client("PEFT LoRA (sequence classification)")
def _():
    from peft import LoraConfig, TaskType, get_peft_model

    model = get_peft_model(load("AutoModelForSequenceClassification", num_labels=2),
                           LoraConfig(task_type=TaskType.SEQ_CLS, r=4, target_modules=LORA_TARGETS))  # noqa: F821
    head = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad and "modules_to_save" in n}
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    assert head and lora, "PEFT found no classification head to train or no LoRA target"
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(3):
        model(**batch, labels=torch.tensor([0, 1])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    parameters = dict(model.named_parameters())
    assert all(not torch.equal(parameters[n], before) for n, before in head.items()), "the head did not train"
    assert any(not torch.equal(parameters[n], before) for n, before in lora.items()), "LoRA did not train"


@client("sentence-transformers")
def _():
    from sentence_transformers import SentenceTransformer, models

    remote = {"trust_remote_code": True}
    word = models.Transformer(EXPORT, model_args=remote, config_args=remote, tokenizer_args=remote)  # noqa: F821
    encoder = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension())], device="cpu")
    embeddings = encoder.encode(TEXTS, convert_to_tensor=True)
    assert embeddings.shape == (2, word.get_word_embedding_dimension()) and torch.isfinite(embeddings).all()


@client("gradient checkpointing")
def _():
    def gradients(checkpointing):
        model = load("AutoModelForSequenceClassification", num_labels=2).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        torch.manual_seed(1)
        model(**batch, labels=torch.tensor([0, 1])).loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    plain, checkpointed = gradients(False), gradients(True)
    assert plain.keys() == checkpointed.keys()
    assert all(torch.allclose(plain[n], checkpointed[n], atol=1e-5) for n in plain)


def every_config(model):
    """The model's config, its sub-configs and every sub-model's config (HIRE's and BERTAC's encoder, BERTAC's CNN)."""
    configs = [model.config]
    configs += [module.config for module in model.modules() if isinstance(module, transformers.PreTrainedModel)]
    for config in list(configs):
        configs += [getattr(config, key) for key in config.sub_configs if getattr(config, key, None) is not None]
    return configs


@client("attn_implementation (explicit, set_attn_implementation)")
def _():
    """An explicit sdpa or eager load works, every config then says it, and set_attn_implementation changes them all;
    the outputs do not depend on it."""
    outputs = {}
    for implementation in ("sdpa", "eager"):
        model = load("AutoModel", attn_implementation=implementation).eval()
        assert {c._attn_implementation for c in every_config(model)} == {implementation}, implementation
        with torch.no_grad():
            outputs[implementation] = model(**batch).last_hidden_state
    assert torch.allclose(outputs["sdpa"], outputs["eager"], atol=1e-4)
    model = load("AutoModel").eval()
    model.set_attn_implementation("eager")
    assert {c._attn_implementation for c in every_config(model)} == {"eager"}
    with torch.no_grad():
        assert torch.allclose(model(**batch).last_hidden_state, outputs["sdpa"], atol=1e-4)


@client("quiet load (AutoModel, no load report)")
def _():
    """The export through AutoModel (and AutoModelForPreTraining where it has one) prints no load report, though it
    holds pretraining heads or a classifier the bare model does not read."""
    import logging

    messages = []

    class Records(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    records, root = Records(), logging.getLogger("transformers")
    transformers.logging.set_verbosity_warning()  # the isolated process runs at error level: show the report
    root.addHandler(records)
    try:
        load("AutoModel")
        if "AutoModelForPreTraining" in auto_map:
            load("AutoModelForPreTraining")
    finally:
        root.removeHandler(records)
        transformers.logging.set_verbosity_error()
    assert not any("LOAD REPORT" in message for message in messages), "\n".join(messages)


@client("torch.compile")
def _():
    model = load("AutoModel").eval()
    with torch.no_grad():
        eager = model(**batch).last_hidden_state
        compiled = torch.compile(model, backend="aot_eager")(**batch).last_hidden_state
    assert torch.allclose(eager, compiled, atol=1e-5)


print("\nRESULTS " + json.dumps(results))
