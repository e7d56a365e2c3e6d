import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each xdist worker (and the processes it starts) gets one thread: two workers x two OpenMP threads on two cores
    # oversubscribe the CPU and slow recurrent layers down tenfold.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smoke_cache(tmp_path_factory) -> Path:
    """One repro cache for every `smoke`-budget sweep of the session, pytest-xdist workers included: the zoo's, the
    papers' and README's smoke sweeps train the runs they share once (per-job locks let sweeps share a cache, as
    `repro/run.py --jobs` does). A test that must see its runs train uses a folder of its own."""
    from helpers import session_dir

    cache = session_dir(tmp_path_factory) / "repro-smoke-cache"
    cache.mkdir(exist_ok=True)
    return cache


@pytest.fixture
def share_smoke_cache(smoke_cache):
    """`share(folder)`: `folder`, made ready for `repro/run.py --output_dir folder`: its reports its own, its `cache/`
    the session's `smoke_cache`."""
    def share(output_dir: Path) -> Path:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "cache").symlink_to(smoke_cache, target_is_directory=True)
        return output_dir

    return share


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests are collected everywhere and skipped where torch sees no CUDA device."""
    import pytest
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (pytest.mark.gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_configure(config):
    # transformers' common tests (tests/test_transformers_common.py) carry transformers' own marks.
    for mark in ("flash_attn_test", "flash_attn_3_test", "flash_attn_4_test", "torch_compile_test", "torch_export_test",
                 "training_ci", "generate", "accelerate_tests"):
        config.addinivalue_line("markers", f"{mark}: a mark of transformers' own test suite")


# UPDATE_WORKS_WITH=1: count transformers' common tests per family into tests/common_tests.json (works_with.py's row).
_common_counts: dict[str, dict[str, int]] = {}


def pytest_runtest_logreport(report):
    if not os.environ.get("UPDATE_WORKS_WITH") or "test_transformers_common.py::" not in report.nodeid:
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the controller counts every worker's reports
        return
    from works_with import COMMON_TEST_FAMILIES

    # As pytest's summary counts: skips and failures of subtests too, passes of whole tests only.
    whole_test = type(report).__name__ == "TestReport"
    family = COMMON_TEST_FAMILIES.get(report.nodeid.split("::")[1])
    outcome = ("skipped" if report.skipped else "failed" if report.failed
               else "passed" if report.when == "call" and whole_test else None)
    if family and outcome:
        counts = _common_counts.setdefault(family, {"passed": 0, "skipped": 0, "failed": 0})
        counts[outcome] += 1


def pytest_sessionfinish(session):
    if _common_counts:
        import json
        from pathlib import Path

        Path(__file__).with_name("common_tests.json").write_text(json.dumps(_common_counts, indent=1, sort_keys=True)
                                                                 + "\n")
