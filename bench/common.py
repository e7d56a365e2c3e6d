"""Shared helpers for the benchmark scripts: machine description and result files."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def write_result(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **result}, indent=2))
    print(json.dumps(result, indent=2))
    return path
