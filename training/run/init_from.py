"""Start a run from published weights (`training/pretrain.py --init_from`): find the checkpoint (a folder or a Hub id),
read its architecture, and plan, before anything is written, which tensor each parameter of the new model takes
through the family's key mapping; then load them.

Nothing loads silently: each parameter of the new model is either loaded (its name maps to a checkpoint tensor of
the same shape) or new, with the initialisation it keeps, and each checkpoint tensor that nothing reads is named
(`InitPlan.table`, written to the run folder and the export's card). A shape mismatch is refused, naming the
tensor and both shapes, unless `--ignore_mismatched_sizes`.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from encoder_zoo.training.run.loading import damaged_weights, missing_local_path

logger = logging.getLogger(__name__)

MAIN, GENERATOR = "--init_from", "--init_generator_from"
RECORD = "init_from.json"  # the plan, in the run folder and the export
# A checkpoint's config.json keys that describe the file or how it was run, not the architecture: a continued run
# takes its own (`unpad` from its --unpad flag).
BOOKKEEPING_KEYS = ("architectures", "auto_map", "transformers_version", "_name_or_path", "model_type", "dtype",
                    "torch_dtype", "use_cache", "gradient_checkpointing", "unpad")


@dataclass(frozen=True)
class RowMap:
    """`--resize_embeddings`: for each row of the run's vocabulary (its token id), the checkpoint row it takes (the
    same token's), or -1 for a new row (a token the checkpoint's vocabulary lacks)."""

    old_size: int
    old_ids: tuple[int, ...]

    @property
    def new_size(self) -> int:
        return len(self.old_ids)

    @property
    def new_rows(self) -> list[int]:
        return [new for new, old in enumerate(self.old_ids) if old < 0]

    def describe(self, tokenizer) -> str:
        """One sentence: how many rows are copied, and which are new (ids and tokens, the first 20)."""
        new = self.new_rows
        tokens = tokenizer.convert_ids_to_tokens(new[:20])
        shown = ", ".join(f"{i} {token}" for i, token in zip(new, tokens)) + (", ..." if len(new) > 20 else "")
        return (f"--resize_embeddings: the vocabulary-sized tensors go from {self.old_size} to {self.new_size} rows; "
                f"{self.new_size - len(new)} take the checkpoint's row of the same token, {len(new)} are new"
                + (f" (id token: {shown})" if new else ""))


@dataclass(frozen=True)
class Checkpoint:
    """A model folder named by `flag`: as the user gave it (`name`), where it lies, and its config.json."""

    flag: str
    name: str
    folder: Path
    config: dict
    rows: RowMap | None = None  # --resize_embeddings: which row of its vocabulary-sized tensors each new row takes
    read_notes: tuple[str, ...] = ()  # how it was read, for the load table (a config.json without model_type)

    @property
    def model_type(self) -> str | None:
        return self.config.get("model_type")

    @property
    def notes(self) -> tuple[str, ...]:
        return self.read_notes

    @property
    def hub_id(self) -> str | None:
        """Its Hub id where known (a Hub id given, or the shipped MiniLM), for the card's `base_model`."""
        if not Path(self.name).expanduser().exists():
            return self.name
        from encoder_zoo.hub_cards.origins import hub_origin

        origin = hub_origin(self.folder)
        return origin[0] if origin else None

    @property
    def lineage(self) -> list[dict]:
        """The starting points this checkpoint itself continues, oldest first, as its own init_from.json records them
        (an export of a continued run keeps it); empty where none is recorded."""
        try:
            earlier = json.loads((self.folder / RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none recorded: a standard copy's card still names the Hub model it continues
            from encoder_zoo.training.run.standard_copy import base_model_of

            base_model = base_model_of(self.folder)
            return [{"name": base_model, "hub_id": base_model, "model_type": None}] if base_model else []
        main = earlier.get("checkpoints", {}).get(MAIN)
        return list(earlier.get("chain") or ([main] if main else []))

    @property
    def display(self) -> str:
        """How a card names it: its Hub id, or the folder's last two parts (never an absolute local path)."""
        return self.hub_id or "/".join(self.folder.resolve().parts[-2:])

    def weight_files(self) -> list[Path]:
        files = sorted(self.folder.glob("*.safetensors"))
        return files or sorted(self.folder.glob("pytorch_model*.bin"))

    @functools.cached_property
    def _file_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each tensor's shape under the file's own key, read from the safetensors headers (a .bin is loaded)."""
        from safetensors import safe_open

        shapes = {}
        for file in self.weight_files():
            if file.suffix == ".bin":
                shapes.update({key: tuple(value.shape) for key, value in _load_bin(file).items()})
                continue
            with safe_open(str(file), framework="pt") as handle:
                shapes.update({key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()})
        return shapes

    @functools.cached_property
    def _renamed(self) -> dict[str, str]:
        """Standard key -> the file's key, where transformers' own loading renames it (`standard_key`); a state
        dict wholly under `decoder.` (the SpanBERT authors' fairseq model's) without it, as their from_pretrained
        reads it."""
        keys = set(self._file_shapes)
        under = "decoder." if keys and all(key.startswith("decoder.") for key in keys) else ""
        return {standard: key for key in keys for standard in [standard_key(key.removeprefix(under))]
                if standard != key and standard not in keys}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each tensor's shape under its standard key (LayerNorm `gamma`/`beta` as `weight`/`bias`, ...)."""
        theirs = {key: standard for standard, key in self._renamed.items()}
        return {theirs.get(key, key): shape for key, shape in self._file_shapes.items()}

    def source_key(self, key: str) -> str:
        """The key in the checkpoint's file that the standard `key` was read from."""
        return self._renamed.get(key, key)

    def tensors(self, keys) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        wanted = {self.source_key(key): key for key in keys}
        found = {}
        for file in self.weight_files():
            if file.suffix == ".bin":
                found.update({wanted[k]: v for k, v in _load_bin(file).items() if k in wanted})
                continue
            with safe_open(str(file), framework="pt") as handle:
                found.update({wanted[key]: handle.get_tensor(key) for key in handle.keys() if key in wanted})
        return found


@functools.cache
def _legacy_renamings() -> list:
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    return get_checkpoint_conversion_mapping("legacy") or []


def standard_key(key: str) -> str:
    """A checkpoint key as transformers' own loading renames it: its "legacy" renamings (LayerNorm `gamma`/`beta` ->
    `weight`/`bias`, `weight_g`/`weight_v` -> weight-norm parametrizations), then a last `.gamma`/`.beta` as `.weight`/
    `.bias`, as the SpanBERT authors' own `from_pretrained` renames them."""
    try:
        from transformers.core_model_loading import rename_source_key

        key, _ = rename_source_key(key, _legacy_renamings(), [])
    except ImportError:  # a transformers without these modules: the two renamings every release has
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))
    return re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", key))


