"""Test-wide settings.

One torch thread: the models in these tests are tiny, where a second thread only adds
synchronisation (several times slower on a busy 2-core machine) and run-to-run noise.

Tests marked `cuda` (tests/cuda/) run on a CUDA GPU and are skipped where there is none, so
CI stays green: `python -m pytest -m cuda` on a GPU machine runs them (docs/gpu.md).
ATTNLAB_TEST_DEVICE=cpu runs them on the CPU instead: a dry run of their code paths, which
proves nothing about a GPU. On a GPU machine every other test still runs on the CPU: the
commands' `--device auto` would pick the GPU, whose random streams and rounding differ from
the CPU expectations those tests compute.
"""

import contextlib
import io
import os
import signal
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

#: where the cuda tests run: CUDA, or what ATTNLAB_TEST_DEVICE names (cpu: a dry run)
TEST_DEVICE = os.environ.get("ATTNLAB_TEST_DEVICE", "cuda")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TEST_DEVICE != "cuda" or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (ATTNLAB_TEST_DEVICE=cpu: a CPU dry run)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _cpu_unless_marked_cuda(request: pytest.FixtureRequest,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide a GPU from the tests not marked cuda (in this process and the ones it starts)."""
    if request.node.get_closest_marker("cuda") is None and torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture(autouse=True, scope="session")
def _token_cache_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The token cache (train/token_cache.py) in a folder of this session's, for it and the
    commands it starts: the tests filled the user's ~/.cache/attnlab, and an entry an
    earlier session (older code) wrote could answer a test's first run."""
    os.environ["ATTNLAB_CACHE"] = str(tmp_path_factory.mktemp("attnlab-cache"))


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_as_at_a_terminal() -> None:
    """SIGINT raises KeyboardInterrupt here and in the commands the tests start, as at a
    terminal. A shell starts a background job (`pytest ... &`, nohup) with SIGINT ignored;
    Python and its children then keep it ignored, and the Ctrl-C tests' signals were lost."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def cuda_device() -> torch.device:
    """The device the cuda tests run on (see the module docstring)."""
    return torch.device(TEST_DEVICE)


@pytest.fixture(scope="session")
def cuda_copy_run(cuda_device: torch.device,
                  tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`attnlab train` (the copy task, its default recipe) on the cuda tests' device: the run
    directory and what the command printed. Trained once for every cuda test."""
    from attnlab.cli import main

    run = tmp_path_factory.mktemp("cuda") / "copy"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["train", "--quiet", "--out", str(run), "--device", str(cuda_device)])
    assert code == 0, printed.getvalue()
    return run, printed.getvalue()
