"""One import name: the wheel installs `encoder_zoo` alone, and works in an environment that also holds an unrelated
top-level `models` and `training` package (the generic names that the root folders of this repository carry)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.install

REPO = Path(__file__).resolve().parent.parent


def test_wheel_beside_unrelated_models_package(tmp_path):
    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheel_dir), str(REPO)], check=True, capture_output=True, timeout=600)
    (wheel,) = wheel_dir.glob("encoder_zoo-*.whl")
    top_level = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"encoder_zoo"}, top_level

    # A fresh environment: its own site-packages first (the wheel, an unrelated `models`/`training`), then this
    # environment's dependencies (torch, transformers, ...) through a path entry, whose .pth files (this checkout's
    # editable install among them) are not run.
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                               capture_output=True, text=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=600)
    for name in ("models", "training"):
        (site / name).mkdir()
        (site / name / "__init__.py").write_text(f"UNRELATED = {name!r}\n")

    work = tmp_path / "work"
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    probe = subprocess.run([python, "-c", "import models, training, encoder_zoo.models as zoo; "
                            "print(models.UNRELATED, training.UNRELATED, zoo.__file__)"],
                           capture_output=True, text=True, cwd=work, env=env, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    unrelated_models, unrelated_training, zoo_file = probe.stdout.split()
    assert (unrelated_models, unrelated_training) == ("models", "training")
    assert Path(zoo_file).is_relative_to(site), zoo_file  # the wheel's copy, not this checkout

    demo = subprocess.run([python, "-m", "encoder_zoo.training.demo", "--output_dir", "runs/demo", "--max_steps", "4",
                           "--model_size", "tiny"], capture_output=True, text=True, cwd=work, env=env, timeout=900)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "==== SpanBERT demo summary ====" in demo.stdout
    assert (work / "runs" / "demo" / "export" / "model.safetensors").exists()
