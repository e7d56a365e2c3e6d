"""The positive control's model: a model folder (a pretraining's export, a fusion's init, the offline MiniLM)
re-created from its own config at random initialisation, seeded, and saved as a folder of the same kind (config,
weights, tokenizer, code), so that it fine-tunes exactly as the original does and differs from it only by the
pretrained weights.

    python repro/random_init.py --model runs/repro/cache/pretrain/bert-.../export --seed 1 --output_dir OUT

The class is the one that saved the folder (its config's `architectures`, found through the config's `auto_map`, or
in transformers), built with `from_config` under `transformers.set_seed(seed)`: each class's own initialisation, as
a pretraining from scratch starts. The folder gets the model (`save_pretrained`), the source's tokenizer and its code
(`*.py`), nothing else of the source (no card, no training log: it was never trained). `random_init.json`, written
last, marks it complete.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

MARKER = "random_init.json"


def model_class(config):
    """The class that saved a folder with `config`: its auto class (remote code) or its transformers class."""
    import transformers

    architecture = (getattr(config, "architectures", None) or [None])[0]
    for auto_name, target in (getattr(config, "auto_map", None) or {}).items():
        if architecture and target.split(".")[-1] == architecture and hasattr(transformers, auto_name):
            return getattr(transformers, auto_name), True
    if architecture and hasattr(transformers, architecture):
        return getattr(transformers, architecture), False
    return transformers.AutoModel, True


def random_copy(source: Path, seed: int, output_dir: Path) -> dict:
    from transformers import AutoConfig, AutoTokenizer, set_seed

    from encoder_zoo.training.run import without_loading_state

    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"--model {source}: no config.json there; pass a model folder")
    if (output_dir / MARKER).exists():
        raise ValueError(f"--output_dir {output_dir} already holds a complete random copy: pass a new folder")
    if output_dir.exists():  # a copy cut short: set aside, nothing deleted
        output_dir.rename(output_dir.with_name(f"{output_dir.name}.incomplete-{time.strftime('%Y%m%d-%H%M%S')}"))
    config = AutoConfig.from_pretrained(source, trust_remote_code=True)
    cls, auto = model_class(config)
    set_seed(seed)
    model = cls.from_config(config, trust_remote_code=True) if auto else cls._from_config(config)
    output_dir.mkdir(parents=True)
    for path in source.glob("*.py"):  # the model's code (remote code travels with the folder)
        shutil.copy2(path, output_dir / path.name)
    model.save_pretrained(output_dir)
    without_loading_state(AutoTokenizer.from_pretrained(source, trust_remote_code=True)).save_pretrained(output_dir)
    record = {"source": str(source), "seed": seed, "class": f"{cls.__name__}", "model_type": config.model_type,
              "parameters": int(sum(p.numel() for p in model.parameters()))}
    (output_dir / MARKER).write_text(json.dumps(record, indent=1))
    return record


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="The model folder to re-create at random initialisation.")
    parser.add_argument("--seed", type=int, required=True, help="The initialisation seed (a unit seed).")
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args(argv)
    record = random_copy(Path(args.model), args.seed, Path(args.output_dir))
    print(json.dumps(record))
    return record


def cli() -> None:
    from encoder_zoo.training.run.entry import run_cli

    run_cli(main, "random_init.py")


if __name__ == "__main__":
    cli()