@dataclass(frozen=True)
class FairseqCheckpoint(Checkpoint):
    """The SpanBERT authors' fairseq `model.pt` (`file`), read by `training.run.fairseq_checkpoint` (`contents`: its
    tensors under SpanBERT's names, each one's key in their file, notes for the load table)."""

    file: Path = Path()
    contents: object = field(default=None, compare=False, repr=False)

    @property
    def hub_id(self) -> str | None:
        return None

    @property
    def display(self) -> str:
        return "/".join(self.file.resolve().parts[-2:])

    @property
    def notes(self) -> tuple[str, ...]:
        return (*self.contents.notes, *self.read_notes)

    def weight_files(self) -> list[Path]:
        return [self.file]

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(tensor.shape) for name, tensor in self.contents.tensors.items()}

    def tensors(self, keys) -> dict[str, torch.Tensor]:
        return {key: self.contents.tensors[key] for key in keys if key in self.contents.tensors}

    def source_key(self, key: str) -> str:
        """The key in their file that our `key` was read from."""
        return self.contents.renamed.get(key, key)


def _load_bin(file: Path) -> dict[str, torch.Tensor]:
    try:
        return torch.load(file, map_location="cpu", weights_only=True)  # tensors only: no pickled code runs
    except Exception as error:  # a truncated or foreign file: torch raises several types
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise OSError(f"{file} is truncated or not a PyTorch weights file ({reason}); re-export or re-download the "
                      "checkpoint.") from None


