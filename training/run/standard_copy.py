"""The standard transformers copy of a zoo export (`training/to_transformers.py`, `pretrain.py
--also_export_standard`): a SpanBERT-family export as BERT (`BertForPreTraining` weights), a TEAMS/ELECTRA export as
Google's ELECTRA release is laid out (the discriminator in OUTPUT, the generator as `ElectraForMaskedLM` in
OUTPUT/generator). No code files and no `auto_map`; what has no place in BERT or ELECTRA is dropped and named in the
copy's card. Before anything is written, the copy is checked against the export (the zoo's classes) on a probe batch;
a difference over `TOLERANCE` refuses it.
"""


from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Families with no standard transformers equivalent, and why.
NO_STANDARD_BODY = {
    "cloze": "its two one-directional towers and their combination layer have no standard transformers architecture",
    "bertac_cnn": "a CNN over word vectors, no transformer: transformers has no such architecture",
    "bertac": "its TIER layers and CNN over the encoder have no standard transformers architecture",
    "hire": "its GRU fusion over the encoder's layers has no standard transformers architecture",
}
# The encoder fields BERT and ELECTRA configs share with the zoo's configs (same names and meanings).
ENCODER_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                  "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id", "classifier_dropout")
TOLERANCE = 1e-5
# What the copy's tokenizer_config.json names, read by transformers 4 and 5 alike (a zoo-trained tokenizer saves as
# transformers 5's `TokenizersBackend`, unknown to 4), and the entries it leaves out: where the files were loaded from
# (machine-local) and transformers 5's own bookkeeping.
TOKENIZER_CLASSES = {"BERT": "BertTokenizerFast", "ELECTRA": "ElectraTokenizerFast"}
TOKENIZER_LOCAL_KEYS = ("is_local", "local_files_only", "backend", "name_or_path", "_name_or_path", "auto_map")
GENERATOR_FOLDER = "generator"
RTD_FOLDER = "rtd"  # TEAMS's RTD branch (its own task layer) as a discriminator of its own


@dataclass
class Part:
    """One standard checkpoint to write: its transformers class, config, tensors (standard name -> export key, read
    from the export) and the folder below OUTPUT it goes to ("" for OUTPUT itself)."""

    class_name: str
    config: dict
    keys: dict[str, str]
    subfolder: str = ""
    checks: dict[str, float] = field(default_factory=dict)  # output -> max |difference| measured


@dataclass
class Conversion:
    """What a zoo export becomes: the standard checkpoints, what each dropped part of the export was (in words), and
    the export's config."""

    family: str  # "BERT" or "ELECTRA"
    parts: list[Part]
    dropped: dict[str, str]  # group of export keys -> why
    config: dict


def standard_refusal(model_type: str | None) -> str | None:
    """Why an export of `model_type` has no standard copy (one line), or None where it has one."""
    if model_type in ("spanbert", "teams"):
        return None
    if model_type in NO_STANDARD_BODY:
        return f"a {model_type} export has no standard BERT or ELECTRA copy: {NO_STANDARD_BODY[model_type]}."
    return (f"a {model_type or 'model without a model_type'} checkpoint is no zoo export with a standard body "
            "(spanbert, bert, bert_2seq, bert_2seq_nsp, teams and electra exports are).")


def read_export(export: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The export's config.json and its tensors (safetensors files), each file checked readable first."""
    from safetensors.torch import load_file

    from encoder_zoo.training.data.records import read_json_record
    from encoder_zoo.training.data.tokenizer import lacks_tokenizer_files
    from encoder_zoo.training.run.loading import damaged_weights

    config_file = export / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"EXPORT {export}: no config.json; pass the export folder a pretraining run wrote "
                                "(OUTPUT_DIR/export).")
    again = "copy the export again from its run (OUTPUT_DIR/export) or a backup. Nothing was written."
    config = read_json_record(config_file, again)
    refusal = standard_refusal(config.get("model_type"))
    if refusal:
        raise ValueError(f"EXPORT {export}: {refusal}")
    problem = damaged_weights(str(export))  # an empty or truncated safetensors file, named
    if lacks_tokenizer_files(export):
        problem = problem or f"{export} holds no tokenizer files (tokenizer.json, tokenizer_config.json, ...)"
    if problem:
        raise ValueError(f"EXPORT {export}: {problem}; {again}")
    files = sorted(export.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"EXPORT {export}: no *.safetensors weights beside its config.json.")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return config, tensors


