"""transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`), taken at test time from the sdist of the
installed transformers version, never copied into this repository.

    pip download --no-deps --no-binary :all: transformers==<installed version>

into `~/.cache/encoder-zoo/transformers-sdist` (`ENCODER_ZOO_CACHE` moves it), then `tests/*.py` of the sdist are
extracted into the package `transformers_common_tests` next to it, which is put on `sys.path` of the test process only.

The sdist ships the top-level `tests/*.py` but not the sub-folders three of them import from. Stand-ins are written for
those, and each says what it leaves out:
- `exporters/test_export.py`: an empty `ExportTesterMixin`, so the torch.export / ONNX / ExecuTorch export tests
  (which need `transformers.exporters` backends) are not collected;
- `generation/test_utils.py`: an empty `GenerationTesterMixin` (only read in `issubclass` checks; no zoo model
  generates);
- `utils/test_configuration_utils.py`: `config_common_kwargs`, the common `PreTrainedConfig` arguments that
  `ConfigTester.check_config_arguments_init` sets and reads back.

`load()` returns the extracted package's modules, or raises `Unavailable` with the reason (no network, no such
version on PyPI, `parameterized` not installed); the test module then skips with that reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import transformers

PACKAGE = "transformers_common_tests"
CACHE = Path(os.environ.get("ENCODER_ZOO_CACHE", Path.home() / ".cache" / "encoder-zoo")) / "transformers-sdist"

STAND_INS = {
    "exporters/test_export.py": '''"""Stand-in written by encoder-zoo's tests/transformers_common.py: the sdist \
does not ship tests/exporters.
The export tests (torch.export, ONNX, ExecuTorch, ...) are not collected."""


class ExportTesterMixin:
    pass
''',
    "generation/test_utils.py": '''"""Stand-in written by encoder-zoo's tests/transformers_common.py: the sdist \
does not ship tests/generation.
No zoo model generates; `ModelTesterMixin` reads this class in `issubclass` checks only."""


class GenerationTesterMixin:
    pass
''',
    "utils/test_configuration_utils.py": '''"""Stand-in written by encoder-zoo's tests/transformers_common.py: \
the sdist does not ship tests/utils.
The common `PreTrainedConfig` arguments, each set to a non-default value (as transformers' own list does)."""

config_common_kwargs = {
    "return_dict": False,
    "output_hidden_states": True,
    "output_attentions": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["BertModel"],
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "problem_type": "regression",
}
''',
}


class Unavailable(Exception):
    """transformers' common tests cannot be had here; the message says why."""


@contextlib.contextmanager
def _locked(folder: Path):
    """One process at a time downloads and extracts (pytest-xdist workers start together)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _download(version: str, folder: Path) -> Path:
    archive = folder / f"transformers-{version}.tar.gz"
    if archive.exists():
        return archive
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "--disable-pip-version-check", f"transformers=={version}", "-d", scratch],
            capture_output=True, text=True, timeout=600,
        )
        found = list(Path(scratch).glob("transformers-*.tar.gz"))
        if result.returncode != 0 or not found:
            raise Unavailable(f"pip could not download the transformers {version} sdist (offline, or no such version "
                              f"on the index): {(result.stderr or result.stdout).strip()[-600:]}")
        found[0].replace(archive)
    return archive


def _extract(archive: Path, version: str, target: Path) -> None:
    prefix = f"transformers-{version}/tests/"
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        package = Path(scratch) / PACKAGE
        package.mkdir()
        with tarfile.open(archive) as sdist:
            for member in sdist.getmembers():
                relative = member.name[len(prefix):] if member.name.startswith(prefix) else None
                if not relative or not member.isfile() or not relative.endswith(".py"):
                    continue
                destination = package / relative
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(sdist.extractfile(member).read())
        if not (package / "test_modeling_common.py").exists():
            raise Unavailable(f"The transformers {version} sdist has no tests/test_modeling_common.py.")
        for relative, text in STAND_INS.items():
            destination = package / relative
            if not destination.exists():
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_text(text)
        for folder in [package, *(p for p in package.rglob("*") if p.is_dir())]:
            (folder / "__init__.py").touch()
        shutil.rmtree(target, ignore_errors=True)
        package.parent.rename(target)


def location(version: str | None = None) -> Path:
    """The folder that holds `transformers_common_tests` for this transformers version (downloaded on first use)."""
    version = version or transformers.__version__
    root = CACHE / version
    if (root / PACKAGE / "test_modeling_common.py").exists():
        return root
    with _locked(CACHE):
        if not (root / PACKAGE / "test_modeling_common.py").exists():
            _extract(_download(version, CACHE), version, root)
    return root


def load():
    """`(test_modeling_common, test_configuration_common)` from the sdist of the installed transformers."""
    try:
        import parameterized  # noqa: F401  (test_modeling_common needs it)
    except ImportError as error:
        raise Unavailable("transformers' common tests need `parameterized` (pip install -e '.[test]').") from error
    root = str(location())
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        return (importlib.import_module(f"{PACKAGE}.test_modeling_common"),
                importlib.import_module(f"{PACKAGE}.test_configuration_common"))
    except ImportError as error:
        raise Unavailable(f"transformers {transformers.__version__}'s common tests do not import here: "
                          f"{error}") from error
