"""Start a run from published weights (`training/pretrain.py --init_from`): find the checkpoint (a folder or a Hub id),
read its architecture, and plan, before anything is written, which tensor each parameter of the new model takes
through the family's key mapping; then load them.

Nothing loads silently: each parameter of the new model is either loaded (its name maps to a checkpoint tensor of
the same shape) or new, with the initialisation it keeps, and each checkpoint tensor that nothing reads is named
(`InitPlan.table`, written to the run folder and the export's card). A shape mismatch is refused, naming the
tensor and both shapes, unless `--ignore_mismatched_sizes`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from encoder_zoo.training.run.loading import missing_local_path

logger = logging.getLogger(__name__)

MAIN, GENERATOR = "--init_from", "--init_generator_from"
RECORD = "init_from.json"  # the plan, in the run folder and the export
# A checkpoint's config.json keys that describe the file or how it was run, not the architecture: a continued run
# takes its own (`unpad` from its --unpad flag).
BOOKKEEPING_KEYS = ("architectures", "auto_map", "transformers_version", "_name_or_path", "model_type", "dtype",
                    "torch_dtype", "use_cache", "gradient_checkpointing", "unpad")


@dataclass(frozen=True)
class Checkpoint:
    """A model folder named by `flag`: as the user gave it (`name`), where it lies, and its config.json."""

    flag: str
    name: str
    folder: Path
    config: dict

    @property
    def model_type(self) -> str | None:
        return self.config.get("model_type")

    @property
    def hub_id(self) -> str | None:
        """Its Hub id where known (a Hub id given, or the shipped MiniLM), for the card's `base_model`."""
        if not Path(self.name).expanduser().exists():
            return self.name
        from encoder_zoo.training.data.resources import hub_origin

        origin = hub_origin(self.folder)
        return origin[0] if origin else None

    @property
    def display(self) -> str:
        """How a card names it: its Hub id, or the folder's last two parts (never an absolute local path)."""
        return self.hub_id or "/".join(self.folder.resolve().parts[-2:])

    def weight_files(self) -> list[Path]:
        files = sorted(self.folder.glob("*.safetensors"))
        return files or sorted(self.folder.glob("pytorch_model*.bin"))

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each tensor's shape, read from the safetensors headers (a .bin checkpoint is loaded)."""
        from safetensors import safe_open

        shapes = {}
        for file in self.weight_files():
            if file.suffix == ".bin":
                shapes.update({key: tuple(value.shape) for key, value in _load_bin(file).items()})
                continue
            with safe_open(str(file), framework="pt") as handle:
                shapes.update({key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()})
        return shapes

    def tensors(self, keys) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        wanted, found = set(keys), {}
        for file in self.weight_files():
            if file.suffix == ".bin":
                found.update({k: v for k, v in _load_bin(file).items() if k in wanted})
                continue
            with safe_open(str(file), framework="pt") as handle:
                found.update({key: handle.get_tensor(key) for key in handle.keys() if key in wanted})
        return found


def _load_bin(file: Path) -> dict[str, torch.Tensor]:
    return torch.load(file, map_location="cpu", weights_only=True)  # tensors only: no pickled code runs


