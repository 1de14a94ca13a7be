"""Shared test fixtures: the fixture-kernel manifest, built once per session, helpers
for writing throwaway manifests and kernels in a temporary folder, the recording
stand-in HIP runtime (hip_stub), and no_launch (any kernel launch fails the test)."""
from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from gfxasm.backends.hip_runtime import LIBRARY_ENV
from gfxasm.build import build_manifest
from gfxasm.cli import load_cases
from gfxasm.emu import fast
from gfxasm.manifest import Manifest
from gfxasm.toolchain import find_tool
from tests.conformance.cases import SHARED_DIR

FIXTURES = Path(__file__).parent / "fixtures"
EMU_TESTS = Path(__file__).parent / "emu"


@pytest.fixture(autouse=True)
def _compiled_bookkeeping_in_emu_tests(request, monkeypatch):
    """tests/emu: the emulator's compiled bookkeeping (gfxasm.emu.fast) serves every strict
    launch there, however small (it normally waits for launches of fast.MIN_WAVES waves), so
    the strict-mode tests check it as they check the numpy paths; where numba is absent they
    check the numpy paths alone. (Here, not in a tests/emu/conftest.py: a second module named
    `conftest` would shadow this one for the tests that import from it.)"""
    if EMU_TESTS in request.path.parents:
        monkeypatch.setattr(fast, "MIN_WAVES", 1)


@pytest.fixture
def no_launch(monkeypatch):
    """Any kernel launch, on either backend, fails the test: errors must come before it.
    The backends are patched (not gfxasm.launch), so launches an op prepared and cached
    itself are caught too."""
    from gfxasm import launcher

    def boom(*args, **kwargs):
        raise AssertionError("a kernel was launched")
    monkeypatch.setattr(launcher.emu_backend, "launch", boom)
    monkeypatch.setattr(launcher.hip_backend, "launch", boom)


@pytest.fixture(scope="session")
def fixture_manifest() -> Manifest:
    """tests/fixtures/kernels.yaml, every variant built (incrementally) into build/fixtures,
    and its run cases registered."""
    manifest = Manifest.load(FIXTURES / "kernels.yaml")
    build_manifest(manifest)
    load_cases(manifest.cases)
    return manifest


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(20260)


def write_manifest(folder: Path, kernels: dict, **top) -> Path:
    """A manifest in `folder` building into `folder`/build; returns its path."""
    path = folder / "kernels.yaml"
    path.write_text(yaml.safe_dump({"build_dir": "build", **top, "kernels": kernels}, sort_keys=False))
    return path


# A minimal kernel: stores n into out[0] from lane 0 of workgroup 0.
STORE_N_SOURCE = """\
; store_n - test kernel: out[0] = n
.set s_out, 6
.set s_n, 8
.set v_zero, 1
.set v_value, 2
    s_load_dwordx2 s[s_out:s_out+1], s[s_kernarg:s_kernarg+1], k_out
    s_load_dword s[s_n], s[s_kernarg:s_kernarg+1], k_n
    v_mov_b32 v[v_zero], 0
    s_waitcnt lgkmcnt(0)                ; out, n
    v_mov_b32 v[v_value], s[s_n]
    global_store_dword v[v_zero], v[v_value], s[s_out:s_out+1]
    s_endpgm
"""
STORE_N_KERNEL = {
    "source": "store_n.s",
    "workgroup": [64],
    "grid": [1],
    "args": [{"name": "out", "type": "*u32", "dir": "out", "shape": [1]},
             {"name": "n", "type": "u32"}],
}


@pytest.fixture
def store_n_manifest(tmp_path: Path) -> Path:
    (tmp_path / "store_n.s").write_text(STORE_N_SOURCE)
    return write_manifest(tmp_path, {"store_n": STORE_N_KERNEL})


class HipStub:
    """The recording libamdhip64 stand-in (tests/hipstub/hipstub.c) as a test sees it: the
    calls the binding made, parsed from the stub's log, and the failure it is told to give."""

    def __init__(self, library: Path, log: Path, monkeypatch):
        self.library, self.log, self._monkeypatch = library, log, monkeypatch
        self.arch: dict[int, str] = {}      # device -> gcnArchName torch reports

    def calls(self) -> list[tuple[str, dict[str, str]]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [(name, dict(item.split("=", 1) for item in items))
                for name, *items in (line.split() for line in lines)]

    def names(self) -> list[str]:
        return [name for name, _ in self.calls()]

    def launches(self) -> list[dict[str, str]]:
        return [values for name, values in self.calls() if name == "hipModuleLaunchKernel"]

    def clear(self) -> None:
        self.log.unlink(missing_ok=True)

    def fail(self, call: str, error: int) -> None:
        """Make `call` return hipError_t `error` from now on."""
        self._monkeypatch.setenv("HIPSTUB_FAIL", f"{call}:{error}")


@pytest.fixture(scope="session")
def hipstub_library(tmp_path_factory) -> Path:
    library = tmp_path_factory.mktemp("hipstub") / "libhipstub.so"   # not "libamdhip64": see test_hip_backend
    subprocess.run([find_tool("clang"), "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror",
                    str(Path(__file__).parent / "hipstub" / "hipstub.c"), "-o", str(library)], check=True)
    return library


@pytest.fixture
def hip_stub(hipstub_library, tmp_path, monkeypatch) -> HipStub:
    """gfxasm's HIP binding pointed at the stand-in runtime (current device 0), and the torch side
    of a ROCm machine stubbed, since this torch is a CPU build: only torch.version.hip and
    torch.cuda.get_device_properties(d).gcnArchName, which is all the HIP backend asks of torch.
    Every device is a gfx950 unless a test sets stub.arch[d]."""
    stub = HipStub(hipstub_library, tmp_path / "hip_calls.log", monkeypatch)
    monkeypatch.setenv(LIBRARY_ENV, str(hipstub_library))
    monkeypatch.setenv("HIPSTUB_LOG", str(stub.log))
    monkeypatch.delenv("HIPSTUB_FAIL", raising=False)
    ctypes.CDLL(str(hipstub_library)).hipstub_reset(0)     # the same handle the binding opens
    monkeypatch.setattr(torch.version, "hip", "7.0.0-hipstub")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(gcnArchName=stub.arch.get(device, "gfx950:sramecc+:xnack-")))
    return stub


# The ../shared/conformance extras (marked shared_conformance, in any test folder) run only
# where that folder exists; elsewhere they are deselected (not skipped, not passed) and the
# session header says how many. Here, not in tests/conformance, so that a run of any subset
# of the tests deselects them too.
_deselected_shared: list = []


def pytest_collection_modifyitems(config, items):
    if SHARED_DIR.is_dir():
        return
    keep = [item for item in items if item.get_closest_marker("shared_conformance") is None]
    _deselected_shared[:] = [item for item in items if item.get_closest_marker("shared_conformance") is not None]
    if _deselected_shared:
        config.hook.pytest_deselected(items=_deselected_shared)
        items[:] = keep


def pytest_report_collectionfinish(config, items):
    if _deselected_shared:
        return (f"conformance: {len(_deselected_shared)} ../shared/conformance extras deselected "
                f"({SHARED_DIR} is absent); the corpus cases run")
    return None