def find_checkpoint(name: str, flag: str, config_name: str | None = None) -> Checkpoint:
    """The checkpoint a flag names: a local model folder, or a Hub id (downloaded, or read from the local cache when
    offline); every failure names the flag and the way out. `config_name` (--config_name): the architecture of a bare
    state dict, which holds none."""
    from encoder_zoo.training.run.fairseq_checkpoint import is_fairseq_checkpoint, read_fairseq_checkpoint

    path = Path(name).expanduser()
    if is_fairseq_checkpoint(path):  # the SpanBERT authors' fairseq model.pt, or a bare state dict of theirs
        contents = read_fairseq_checkpoint(path, name, flag, config_name)
        return FairseqCheckpoint(flag, name, path.parent, contents.config, file=path, contents=contents)
    if config_name:
        raise ValueError(f"--config_name applies to a bare state dict (a .pt file); {name} is a model folder or Hub "
                         "id, whose config.json gives the architecture. Drop --config_name.")
    if path.exists() or missing_local_path(name):
        if not path.is_dir():
            raise FileNotFoundError(f"{flag} {name}: no such folder (pass a model folder, as save_pretrained writes "
                                    "it, a Hub id NAME or ORG/NAME, or the SpanBERT authors' fairseq model.pt).")
        folder = path
    else:
        folder = _download(name, flag)
    config_file = folder / "config.json"
    if not config_file.is_file() and (folder / "bert_config.json").is_file():
        config_file = folder / "bert_config.json"  # the SpanBERT authors' (and Google's BERT's) older name
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{flag} {name}: {config_file} does not exist; pass a model folder that "
                                "save_pretrained wrote (config.json beside the weights).") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{flag} {name}: {config_file} is not valid JSON ({error}).") from None
    notes = ()
    if "model_type" not in config and is_bert_config(config):
        config = {**config, "model_type": "bert"}
        notes = (f"`{config_file.name}` has no model_type; its fields are BERT's (as the SpanBERT authors' "
                 "pytorch_pretrained_bert BertConfig writes them): read as BERT.",)
    checkpoint = Checkpoint(flag, name, folder, config, read_notes=notes)
    if not checkpoint.weight_files():
        raise FileNotFoundError(f"{flag} {name}: {folder} holds no weights (*.safetensors or pytorch_model*.bin).")
    problem = damaged_weights(str(folder))
    if problem:
        raise OSError(f"{flag} {name}: {problem}; re-export or re-download the checkpoint.")
    return checkpoint


# The fields of the SpanBERT authors' BertConfig (pytorch_pretrained_bert), which writes no model_type.
BERT_CONFIG_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "hidden_act",
                      "intermediate_size", "hidden_dropout_prob", "attention_probs_dropout_prob",
                      "max_position_embeddings", "type_vocab_size", "initializer_range")


def is_bert_config(config: dict) -> bool:
    """A config.json without model_type that has BERT's fields and nothing of another architecture's (ELECTRA's
    embedding_size)."""
    return all(key in config for key in BERT_CONFIG_FIELDS) and "embedding_size" not in config


def _download(repo_id: str, flag: str) -> Path:
    """A Hub model's config, weights and tokenizer files; offline, the cached copy or an error in seconds."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_OFFLINE

    patterns = ["*.json", "*.txt", "*.model", "*.safetensors"]
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=HF_HUB_OFFLINE,
                                        etag_timeout=10))
        if not any(folder.glob("*.safetensors")):  # an older checkpoint: its pickled-tensor weights
            folder = Path(snapshot_download(repo_id, allow_patterns=[*patterns, "pytorch_model*.bin"],
                                            local_files_only=HF_HUB_OFFLINE, etag_timeout=10))
    except Exception as error:  # offline, no such repo, no network: huggingface_hub raises several types
        reason = ("the Hub is off (HF_HUB_OFFLINE=1) and it is not in the local cache" if HF_HUB_OFFLINE
                  else str(error).strip().splitlines()[0])
        raise ValueError(f"{flag} {repo_id}: cannot read it from the Hub ({reason}). Pass a local model folder "
                         f"instead (e.g. one saved with save_pretrained, or `hf download {repo_id} "
                         "--local-dir DIR` on a machine online).") from None
    return folder


# Files that hold a tokenizer's vocabulary (tokenizer_config.json and special_tokens_map.json only describe one).
VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                    "sentencepiece.bpe.model")
SPECIAL_TOKENS = ("pad", "unk", "cls", "sep", "mask", "bos", "eos")


def checkpoint_tokenizer(checkpoint: Checkpoint):
    """The tokenizer saved beside a checkpoint's weights, or None when its folder holds no vocabulary file."""
    from encoder_zoo.training.data.tokenizer import load_tokenizer

    if not any((checkpoint.folder / name).is_file() for name in VOCABULARY_FILES):
        return None
    return load_tokenizer(str(checkpoint.folder), f"{checkpoint.flag} {checkpoint.name}")