def find_checkpoint(name: str, flag: str) -> Checkpoint:
    """The checkpoint a flag names: a local model folder, or a Hub id (downloaded, or read from the local cache when
    offline); every failure names the flag and the way out."""
    from encoder_zoo.training.run.fairseq_checkpoint import is_fairseq_checkpoint, read_fairseq_checkpoint

    path = Path(name).expanduser()
    if is_fairseq_checkpoint(path):  # the SpanBERT authors' fairseq model.pt
        return read_fairseq_checkpoint(path, name, flag)
    if path.exists() or missing_local_path(name):
        if not path.is_dir():
            raise FileNotFoundError(f"{flag} {name}: no such folder (pass a model folder, as save_pretrained writes "
                                    "it, a Hub id NAME or ORG/NAME, or the SpanBERT authors' fairseq model.pt).")
        folder = path
    else:
        folder = _download(name, flag)
    config_file = folder / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{flag} {name}: {config_file} does not exist; pass a model folder that "
                                "save_pretrained wrote (config.json beside the weights).") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{flag} {name}: {config_file} is not valid JSON ({error}).") from None
    checkpoint = Checkpoint(flag, name, folder, config)
    if not checkpoint.weight_files():
        raise FileNotFoundError(f"{flag} {name}: {folder} holds no weights (*.safetensors or pytorch_model*.bin).")
    return checkpoint


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
    initialisation: dict[str, str] = field(default_factory=dict)  # new parameter -> how it starts, once applied

    def table(self) -> str:
        """One short Markdown table: parameters grouped by module (layer numbers collapsed), with their source; a new
        group's row counts its tensors by how they start."""
        rows: dict[tuple[str, str], list[str]] = {}
        for name, (flag, key) in self.loads.items():
            rows.setdefault((f"`{_group(name)}`", f"loaded from {flag} `{_group(self.source_key(flag, key))}`"),
                            []).append("")
        for name in self.new:
            why = " (shape mismatch ignored)" if name in self.mismatched else ""
            rows.setdefault((f"`{_group(name)}`", f"new{why}"), []).append(
                self.initialisation.get(name, "the model's initialisation"))
        for flag, key in self.unused:
            rows.setdefault((f"({flag}) `{_group(self.source_key(flag, key))}`", "in the checkpoint, not used"),
                            []).append("")
        lines = ["| parameters | tensors | source |", "| --- | --- | --- |"]
        for (group, source), starts in rows.items():
            counts = {start: starts.count(start) for start in starts if start}
            how = ": " + ", ".join(f"{start} ({n})" if len(counts) > 1 else start for start, n in counts.items())
            lines.append(f"| {group} | {len(starts)} | {source}{how if counts else ''} |")
        return "\n".join(lines)

    def source_key(self, flag: str, key: str) -> str:
        """The checkpoint's own name for `key` (a fairseq checkpoint's tensors are read under SpanBERT's names)."""
        checkpoint = self.checkpoints.get(flag)
        return checkpoint.source_key(key) if hasattr(checkpoint, "source_key") else key

    def summary(self) -> str:
        total = len(self.loads) + len(self.new)
        return (f"{len(self.loads)} of {total} parameter tensors loaded, {len(self.new)} new, "
                f"{len(self.unused)} checkpoint tensors not used")

    def record(self) -> dict:
        return {
            "checkpoints": {flag: {"name": c.display, "hub_id": c.hub_id, "model_type": c.model_type}
                            for flag, c in self.checkpoints.items()},
            "summary": self.summary(),
            "table": self.table(),
            "loaded": {name: f"{flag} {self.source_key(flag, key)}" for name, (flag, key) in self.loads.items()},
            "new": {name: self.initialisation.get(name, "the model's initialisation") for name in self.new},
            "mismatched": {name: f"{flag} {key} {list(shape)}" for name, (flag, key, shape) in self.mismatched.items()},
            "unused": [f"{flag} {self.source_key(flag, key)}" for flag, key in self.unused],
            "notes": self.notes,
        }

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / RECORD).write_text(json.dumps(self.record(), indent=1))


def _group(name: str) -> str:
    """A module's name with layer numbers collapsed: `encoder.layer.3.output.dense.weight` -> `encoder.layer.*.output`
    (the table's rows)."""
    collapsed = re.sub(r"\.\d+(?=\.)", ".*", name)
    parts = collapsed.split(".")
    return ".".join(parts[:-2] if len(parts) > 3 else parts[:-1] or parts) + ".*"


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
    return result


def apply(model: torch.nn.Module, init: InitPlan) -> None:
    """Copy each planned tensor into `model` and record how each new parameter starts (read off its values)."""
    parameters = dict(model.named_parameters())
    for flag, checkpoint in init.checkpoints.items():
        names = {name: key for name, (f, key) in init.loads.items() if f == flag}  # a key may start several (copies)
        tensors = checkpoint.tensors(set(names.values()))
        with torch.no_grad():
            for name, key in names.items():
                parameters[name].copy_(tensors[key].to(parameters[name].dtype))
    init.initialisation = {name: _describe_init(parameters[name]) for name in init.new}
    model.tie_weights()


def _describe_init(parameter: torch.Tensor) -> str:
    values = parameter.detach().float()
    if torch.all(values == 0):
        return "zeros"
    if torch.all(values == 1):
        return "ones"
    return f"random (std {values.std().item():.1g})"