def _encoder_config(config: dict, model_type: str, **extra) -> dict:
    return {"model_type": model_type, **{k: config[k] for k in ENCODER_FIELDS if k in config}, **extra}


def _group(key: str) -> str:
    """A dropped module's name: a head by its name (`sbo.*`), a part of the body by two (`teams.rtd_layer.*`)."""
    parts = key.split(".")
    keep = 2 if parts[0] in ("spanbert", "teams", "generator", "cls") else 1
    return ".".join(parts[:keep]) + ".*" if len(parts) > keep else key


def _dropped(tensors, used: set[str], reasons: list[tuple[str, str]]) -> dict[str, str]:
    """Every export key no part reads, grouped, with the first reason whose pattern matches it."""
    dropped: dict[str, str] = {}
    for key in tensors:
        if key in used:
            continue
        why = next((reason for pattern, reason in reasons if re.match(pattern, key)),
                   "no counterpart in the standard architecture")
        dropped.setdefault(_group(key), why)
    return dropped


def bert_conversion(config: dict, tensors: dict[str, torch.Tensor]) -> Conversion:
    """A SpanBERT-family export as BERT: `spanbert.` -> `bert.`, the MLM (and NSP) heads under their own names."""
    nsp = bool(config.get("use_next_sentence_prediction"))
    keys = {f"bert.{k.removeprefix('spanbert.')}": k for k in tensors if k.startswith("spanbert.")}
    if not nsp:  # no pooler without NSP (SpanBERT never trains one): BertForMaskedLM's layout
        keys = {k: v for k, v in keys.items() if not k.startswith("bert.pooler.")}
    keys.update({k: k for k in tensors if k.startswith("cls.predictions.") and k != "cls.predictions.decoder.weight"})
    if nsp:
        keys.update({k: k for k in tensors if k.startswith("cls.seq_relationship.")})
    if "cls.predictions.bias" not in keys:
        raise ValueError("EXPORT: it holds no MLM head (cls.predictions): a fine-tuned model, not a pretraining "
                         "export. Convert the pretraining run's OUTPUT_DIR/export.")
    if "cls.predictions.decoder.bias" in keys:
        keys.pop("cls.predictions.decoder.bias")  # tied to cls.predictions.bias
    class_name = "BertForPreTraining" if nsp else "BertForMaskedLM"
    part = Part(class_name, _encoder_config(config, "bert", architectures=[class_name]), keys)
    dropped = _dropped(tensors, {*keys.values(), "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}, [
        (r"sbo\.", "SBO head (span boundary objective): BERT has no such head"),
        (r"(spanbert\.)?pooler\.", "pooler: trained by nothing without NSP"),
        (r"(classifier|qa_outputs)\.", "a fine-tuning head"),
    ])
    return Conversion("BERT", [part], dropped, config)