def _special_ids(tokenizer) -> dict[str, int]:
    return {getattr(tokenizer, f"{kind}_token"): getattr(tokenizer, f"{kind}_token_id") for kind in SPECIAL_TOKENS
            if getattr(tokenizer, f"{kind}_token_id", None) is not None}


def vocabulary_rows(checkpoint: Checkpoint, embeddings: int, own, tokenizer, tokenizer_name: str | None,
                    resize: bool) -> RowMap | None:
    """Check the run's tokenizer against the checkpoint's vocabulary, before anything is written: its own tokenizer
    (`own`; None when the folder has none) and its `embeddings` rows (config.json's vocab_size). A different
    vocabulary (size, special token ids, or any token at another id) would read other tokens' rows, so it is refused,
    naming both, unless `resize` (--resize_embeddings): then the rows are mapped token by token (`RowMap`; by id when
    the checkpoint has no tokenizer). None when the vocabularies agree."""
    where = f"{MAIN} {checkpoint.name}"
    if tokenizer_name is None:
        if own is None:
            raise FileNotFoundError(
                f"{where}: {checkpoint.folder} holds no tokenizer ({', '.join(VOCABULARY_FILES[:3])}, ...), and the "
                "checkpoint's vocabulary comes with it; pass --tokenizer_name with the tokenizer its weights were "
                "trained with.")
        if len(own) <= embeddings:
            return None
        if not resize:
            raise ValueError(
                f"{where}: its tokenizer has {len(own)} tokens, more than its {embeddings} embedding rows "
                "(config.json's vocab_size): the folder's tokenizer and weights disagree. Pass --tokenizer_name with "
                "the tokenizer its weights were trained with, or --resize_embeddings to give the "
                f"{len(own) - embeddings} tokens beyond them new rows.")
        return _rows(own, own, embeddings)
    if own is not None and len(own) > embeddings:  # its own disagrees with its weights: judged as if it had none
        own = None
    differences = []
    new_special = _special_ids(tokenizer)
    if own is not None:
        if len(tokenizer) != len(own):
            differences.append(f"{len(tokenizer)} tokens against {len(own)}")
        old_special = _special_ids(own)
        differences += [f"{token} {new_special.get(token)} against {old_special.get(token)}"
                        for token in sorted(set(old_special) | set(new_special))
                        if new_special.get(token) != old_special.get(token)]
        old_vocab = own.get_vocab()
        moved = sum(old_vocab.get(token) != i for token, i in tokenizer.get_vocab().items())
        if moved and not differences:
            differences.append(f"{moved} tokens at other ids")
    else:
        differences += [f"{token} {new_special[token]} against its config.json's {kind}_token_id "
                        f"{checkpoint.config[f'{kind}_token_id']}"
                        for kind in SPECIAL_TOKENS for token in [getattr(tokenizer, f"{kind}_token", None)]
                        if token in new_special and checkpoint.config.get(f"{kind}_token_id") not in (
                            None, new_special[token])]
    if len(tokenizer) > embeddings and not differences:
        differences.append(f"{len(tokenizer)} tokens, more than its {embeddings} embedding rows")
    if own is None and not differences:
        logger.info("%s has no tokenizer: --tokenizer_name %s is taken as its vocabulary (%d tokens for %d embedding "
                    "rows; the special token ids agree with its config.json).", where, tokenizer_name,
                    len(tokenizer), embeddings)
    if not differences:
        return None
    if not resize:
        raise ValueError(
            f"--tokenizer_name {tokenizer_name} is another vocabulary than {where}'s ({'; '.join(differences)}): its "
            "ids would read other tokens' embedding rows. "
            + ("Drop --tokenizer_name (the checkpoint's own tokenizer is the default)" if own is not None else
               "Pass the tokenizer its weights were trained with")
            + ", or pass --resize_embeddings to map the embeddings onto it "
            + ("token by token (tokens the checkpoint lacks get new rows)." if own is not None else
               "by id (ids beyond its rows get new ones)."))
    return _rows(own, tokenizer, embeddings)


