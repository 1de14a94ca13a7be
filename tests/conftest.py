"""Shared test fixtures: the fixture-kernel manifest, built once per session, and helpers
for writing throwaway manifests and kernels in a temporary folder."""
from __future__ import annotations

import ctypes
import enum
from pathlib import Path

import pytest
import torch
import yaml

from gfxasm.backends.hip import HIP_LAUNCH_PARAM_BUFFER_POINTER, HIP_LAUNCH_PARAM_BUFFER_SIZE, HIP_LAUNCH_PARAM_END
from gfxasm.build import build_manifest
from gfxasm.cli import load_cases
from gfxasm.manifest import Manifest

FIXTURES = Path(__file__).parent / "fixtures"


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


class RecordingHip:
    """Stands in for hip-python (`from hip import hip`), which needs ROCm and a GPU.

    Answers as hip-python does, with (error, *values) tuples, records every call, and
    reads the `extra` array of a launch the way the HIP runtime does.
    """
    class hipError_t(enum.IntEnum):
        hipSuccess = 0
        hipErrorInvalidImage = 200
        hipErrorLaunchFailure = 719

    class hipDeviceProp_t:
        gcnArchName = b""

    ERROR_STRINGS = {200: b"device kernel image is invalid", 719: b"unspecified launch failure"}

    def __init__(self, arch=b"gfx950:sramecc+:xnack-", current_device=0, fail=None):
        self.arch, self.current_device, self.fail = arch, current_device, fail or {}
        self.calls = []
        self.launches = []

    def _answer(self, name, *values):
        return (self.fail.get(name, self.hipError_t.hipSuccess), *values)

    def hipGetDevice(self):
        self.calls.append(("hipGetDevice",))
        return self._answer("hipGetDevice", self.current_device)

    def hipSetDevice(self, device):
        self.calls.append(("hipSetDevice", device))
        self.current_device = device
        return self._answer("hipSetDevice")

    def hipGetDeviceProperties(self, properties, device):
        self.calls.append(("hipGetDeviceProperties", device))
        properties.gcnArchName = self.arch
        return self._answer("hipGetDeviceProperties")

    def hipModuleLoadData(self, data):
        self.calls.append(("hipModuleLoadData", self.current_device, len(data)))
        assert bytes(data[:4]) == b"\x7fELF"
        return self._answer("hipModuleLoadData", f"module on device {self.current_device}")

    def hipModuleGetFunction(self, module, name):
        self.calls.append(("hipModuleGetFunction", module, name))
        return self._answer("hipModuleGetFunction", (module, name))

    def hipModuleLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.calls.append(("hipModuleLaunchKernel", self.current_device))
        # Read `extra` as the runtime does: marker, pointer, marker, pointer to size_t, END.
        slots = (ctypes.c_void_p * 5).from_address(extra)
        assert [slots[0], slots[2], slots[4]] == [HIP_LAUNCH_PARAM_BUFFER_POINTER, HIP_LAUNCH_PARAM_BUFFER_SIZE,
                                                  HIP_LAUNCH_PARAM_END]
        size = ctypes.c_size_t.from_address(slots[3]).value
        self.launches.append(dict(function=function, grid=(gx, gy, gz), block=(bx, by, bz), shared=shared,
                                  stream=stream, params=params, kernarg=ctypes.string_at(slots[1], size)))
        return self._answer("hipModuleLaunchKernel")

    def hipGetErrorString(self, error):
        return self.ERROR_STRINGS[int(error)]