def electra_conversion(config: dict, tensors: dict[str, torch.Tensor], without_generator: bool = False) -> Conversion:
    """A TEAMS/ELECTRA export as Google's ELECTRA: the discriminator (the layers `TeamsModel` returns, i.e. the
    fine-tuning representation) and the generator (its shared bottom layers copied from the discriminator)."""
    from encoder_zoo import models

    teams = models.get_class("teams", "AutoConfig")(**{k: v for k, v in config.items()
                                                       if k not in ("architectures", "transformers_version")})
    layers = teams.num_hidden_layers
    from_rtd = teams.finetune_representation == "rtd"
    path = [f"teams.layer.{i}." for i in range(teams.task_source_layer if from_rtd else layers)]
    if from_rtd:
        path.append("teams.rtd_layer.")
    elif teams.has_mws_task_layer:
        path.append("teams.mws_layer.")
    embeddings = {f"electra.{k.removeprefix('teams.')}": k for k in tensors
                  if k.startswith(("teams.embeddings.", "teams.embeddings_project."))}
    discriminator = dict(embeddings)
    for depth, prefix in enumerate(path):
        discriminator.update({f"electra.encoder.layer.{depth}.{k.removeprefix(prefix)}": k for k in tensors
                              if k.startswith(prefix)})
    # ElectraForPreTraining's head reads the top layer: the RTD head fits where it reads the exported layers.
    rtd_fits = teams.trains_rtd and (from_rtd or not teams.has_rtd_task_layer) and "rtd_head.dense.weight" in tensors
    if rtd_fits:
        discriminator.update({f"discriminator_predictions.{k.removeprefix('rtd_head.')}": k for k in tensors
                              if k.startswith("rtd_head.")})
    discriminator_class = "ElectraForPreTraining" if rtd_fits else "ElectraModel"
    if not rtd_fits:  # the bare model's own names
        discriminator = {k.removeprefix("electra."): v for k, v in discriminator.items()}
    parts = [Part(discriminator_class, _encoder_config(config, "electra", embedding_size=teams.embedding_size,
                                                       architectures=[discriminator_class]), discriminator)]
    if not rtd_fits and teams.trains_rtd and teams.has_rtd_task_layer and "rtd_head.dense.weight" in tensors:
        # TEAMS's RTD head reads its own task layer, fed from layer `task_source_layer`: that path is an ELECTRA
        # discriminator of its own, in OUTPUT/rtd (replaced-token scores; fine-tuning reads OUTPUT).
        depth = teams.task_source_layer
        rtd = dict(embeddings)
        for index, prefix in enumerate([*(f"teams.layer.{i}." for i in range(depth)), "teams.rtd_layer."]):
            rtd.update({f"electra.encoder.layer.{index}.{k.removeprefix(prefix)}": k for k in tensors
                        if k.startswith(prefix)})
        rtd.update({f"discriminator_predictions.{k.removeprefix('rtd_head.')}": k for k in tensors
                    if k.startswith("rtd_head.")})
        parts.append(Part("ElectraForPreTraining", _encoder_config(
            config, "electra", embedding_size=teams.embedding_size, num_hidden_layers=depth + 1,
            architectures=["ElectraForPreTraining"]), rtd, RTD_FOLDER))
    if "generator.bias" not in tensors and not without_generator:
        raise ValueError("EXPORT: it holds no generator (no generator.* tensors beside the discriminator's), which "
                         "every TEAMS/ELECTRA pretraining export has; convert the complete export, or pass "
                         "--without_generator to write the discriminator alone (its card then says the generator "
                         "is missing).")
    if "generator.bias" in tensors:
        shared = teams.num_shared_generator_layers
        generator = {k: v for k, v in embeddings.items() if not k.startswith("electra.embeddings_project.")}
        project = "teams.embeddings_project." if teams.generator_hidden_size == teams.hidden_size else (
            "generator.embeddings_project.")
        generator.update({f"electra.embeddings_project.{k.removeprefix(project)}": k for k in tensors
                          if k.startswith(project)})
        for depth in range(teams.generator_num_hidden_layers):
            prefix = f"teams.layer.{depth}." if depth < shared else f"generator.layer.{depth - shared}."
            generator.update({f"electra.encoder.layer.{depth}.{k.removeprefix(prefix)}": k for k in tensors
                              if k.startswith(prefix)})
        generator.update({f"generator_predictions.{k.removeprefix('generator.predictions.')}": k for k in tensors
                          if k.startswith("generator.predictions.")})
        generator["generator_lm_head.bias"] = "generator.bias"
        generator_config = _encoder_config(
            config, "electra", embedding_size=teams.embedding_size, hidden_size=teams.generator_hidden_size,
            num_hidden_layers=teams.generator_num_hidden_layers, intermediate_size=teams.generator_intermediate_size,
            num_attention_heads=teams.generator_num_attention_heads, architectures=["ElectraForMaskedLM"])
        parts.append(Part("ElectraForMaskedLM", generator_config, generator, GENERATOR_FOLDER))
    used = {key for part in parts for key in part.keys.values()}
    used |= {"generator.decoder.weight", "generator.decoder.bias"}  # tied to the word embeddings and generator.bias
    dropped = _dropped(tensors, used, [
        (r"mws_head\.", "MWS head (multi-word selection): ELECTRA has no such head"),
        (r"teams\.mws_layer\.", "MWS task layer: the exported layers are the RTD task layer's path"),
        (r"(classifier|qa_outputs)\.", "a fine-tuning head"),
    ])
    return Conversion("ELECTRA", parts, dropped, config)