def _rows(own, tokenizer, embeddings: int) -> RowMap:
    """Each of `tokenizer`'s ids -> the checkpoint row of the same token in `own` (by id without `own`), or -1."""
    if own is None:
        return RowMap(embeddings, tuple(i if i < embeddings else -1 for i in range(len(tokenizer))))
    old_vocab = {token: i for token, i in own.get_vocab().items() if i < embeddings}
    ids = [-1] * len(tokenizer)
    for token, i in tokenizer.get_vocab().items():
        if i < len(ids):
            ids[i] = old_vocab.get(token, -1)
    return RowMap(embeddings, tuple(ids))


@dataclass
class InitPlan:
    """Which checkpoint tensor each parameter of the new model takes: `loads` (parameter -> (flag, key)), `new`
    (parameters no checkpoint has), `mismatched` (parameter -> (flag, key, checkpoint shape), left new under
    --ignore_mismatched_sizes) and `unused` ((flag, key) that nothing reads). `notes`: what has no counterpart in the
    checkpoint, in words (e.g. TEAMS's MWS head)."""

    checkpoints: dict[str, Checkpoint]
    loads: dict[str, tuple[str, str]] = field(default_factory=dict)
    new: list[str] = field(default_factory=list)
    mismatched: dict[str, tuple[str, str, tuple]] = field(default_factory=dict)
    unused: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    resized: list[str] = field(default_factory=list)  # loaded row by row (`Checkpoint.rows`, --resize_embeddings)
    initialisation: dict[str, str] = field(default_factory=dict)  # new parameter -> how it starts, once applied
    tokenizer: str | None = None  # --tokenizer_name, as a card may name it; None: the checkpoint's own

    def table(self) -> str:
        """One short Markdown table: parameters grouped by module (layer numbers collapsed), with their source; a new
        group's row counts its tensors by how they start. No name is hidden: a module whose tensors have several
        sources is split into its submodules, and a row of one tensor names it in full."""
        entries = []  # (parameter or checkpoint key, row prefix, source, checkpoint key read, source suffix, start)
        for name, (flag, key) in self.loads.items():
            remapped = " (rows by token, --resize_embeddings)" if name in self.resized else ""
            entries.append((name, "", f"loaded from {flag}", self.source_key(flag, key), remapped, ""))
        for name in self.new:
            why = " (shape mismatch ignored)" if name in self.mismatched else ""
            start = self.initialisation.get(name, "the model's initialisation")
            entries.append((name, "", f"new{why}", None, "", start))
        entries += [(self.source_key(flag, key), f"({flag}) ", "in the checkpoint, not used", None, "", "")
                    for flag, key in self.unused]

        def row(entry, fine: bool) -> tuple[str, str]:
            name, prefix, source, key, suffix, _ = entry
            return f"{prefix}`{_group(name, fine)}`", (f"{source} `{_group(key, fine)}`{suffix}" if key else source)

        sources: dict[str, set[str]] = {}
        for entry in entries:
            group, source = row(entry, fine=False)
            sources.setdefault(group, set()).add(source)
        rows: dict[tuple[str, str], list] = {}
        for entry in entries:
            rows.setdefault(row(entry, fine=len(sources[row(entry, fine=False)[0]]) > 1), []).append(entry)
        lines = ["| parameters | tensors | source |", "| --- | --- | --- |"]
        for (group, source), members in rows.items():
            if len(members) == 1:
                name, prefix, source, key, suffix, _ = members[0]
                group, source = f"{prefix}`{name}`", (f"{source} `{key}`{suffix}" if key else source)
            starts = [member[-1] for member in members]
            counts = {start: starts.count(start) for start in starts if start}
            how = ": " + ", ".join(f"{start} ({n})" if len(counts) > 1 else start for start, n in counts.items())
            lines.append(f"| {group} | {len(members)} | {source}{how if counts else ''} |")
        return "\n".join(lines)

    def source_key(self, flag: str, key: str) -> str:
        """The checkpoint's own name for `key` (a fairseq checkpoint's tensors are read under SpanBERT's names)."""
        checkpoint = self.checkpoints.get(flag)
        return checkpoint.source_key(key) if hasattr(checkpoint, "source_key") else key

    def summary(self) -> str:
        total = len(self.loads) + len(self.new)
        return (f"{len(self.loads)} of {total} parameter tensors loaded, {len(self.new)} new, "
                f"{len(self.unused)} checkpoint tensors not used")

    def chain(self) -> list[dict]:
        """Every starting point of this run, oldest first: what --init_from itself continues (phase 1's start, a DAPT
        run's), then --init_from."""
        main = self.checkpoints.get(MAIN)
        if main is None:
            return []
        return [*main.lineage, {"name": main.display, "hub_id": main.hub_id, "model_type": main.model_type}]

    def record(self) -> dict:
        chain = self.chain()
        return {
            "chain": chain,
            "base_model": next((start["hub_id"] for start in chain if start.get("hub_id")), None),
            "checkpoints": {flag: {"name": c.display, "hub_id": c.hub_id, "model_type": c.model_type}
                            for flag, c in self.checkpoints.items()},
            "summary": self.summary(),
            "tokenizer": self.tokenizer,
            "table": self.table(),
            "loaded": {name: f"{flag} {self.source_key(flag, key)}" for name, (flag, key) in self.loads.items()},
            "new": {name: self.initialisation.get(name, "the model's initialisation") for name in self.new},
            "mismatched": {name: f"{flag} {key} {list(shape)}" for name, (flag, key, shape) in self.mismatched.items()},
            "resized": self.resized,
            "unused": [f"{flag} {self.source_key(flag, key)}" for flag, key in self.unused],
            "notes": self.notes,
        }

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / RECORD).write_text(json.dumps(self.record(), indent=1))


