"""Loading a model or tokenizer named on the command line, with one clear line when the name or the files are bad."""

from __future__ import annotations

import ast
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def missing_local_path(name: str | None) -> bool:
    """True for a path-like name (./x, /x, ~/x, a/b/c) that does not exist; Hub ids are `name` or `org/name`."""
    if not name or Path(name).expanduser().exists():
        return False
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def check_model_path(name: str, flag: str = "--model_name_or_path") -> None:
    if Path(name).expanduser().is_file():
        raise FileNotFoundError(f"{flag} {name} is a file; pass a checkpoint folder or a Hub id.")
    if missing_local_path(name):
        raise FileNotFoundError(f"{flag} {name}: no such folder (nor a Hub id: those are NAME or ORG/NAME).")


def damaged_weights(name: str) -> str | None:
    """The first safetensors file of a local checkpoint folder that is empty, truncated or not safetensors."""
    folder = Path(name).expanduser()
    if not folder.is_dir():
        return None
    from safetensors import safe_open

    for file in sorted(folder.glob("*.safetensors")):
        if file.stat().st_size == 0:
            return f"{file} is empty"
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    handle.get_slice(key)  # reads each tensor's header entry: a truncated file fails here
        except Exception as error:  # safetensors raises its own error types
            return f"{file} is truncated or not a safetensors file ({str(error).splitlines()[0]})"
    return None


def damaged_checkpoint(name: str) -> str | None:
    """What is wrong with a local checkpoint folder, naming the file: a `config.json` that is not JSON, a code file
    that its `auto_map` (or one of those files' relative imports) names and the folder lacks, or damaged weights
    (`damaged_weights`). None when nothing is found, and for Hub ids."""
    import json

    folder = Path(name).expanduser()
    if not folder.is_dir():
        return None
    config_file = folder / "config.json"
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            return f"{config_file} is not valid JSON ({error})"
        if not isinstance(config, dict):
            return f"{config_file} is not valid JSON for a config (a {type(config).__name__}, not an object)"
        problem = missing_code_file(folder, config.get("auto_map") or {})
        if problem:
            return problem
    return damaged_weights(name)


def missing_code_file(folder: Path, auto_map: dict) -> str | None:
    """The first module that `auto_map` names, or that those modules import relatively, missing from `folder`."""
    from transformers.dynamic_module_utils import get_relative_imports

    references = [value for values in auto_map.values() if values
                  for value in (values if isinstance(values, (list, tuple)) else [values]) if isinstance(value, str)]
    wanted = [(reference.rsplit(".", 1)[0], "config.json's auto_map") for reference in references
              if "--" not in reference and "." in reference]  # "org/repo--module.Class" lives in another repository
    seen = set()
    while wanted:
        module, named_by = wanted.pop(0)
        if module in seen:
            continue
        seen.add(module)
        file = folder / f"{module.replace('.', '/')}.py"
        if not file.is_file():
            return f"{file} does not exist, but {named_by} names it (the model's code travels in its folder)"
        wanted += [(imported, file.name) for imported in get_relative_imports(file)]
    return None


def load_pretrained(auto_class, name: str, flag: str = "--model_name_or_path", **kwargs):
    """`auto_class.from_pretrained(name, **kwargs)`; a missing folder or damaged weights get a message naming them."""
    check_model_path(name, flag)
    try:
        if auto_class.__name__.startswith("AutoModelFor"):
            return _load_task_model(auto_class, name, **kwargs)
        from encoder_zoo.training.data.tokenizer import TOKENIZER_FILES, lacks_tokenizer_files, without_loading_state

        if "Tokenizer" in auto_class.__name__ and lacks_tokenizer_files(name):
            raise OSError(f"{flag} {name} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, vocab.txt, "
                          "...); save the model's tokenizer into it (tokenizer.save_pretrained) or pass the folder "
                          "that has both.")

        loaded = auto_class.from_pretrained(name, **kwargs)
        return without_loading_state(loaded) if hasattr(loaded, "init_kwargs") else loaded  # a tokenizer
    except Exception as error:
        problem = damaged_checkpoint(name)
        if problem:
            raise OSError(f"{flag} {name}: {problem}; re-export or re-download the checkpoint.") from None
        if "trust_remote_code=True" in str(error) and not kwargs.get("trust_remote_code"):
            raise ValueError(f"{flag} {name} runs model code saved with it (its .py files): pass --trust_remote_code "
                             "to allow that, once you trust where the checkpoint comes from.") from None
        raise


class _HeldLoadReport(logging.Filter):
    """Holds back transformers' load report (a table logged as a warning) so the caller decides whether it informs."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in record.getMessage():
            self.records.append(record)
            return False
        return True


def _load_task_model(auto_class, name: str, **kwargs):
    """Load a model with a task head. A head swap (a new head initialised, the pretraining heads dropped, a head of
    another size re-initialised) is expected in fine-tuning, so transformers' load report becomes one info line;
    a report that names encoder weights is shown in full, as a warning."""
    from transformers.utils import logging as hf_logging

    modeling_logger = hf_logging.get_logger("transformers.modeling_utils")
    held = _HeldLoadReport()
    modeling_logger.addFilter(held)
    try:
        model, info = auto_class.from_pretrained(name, output_loading_info=True, **kwargs)
    finally:
        modeling_logger.removeFilter(held)
    prefix = getattr(model, "base_model_prefix", "") or None
    in_encoder = lambda key: prefix is None or key.startswith(prefix + ".")  # noqa: E731
    new = sorted(info["missing_keys"]) + sorted(key for key, *_ in info["mismatched_keys"])
    dropped = sorted(info["unexpected_keys"])
    if any(map(in_encoder, [*new, *dropped])):
        for record in held.records:
            modeling_logger.handle(record)
    elif new or dropped:
        logger.info("%s from %s: new head weights %s initialised%s (expected when fine-tuning).", type(model).__name__,
                    name, ", ".join(new) or "none",
                    f"; {len(dropped)} pretraining-head weights not used" if dropped else "")
    return model


def pin_memory_only_with_an_accelerator(training_args) -> None:
    """Pinned memory only speeds up copies to an accelerator; on a CPU-only machine torch warns at every loader."""
    import torch

    if not torch.accelerator.is_available():
        training_args.dataloader_pin_memory = False


def parse_overrides(text: str | None) -> dict:
    if not text:
        return {}
    overrides = {}
    for item in text.split(","):
        if "=" not in item:
            raise ValueError(f"--config_overrides item {item!r} is not key=value.")
        key, raw = (part.strip() for part in item.split("=", 1))
        try:
            overrides[key] = ast.literal_eval({"true": "True", "false": "False"}.get(raw.lower(), raw))
        except (ValueError, SyntaxError):
            overrides[key] = raw
    return overrides