def conversion_of(config: dict, tensors: dict[str, torch.Tensor], without_generator: bool = False) -> Conversion:
    if config["model_type"] == "spanbert":
        return bert_conversion(config, tensors)
    return electra_conversion(config, tensors, without_generator)


def build(part: Part, tensors: dict[str, torch.Tensor]):
    """The transformers model of `part` with the export's tensors, every key checked to fit (strict)."""
    import transformers

    config_class = transformers.BertConfig if part.config["model_type"] == "bert" else transformers.ElectraConfig
    config = config_class(**{k: v for k, v in part.config.items() if k != "model_type"})
    model = getattr(transformers, part.class_name)(config)
    state = {name: tensors[key] for name, key in part.keys.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    missing = [name for name in missing if name not in tied]
    if missing or unexpected:
        raise ValueError(f"EXPORT: the {part.class_name} copy does not fit (missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]}); is it an export of this version of the zoo?")
    model.tie_weights()
    return model.eval()


def probe_batch(config: dict) -> dict[str, torch.Tensor]:
    """Two rows of random token ids, the second padded: what the copy is checked on."""
    generator = torch.Generator().manual_seed(0)
    length = min(16, config.get("max_position_embeddings", 16))
    input_ids = torch.randint(5, config["vocab_size"], (2, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, length // 2:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def check_exact(export: Path, conversion: Conversion, built: list) -> None:
    """The copy's outputs against the export's own (the zoo's classes): hidden states, MLM logits, NSP or RTD logits;
    each difference is recorded on its part; one over `TOLERANCE` refuses the conversion."""
    from encoder_zoo import models

    model_type = conversion.config["model_type"]
    batch = probe_batch(conversion.config)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        zoo = models.get_class(model_type, "AutoModelForPreTraining").from_pretrained(export).eval()(**batch)
        hidden = models.get_class(model_type, "AutoModel").from_pretrained(export).eval()(**batch).last_hidden_state
        for part, model in zip(conversion.parts, built):
            if part.subfolder == RTD_FOLDER:
                part.checks["RTD logits"] = _diff(model(**batch).logits, zoo.rtd_logits, real)
                continue
            if part.subfolder == GENERATOR_FOLDER:
                masked_lm = models.get_class(model_type, "AutoModelForMaskedLM").from_pretrained(export).eval()
                part.checks["generator MLM logits"] = _diff(model(**batch).logits, masked_lm(**batch).logits, real)
                continue
            base = getattr(model, model.base_model_prefix, model)
            part.checks["hidden states"] = _diff(base(**batch).last_hidden_state, hidden, real)
            output = model(**batch)
            if conversion.family == "BERT":
                logits = output.prediction_logits if part.class_name == "BertForPreTraining" else output.logits
                part.checks["MLM logits"] = _diff(logits, zoo.mlm_logits, real)
                if part.class_name == "BertForPreTraining":
                    part.checks["NSP logits"] = float((output.seq_relationship_logits - zoo.nsp_logits).abs().max())
            elif part.class_name == "ElectraForPreTraining":
                part.checks["RTD logits"] = _diff(output.logits, zoo.rtd_logits, real)
    for part in conversion.parts:
        for output, difference in part.checks.items():
            if not difference <= TOLERANCE:
                raise ValueError(f"EXPORT {export}: the standard copy's {output} differ from the export's by "
                                 f"{difference:.2g} (> {TOLERANCE:g}); nothing was written.")


def _diff(a: torch.Tensor, b: torch.Tensor, real: torch.Tensor) -> float:
    return float((a - b).abs()[real].max())


def card_data_of(folder: Path) -> dict:
    """The front matter of a model card (README.md) in `folder`, read by huggingface_hub; empty without one."""
    from huggingface_hub import ModelCard

    card = folder / "README.md"
    if not card.is_file():
        return {}
    try:
        return ModelCard.load(card).data.to_dict()
    except Exception:  # a card without front matter, or one huggingface_hub cannot parse: no metadata
        return {}


def base_model_of(export: Path) -> str | None:
    """The Hub `base_model` the export's card names (the first Hub origin of a continued run), if any."""
    base_model = card_data_of(export).get("base_model")
    return base_model[0] if isinstance(base_model, list) and base_model else base_model or None


def write_card(output: Path, export: Path, conversion: Conversion, base_model: str | None) -> None:
    """The copy's README.md: its front matter (the export's licence and model name, `base_model`), what it holds and
    how it loads, what was dropped, and the measured differences to the export."""
    from encoder_zoo.hub_cards.metadata import display_name

    name = display_name(str(export))
    model_type = conversion.config["model_type"]
    pipeline = "fill-mask" if conversion.family == "BERT" else "feature-extraction"
    data = card_data_of(export)
    # A run's export lies in OUTPUT_DIR/export: without a card, the run folder names it.
    model_name = data.get("model_name") or (export.resolve().parent.name if export.resolve().name == "export"
                                             else export.resolve().name)
    title = f"{model_name} (standard {conversion.family} copy)"
    front = ["---", "library_name: transformers", f"license: {data.get('license') or 'apache-2.0'}",
             f"model_name: {model_name}", f"pipeline_tag: {pipeline}",
             f"tags:\n- {conversion.family.lower()}\n- {model_type}\n- pretraining-zoo"]
    if base_model:
        front.append(f"base_model: {base_model}")
    front.append("---")
    kept = []
    for part in conversion.parts:
        where = f"`{part.subfolder}/`" if part.subfolder else "this folder"
        checks = ", ".join(f"{output} {difference:.1g}" for output, difference in part.checks.items())
        kept.append(f"| {where} | `{part.class_name}` (layers {part.config['num_hidden_layers']}, width "
                    f"{part.config['hidden_size']}) | {checks} |")
    dropped = [f"| `{group}` | {why} |" for group, why in conversion.dropped.items()] or ["| (nothing) | |"]
    if conversion.family == "ELECTRA" and not any(part.subfolder == GENERATOR_FOLDER for part in conversion.parts):
        dropped.append(f"| `generator.*` | missing from the export itself (converted with --without_generator): "
                       f"this copy has no `{GENERATOR_FOLDER}/` |")
    lineage = (f" It continues `{base_model}` (the Hub model the export started from)." if base_model else "")
    top = conversion.parts[0].class_name
    if conversion.family == "BERT":
        usage = "`AutoModel`, `AutoModelForMaskedLM`, `AutoModelForPreTraining` and `pipeline(\"fill-mask\")`"
        if top == "BertForMaskedLM":
            usage += (" (it has no NSP head and no pooler, as the export has none: `AutoModelForPreTraining` and "
                      "`AutoModel` start those new, and say so)")
    else:
        folders = {part.subfolder for part in conversion.parts}
        usage = ("`AutoModel` and `AutoModelForPreTraining` (the discriminator)" if top == "ElectraForPreTraining" else
                 "`AutoModel` (the discriminator: the layers fine-tuning reads)")
        if RTD_FOLDER in folders:
            usage += (f", `AutoModelForPreTraining` on `{RTD_FOLDER}/` (TEAMS's RTD head reads its own task layer, "
                      "fed from the layer below the top: that path is a discriminator of its own, sharing the "
                      "embeddings and lower layers)")
        usage += (f", `AutoModelForMaskedLM` and `pipeline(\"fill-mask\")` on `{GENERATOR_FOLDER}/` (the generator)"
                  if GENERATOR_FOLDER in folders else "")
    text = [
        *front, "",
        f"# {title}", "",
        f"A standard {conversion.family} copy of the zoo export `{name}` ({model_type}), written by this project's "
        "`training/to_transformers.py`: no code files and no `auto_map`, so it loads without `trust_remote_code`, in "
        f"tools that refuse remote code or take only standard architectures, as any {conversion.family} checkpoint."
        f"{lineage}", "",
        f"It loads through {usage}. The body is the export's own; on a probe batch its outputs equal the export's "
        f"(loaded with its own code) to the differences below (max absolute, tolerance {TOLERANCE:g}).", "",
        "## Kept", "", "| folder | class | max difference to the export |", "| --- | --- | --- |", *kept, "",
        "## Dropped (no place in the standard architecture)", "", "| export tensors | why |", "| --- | --- |",
        *dropped, "",
        f"The export itself (`{name}`, with `trust_remote_code=True`) keeps every head and the pretraining objective's "
        "code; its card has the training details.", "",
    ]
    (output / "README.md").write_text("\n".join(text), encoding="utf-8")


def standard_tokenizer_config(folder: Path, family: str) -> None:
    """The saved tokenizer_config.json as transformers 4 and 5 both read it: BERT's or ELECTRA's fast tokenizer class,
    its normalisation stated as that class's arguments (which it would otherwise impose on tokenizer.json: BERT's
    default lowercases), and no machine-local or transformers-5-only entries."""
    path = folder / "tokenizer_config.json"
    config = {k: v for k, v in json.loads(path.read_text(encoding="utf-8")).items() if k not in TOKENIZER_LOCAL_KEYS}
    config["tokenizer_class"] = TOKENIZER_CLASSES[family]
    normalizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer":
        raise ValueError(f"EXPORT: its tokenizer's normaliser is {normalizer.get('type')}, not BERT's; a standard "
                         f"{family} copy's tokenizer ({TOKENIZER_CLASSES[family]}) would read text otherwise.")
    config.update(do_lower_case=normalizer.get("lowercase", True), strip_accents=normalizer.get("strip_accents"),
                  tokenize_chinese_chars=normalizer.get("handle_chinese_chars", True))
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def convert(export: str | Path, output: str | Path, overwrite: bool = False, without_generator: bool = False) -> Path:
    """Write the standard copy of `export` into `output` (refused where `output` holds files, unless `overwrite`);
    checked exact before anything is written. The copy is written beside `output` and renamed in; an old copy is
    renamed aside first and deleted only once the new one is in place, so a kill at any point leaves one whole copy
    (the old one, at OUTPUT or at OUTPUT.replaced-<time>)."""
    from transformers import AutoTokenizer

    export, output = Path(export).expanduser(), Path(output).expanduser()
    if not export.is_dir():
        raise FileNotFoundError(f"EXPORT {export}: no such folder (pass a zoo export, OUTPUT_DIR/export).")
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not overwrite:
        raise ValueError(f"OUTPUT {output} exists and is not empty; pass --overwrite to replace it, or another "
                         "folder.")
    if output.resolve() == export.resolve() or export.resolve() in output.resolve().parents:
        raise ValueError(f"OUTPUT {output} is the export or inside it; pass a folder beside it.")
    config, tensors = read_export(export)
    conversion = conversion_of(config, tensors, without_generator)
    built = [build(part, tensors) for part in conversion.parts]
    check_exact(export, conversion, built)
    tokenizer = AutoTokenizer.from_pretrained(export)
    staging = output.with_name(output.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        for part, model in zip(conversion.parts, built):
            folder = staging / part.subfolder
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            standard_tokenizer_config(folder, conversion.family)
        write_card(staging, export, conversion, base_model_of(export))
    except BaseException:  # nothing half-written is left behind
        shutil.rmtree(staging, ignore_errors=True)
        raise
    aside = None
    if output.exists():
        aside = output.with_name(f"{output.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        output.rename(aside)
    staging.rename(output)
    if aside is not None:
        shutil.rmtree(aside) if aside.is_dir() else aside.unlink()
    return output
