"""HIP backend: launches a built `.co` on a gfx950 GPU through the HIP runtime's C API.

The runtime is the libamdhip64 a ROCm torch already loaded, reached through a small ctypes
binding (hip_runtime.py: which library, and why that one); nothing to install beyond torch,
and the package still imports without ROCm. GFXASM_HIP_BINDING=hip-python makes the same
calls through hip-python instead (hip_python.py), refused unless hip-python binds that very
library. Refused with HipUnavailable: a torch that is not
a ROCm build, or no loadable runtime. Every failing HIP call raises HipError with the
error's name and text. Per launch:

    torch.cuda.get_device_properties  once per device: refuse anything but gfx950
    hipGetDevice / hipSetDevice       launch on the tensors' device, then restore it
    hipModuleLoadData                 once per (device, .co file version)
    hipModuleGetFunction              once per (module, symbol)
    hipModuleLaunchKernel             on the given stream, kernarg bytes through `extra`

Nothing here has run on a real gfx950 yet (none is reachable from the development
machines); tests drive this very binding against a recording stand-in libamdhip64 built
from tests/hipstub/hipstub.c, loaded through GFXASM_HIP_LIBRARY.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..codeobj import KernelInfo, load_code_object
from ..manifest import LDS_LIMIT_BYTES
from .hip_runtime import HipError, HipUnavailable, RuntimeBinding, open_runtime

__all__ = ["HipBackend", "HipError", "HipUnavailable"]
SUPPORTED_ARCH = "gfx950"
BINDING_ENV = "GFXASM_HIP_BINDING"
BINDINGS = ("ctypes", "hip-python")      # the first is the default


def open_binding() -> RuntimeBinding:
    """The HIP runtime through the binding $GFXASM_HIP_BINDING names (unset: ctypes)."""
    binding = os.environ.get(BINDING_ENV) or BINDINGS[0]
    if binding == "ctypes":
        return open_runtime()
    if binding == "hip-python":
        from .hip_python import open_hip_python     # imports hip-python only when asked for
        return open_hip_python()
    raise HipUnavailable(f"{BINDING_ENV}={binding!r}: the HIP bindings are {', '.join(map(repr, BINDINGS))}")


@dataclass
class _LoadedModule:
    handle: object                                               # hipModule_t, as the binding gives it
    functions: dict[str, object] = field(default_factory=dict)  # symbol -> hipFunction_t


class HipBackend:
    def __init__(self):
        self._runtime: RuntimeBinding | None = None
        self._arch: dict[int, str] = {}                                  # device -> gcnArchName
        self._code_objects: dict[tuple, tuple[bytes, dict[str, KernelInfo]]] = {}
        self._modules: dict[tuple, _LoadedModule] = {}                   # (device, file key)

    @property
    def runtime(self) -> RuntimeBinding:
        if self._runtime is None:
            if torch.version.hip is None:
                raise HipUnavailable("no HIP runtime: this PyTorch is not a ROCm build (torch.version.hip is "
                                     "None); gfxasm launches on a GPU only through a ROCm torch on a gfx950")
            self._runtime = open_binding()
        return self._runtime

    def launch(self, co_path: Path, symbol: str, grid: tuple[int, int, int], block: tuple[int, int, int],
               kernarg: bytes, device: int, stream: int) -> None:
        hip = self.runtime
        self._require_gfx950(device)
        previous = hip.get_device()
        if previous != device:
            hip.set_device(device)
        try:
            function = self._function(device, co_path, symbol, len(kernarg))
            hip.launch_kernel(function, grid, block, stream, kernarg)
        finally:
            if previous != device:
                hip.set_device(previous)

    def _require_gfx950(self, device: int) -> None:
        # From torch, not hipGetDeviceProperties: hipDeviceProp_t's layout changes between ROCm releases.
        if device not in self._arch:
            self._arch[device] = torch.cuda.get_device_properties(device).gcnArchName
        arch = self._arch[device]
        if arch.split(":")[0] != SUPPORTED_ARCH:     # "gfx950:sramecc+:xnack-": features after ':'
            raise HipError(f"device {device} is {arch}, not {SUPPORTED_ARCH}: gfxasm's code objects run "
                           f"only on gfx950 (MI350X / MI355X)")

    def _function(self, device: int, co_path: Path, symbol: str, kernarg_size: int):
        stat = co_path.stat()
        file_key = (str(co_path), stat.st_mtime_ns, stat.st_size)   # a rebuilt .co is loaded afresh
        if file_key not in self._code_objects:
            data = co_path.read_bytes()
            self._code_objects[file_key] = (data, load_code_object(data).kernels)
        data, kernels = self._code_objects[file_key]
        self._refuse_unlaunchable(co_path, kernels, symbol, kernarg_size)
        module = self._modules.get((device, file_key))
        if module is None:
            module = _LoadedModule(self.runtime.load_module(data))   # `data` stays cached: alive
            self._modules[(device, file_key)] = module
        if symbol not in module.functions:
            module.functions[symbol] = self.runtime.get_function(module.handle, symbol)
        return module.functions[symbol]

    @staticmethod
    def _refuse_unlaunchable(co_path: Path, kernels: dict[str, KernelInfo], symbol: str, kernarg_size: int) -> None:
        info = kernels.get(symbol)
        if info is None:
            raise HipError(f"{co_path} has no kernel '{symbol}' (it has {', '.join(kernels)})")
        if info.lds_bytes > LDS_LIMIT_BYTES:
            raise HipError(f"{co_path} ({symbol}) needs {info.lds_bytes} bytes of LDS; gfx950 allows "
                           f"{LDS_LIMIT_BYTES} per workgroup")
        if kernarg_size != info.kernarg_size:
            raise HipError(f"{co_path} ({symbol}) takes {info.kernarg_size} kernarg bytes, got {kernarg_size}: "
                           f"is the .co stale? run ./build.sh")