def _group(name: str, fine: bool = False) -> str:
    """A module's name with layer numbers collapsed: `encoder.layer.3.output.dense.weight` -> `encoder.layer.*.output`
    (the table's rows); `fine`: one level deeper, `encoder.layer.*.output.dense`."""
    collapsed = re.sub(r"\.\d+(?=\.)", ".*", name)
    parts = collapsed.split(".")
    return ".".join(parts[:-2] if len(parts) > 3 and not fine else parts[:-1] or parts) + ".*"


def plan(model: torch.nn.Module, checkpoints: dict[str, Checkpoint],
         sources: Callable[[str], list[tuple[str, str]]], also_reads: Callable[[str], list[tuple[str, str]]],
         ignore_mismatched_sizes: bool, notes: list[str]) -> InitPlan:
    """Map each parameter of `model` (built on the meta device: only names and shapes count) to the first of its
    `sources` that a checkpoint holds. `also_reads(name)`: checkpoint tensors a parameter accounts for without loading
    them (a decoder tied to the word embeddings). A shape mismatch raises ValueError, naming both shapes."""
    shapes = {flag: checkpoint.shapes() for flag, checkpoint in checkpoints.items()}
    own_notes = [note for checkpoint in checkpoints.values() for note in getattr(checkpoint, "notes", ())]
    result = InitPlan(checkpoints, notes=[*notes, *own_notes])
    used: set[tuple[str, str]] = set()
    for name, parameter in model.named_parameters():
        for flag, key in sources(name):
            if key not in shapes.get(flag, {}):
                continue
            used.add((flag, key))
            rows = checkpoints[flag].rows
            if rows is not None and shapes[flag][key][:1] == (rows.old_size,) and tuple(parameter.shape[:1]) == (
                    rows.new_size,) and shapes[flag][key][1:] == tuple(parameter.shape[1:]):
                result.loads[name] = (flag, key)  # a vocabulary-sized tensor: loaded row by row
                result.resized.append(name)
                break
            if shapes[flag][key] != tuple(parameter.shape):
                if not ignore_mismatched_sizes:
                    raise ValueError(
                        f"{flag} {checkpoints[flag].name}: its tensor {key} has shape {list(shapes[flag][key])}, but "
                        f"the new model's {name} has {list(parameter.shape)}. Start from a checkpoint of the same "
                        "architecture (vocabulary, widths and positions come from it; a --tokenizer_name larger than "
                        "its vocabulary changes the embeddings), or pass --ignore_mismatched_sizes to leave such "
                        "parameters newly initialised.")
                result.mismatched[name] = (flag, key, shapes[flag][key])
                break
            result.loads[name] = (flag, key)
            break
        if name not in result.loads:
            result.new.append(name)
    for name, _ in model.named_parameters(remove_duplicate=False):
        used.update(pair for pair in also_reads(name) if pair[1] in shapes.get(pair[0], {}))
    result.unused = [(flag, key) for flag, keys in shapes.items() for key in keys if (flag, key) not in used]
    _refuse_reset(model, result, shapes, sources)
    return result


