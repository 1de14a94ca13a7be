"""HIP backend: launches a built `.co` on a gfx950 GPU through hip-python.

hip-python is imported on first use, so the package works without ROCm. Every HIP call
goes through `check`, which raises with hipGetErrorString. Per launch:

    hipGetDevice / hipSetDevice       launch on the tensors' device, then restore it
    hipGetDeviceProperties            once per device: refuse anything but gfx950
    hipModuleLoadData                 once per (device, .co contents)
    hipModuleGetFunction              once per (module, symbol)
    hipModuleLaunchKernel             on the given stream, kernarg bytes through `extra`

Nothing here has run on a real gfx950 yet (none is reachable from the development
machines); tests drive it with a recording stand-in for hip-python.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

from ..codeobj import KernelInfo, load_code_object
from ..manifest import LDS_LIMIT_BYTES

# hip_runtime_api.h: markers of the `extra` array (END is 3 in HIP, unlike CUDA's 0).
HIP_LAUNCH_PARAM_BUFFER_POINTER = 0x01
HIP_LAUNCH_PARAM_BUFFER_SIZE = 0x02
HIP_LAUNCH_PARAM_END = 0x03
SUPPORTED_ARCH = "gfx950"


class HipError(RuntimeError):
    pass


class HipUnavailable(HipError):
    pass


def import_hip():
    try:
        from hip import hip
    except (ImportError, OSError) as exc:
        raise HipUnavailable(f"no HIP runtime: cannot import hip-python ({exc}); on a ROCm machine with a "
                             f"gfx950, pip install hip-python") from None
    return hip


@dataclass
class _LoadedModule:
    handle: object                                   # hipModule_t
    functions: dict[str, object] = field(default_factory=dict)   # symbol -> hipFunction_t


class HipBackend:
    def __init__(self, hip=None):
        self._hip = hip
        self._arch: dict[int, str] = {}                                  # device -> gcnArchName
        self._code_objects: dict[tuple, tuple[bytes, dict[str, KernelInfo]]] = {}
        self._modules: dict[tuple, _LoadedModule] = {}                   # (device, file key)

    @property
    def hip(self):
        if self._hip is None:
            self._hip = import_hip()
        return self._hip

    def check(self, result, call: str):
        """hip-python returns (error, *values): raise on an error, else return the value(s)."""
        error, *values = result
        if error != self.hip.hipError_t.hipSuccess:
            message = self.hip.hipGetErrorString(error)
            if isinstance(message, bytes):
                message = message.decode(errors="replace")
            raise HipError(f"{call} failed: {message} ({error})")
        return values[0] if len(values) == 1 else tuple(values)

    def launch(self, co_path: Path, symbol: str, grid: tuple[int, int, int], block: tuple[int, int, int],
               kernarg: bytes, device: int, stream: int) -> None:
        hip = self.hip
        previous = self.check(hip.hipGetDevice(), "hipGetDevice")
        if previous != device:
            self.check(hip.hipSetDevice(device), "hipSetDevice")
        try:
            self._require_gfx950(device)
            function = self._function(device, co_path, symbol, len(kernarg))
            # The runtime copies the kernarg bytes during the call, so these may die after it.
            arguments = (ctypes.c_char * len(kernarg)).from_buffer_copy(kernarg)
            size = ctypes.c_size_t(len(kernarg))
            extra = (ctypes.c_void_p * 5)(HIP_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(arguments),
                                          HIP_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size),
                                          HIP_LAUNCH_PARAM_END)
            self.check(hip.hipModuleLaunchKernel(function, *grid, *block, 0, stream or None, None,
                                                 ctypes.addressof(extra)), "hipModuleLaunchKernel")
        finally:
            if previous != device:
                self.check(hip.hipSetDevice(previous), "hipSetDevice")

    def _require_gfx950(self, device: int) -> None:
        if device not in self._arch:
            properties = self.hip.hipDeviceProp_t()
            self.check(self.hip.hipGetDeviceProperties(properties, device), "hipGetDeviceProperties")
            arch = properties.gcnArchName
            self._arch[device] = arch.decode() if isinstance(arch, bytes) else str(arch)
        arch = self._arch[device]
        if arch.split(":")[0] != SUPPORTED_ARCH:
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
            module = _LoadedModule(self.check(self.hip.hipModuleLoadData(data), "hipModuleLoadData"))
            self._modules[(device, file_key)] = module
        if symbol not in module.functions:
            module.functions[symbol] = self.check(
                self.hip.hipModuleGetFunction(module.handle, symbol.encode()), "hipModuleGetFunction")
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
