"""The standard copies (`training/to_transformers.py`) load in the last transformers 4 release (4.57) as in 5: in a
fresh environment with transformers 4.57 (and the huggingface_hub and tokenizers it takes), each copy's folder (BERT;
ELECTRA's root, generator/ and rtd/) loads through its own class with nothing missing, its tokenizer is BERT's or
ELECTRA's fast tokenizer and gives transformers 5's ids, and its outputs equal transformers 5's to 1e-5. Skipped where
the package index has no transformers 4.57."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys

import pytest
import torch
import transformers
from test_to_transformers import ELECTRA, PROBE_TEXT, cased_tokenizer

from encoder_zoo.training.recipes import pretraining_export
from encoder_zoo.training.run.standard_copy import TOLERANCE, convert

pytestmark = [pytest.mark.install, pytest.mark.slow]

REQUIREMENTS = ("transformers==4.57.*", "huggingface_hub<1.0", "tokenizers>=0.22,<0.23")
EXPORTS = {"spanbert": pretraining_export("spanbert"), "teams": pretraining_export("teams", embedding_size=16),
           "electra": pretraining_export("teams", **ELECTRA)}

CHILD = """
import json, sys
import torch, transformers
assert transformers.__version__.startswith("4.57."), transformers.__version__
expected = torch.load(sys.argv[1])
report = {}
for folder, want in expected.items():
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(want["text"], padding=True, return_tensors="pt")
    model, info = getattr(transformers, want["class"]).from_pretrained(folder, output_loading_info=True)
    with torch.no_grad():
        output = model.eval()(**batch)
    real = batch["attention_mask"].bool()
    report[folder] = {"tokenizer": type(tokenizer).__name__, "ids": batch["input_ids"].tolist() == want["ids"],
                      "missing": info["missing_keys"], "unexpected": info["unexpected_keys"],
                      "difference": float((output[want["output"]] - want["value"]).abs()[real].max())}
print("REPORT " + json.dumps(report))
"""


def environment_with_transformers4(tmp_path):
    """A venv whose own site-packages hold REQUIREMENTS, before this environment's packages (torch, ...)."""
    env_dir = tmp_path / "env4"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    own = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                         capture_output=True, text=True).stdout.strip()
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                                *REQUIREMENTS], capture_output=True, text=True, timeout=600)
    if installed.returncode:
        pytest.skip(f"transformers 4.57 is not installable here: {installed.stderr.strip().splitlines()[-1:]}")
    with open(os.path.join(own, "dependencies.pth"), "w") as file:  # this environment's packages, after its own
        file.write("".join(f"{path}\n" for path in site.getsitepackages()))
    return python


def expectations(standard) -> dict:
    """Per folder of the copy: its class, transformers 5's token ids and one output to compare."""
    expected = {}
    for folder in [standard, *(standard / sub for sub in ("generator", "rtd") if (standard / sub).is_dir())]:
        config = json.loads((folder / "config.json").read_text())
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        batch = tokenizer(PROBE_TEXT, padding=True, return_tensors="pt")
        model = getattr(transformers, config["architectures"][0]).from_pretrained(folder).eval()
        with torch.no_grad():
            output = model(**batch)
        name = "last_hidden_state" if "last_hidden_state" in output else "logits"
        expected[str(folder)] = {"class": config["architectures"][0], "text": PROBE_TEXT, "output": name,
                                 "ids": batch["input_ids"].tolist(), "value": output[name]}
    return expected


def test_the_standard_copies_load_in_transformers_4_57_with_their_tokenizer_and_outputs(tmp_path):
    python = environment_with_transformers4(tmp_path)
    expected = {}
    for name, build in EXPORTS.items():
        (tmp_path / name).mkdir()
        torch.manual_seed(0)
        export = build(tmp_path / name, cased_tokenizer()).folder
        expected.update(expectations(convert(export, tmp_path / f"{name}-standard")))
    torch.save(expected, tmp_path / "expected.pt")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    child = subprocess.run([python, "-c", CHILD, str(tmp_path / "expected.pt")], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.rsplit("REPORT ", 1)[1])
    assert len(report) == 6, report  # spanbert; teams root, generator/, rtd/; electra root, generator/
    for folder, seen in report.items():
        family = "Bert" if "spanbert" in folder else "Electra"
        assert seen["tokenizer"] == f"{family}TokenizerFast" and seen["ids"], (folder, seen)
        assert not seen["missing"] and not seen["unexpected"], (folder, seen)
        assert seen["difference"] <= TOLERANCE, (folder, seen)