def _refuse_reset(model: torch.nn.Module, result: InitPlan, shapes: dict, sources) -> None:
    """No parameter may start new while a checkpoint tensor of its shape goes unused under a name that maps to it:
    the key, after transformers' renamings (`standard_key`) and whatever prefix it sits under, ends with one of the
    parameter's sources or with its own name below the model's top module. Refused in one line, naming both."""
    parameters = dict(model.named_parameters())
    unused = [(flag, key, standard_key(key)) for flag, key in result.unused]
    for name in result.new:
        if name in result.mismatched:
            continue
        below = name.partition(".")[2]
        targets = {key for _, key in sources(name)} | {name} | ({below} if below.count(".") >= 2 else set())
        for flag, key, standard in unused:
            if shapes[flag][key] != tuple(parameters[name].shape):
                continue
            target = next((t for t in targets if standard == t or standard.endswith("." + t)), None)
            if target is None:
                continue
            checkpoint = result.checkpoints[flag]
            theirs = checkpoint.source_key(key) if hasattr(checkpoint, "source_key") else key
            raise ValueError(
                f"{flag} {checkpoint.name}: its tensor {theirs} {list(shapes[flag][key])} would go unused while the "
                f"new model's {name}, of the same shape, starts new, though its name maps to it ({target}); refused "
                "rather than reset. Save the checkpoint under the names transformers' from_pretrained reads "
                f"({', '.join(sorted(k for _, k in sources(name))) or name}), or report its layout.")


def weights_problem(init: InitPlan) -> str | None:
    """What is wrong with the tensors `init` loads, in one sentence naming them (None if nothing): NaN/inf, or values
    beyond `trainer.HUGE_WEIGHT`, which no training recovers from. Read before the run folder is made, so that a
    damaged checkpoint is refused at once rather than at the first step."""
    from encoder_zoo.training.run.trainer import HUGE_WEIGHT

    non_finite, huge, total = [], [], 0
    for flag, checkpoint in init.checkpoints.items():
        keys = {key for f, key in init.loads.values() if f == flag}
        for key, value in checkpoint.tensors(keys).items():
            if not value.is_floating_point() or not value.numel():
                continue
            total += 1
            if not torch.isfinite(value).all():
                non_finite.append(f"{flag} {key}")
            elif value.abs().max().item() > HUGE_WEIGHT:
                huge.append((f"{flag} {key}", value.abs().max().item()))
    if non_finite:
        shown = ", ".join(non_finite[:3]) + (", ..." if len(non_finite) > 3 else "")
        return (f"{len(non_finite)} of the {total} weight tensors it would load hold NaN/inf ({shown}): the checkpoint "
                "is damaged; re-export or re-download it")
    if huge:
        name, value = max(huge, key=lambda item: item[1])
        return (f"its weights hold values up to {value:.3g} in magnitude ({name}"
                + (f" and {len(huge) - 1} more tensors" if len(huge) > 1 else "") + "), which overflow in fp32: the "
                "checkpoint is damaged; re-export or re-download it")
    return None


def apply(model: torch.nn.Module, init: InitPlan) -> None:
    """Copy each planned tensor into `model` and record how each new parameter starts (read off its values)."""
    parameters = dict(model.named_parameters())
    for flag, checkpoint in init.checkpoints.items():
        names = {name: key for name, (f, key) in init.loads.items() if f == flag}  # a key may start several (copies)
        tensors = checkpoint.tensors(set(names.values()))
        with torch.no_grad():
            for name, key in names.items():
                value = tensors[key].to(parameters[name].dtype)
                if name in init.resized:  # the rows of tokens the checkpoint has; the others keep their initialisation
                    old = torch.tensor(checkpoint.rows.old_ids)
                    parameters[name][old >= 0] = value[old[old >= 0]]
                else:
                    parameters[name].copy_(value)
    init.initialisation = {name: _describe_init(parameters[name]) for name in init.new}
    model.tie_weights()


def _describe_init(parameter: torch.Tensor) -> str:
    values = parameter.detach().float()
    if torch.all(values == 0):
        return "zeros"
    if torch.all(values == 1):
        return "ones"
    return f"random (std {values.std().item():.1g})"
