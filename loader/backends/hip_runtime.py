"""A ctypes binding to the seven HIP runtime C functions gfxasm launches with (the default;
hip_python.py makes the same calls through hip-python, GFXASM_HIP_BINDING=hip-python).

Signatures and values are those of ROCm's public header include/hip/hip_runtime_api.h
(github.com/ROCm/HIP, commit c5e11fc, 2024-10), cited at each binding; what the runtime does
with `extra` is read from ROCm's clr (hipamd/src/hip_module.cpp, commit f9f995c). The C ABI
is what a ROCm torch links against; hip-python's Python signatures, used before, changed in
10.x (issue 14).

Which libamdhip64: torch's stream handles and device pointers belong to the HIP runtime a
ROCm torch already loaded, so that very library is used (one HIP runtime per process; a
second copy would be handed handles it never made). Searched in this order:

    $GFXASM_HIP_LIBRARY   an explicit path (or soname): used alone, so a wrong one is an error
    /proc/self/maps       a libamdhip64 already mapped into this process (by torch)
    $ROCM_PATH/lib        (ROCM_PATH defaults to /opt/rocm)
    libamdhip64.so        the dynamic loader's own search

This module needs only the standard library (tests load it in a bare subprocess).
"""
from __future__ import annotations

import abc
import ctypes
import functools
import os
from pathlib import Path

LIBRARY_ENV = "GFXASM_HIP_LIBRARY"
LIBRARY_NAME = "libamdhip64.so"
PROCESS_MAPS = Path("/proc/self/maps")

# hip_runtime_api.h: `#define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void*)0x01)`, `..._SIZE ((void*)0x02)`,
# `..._END ((void*)0x03)` (CUDA's END is 0x00: HIP's differs).
HIP_LAUNCH_PARAM_BUFFER_POINTER = 0x01
HIP_LAUNCH_PARAM_BUFFER_SIZE = 0x02
HIP_LAUNCH_PARAM_END = 0x03

# clr's hipModuleLaunchKernel (hipamd/src/hip_module.cpp, commit f9f995c) refuses larger grids with a
# bare hipErrorInvalidValue / hipErrorInvalidConfiguration; they are refused here by name instead.
MAX_GRID = (2**31 - 1, 2**16, 2**16)       # workgroups in x, y, z
MAX_GRID_X_ITEMS = 2**32 - 1               # gridDimX * blockDimX

_error_t = ctypes.c_int           # `typedef enum hipError_t {hipSuccess = 0, ...}`: an int in the C ABI
_handle = ctypes.c_void_p         # hipModule_t, hipFunction_t, hipStream_t: opaque pointers
_uint = ctypes.c_uint
# name: (restype, argtypes), each as declared in hip_runtime_api.h.
SIGNATURES = {
    # hipError_t hipGetDevice(int* deviceId);
    "hipGetDevice": (_error_t, [ctypes.POINTER(ctypes.c_int)]),
    # hipError_t hipSetDevice(int deviceId);
    "hipSetDevice": (_error_t, [ctypes.c_int]),
    # hipError_t hipModuleLoadData(hipModule_t* module, const void* image);
    "hipModuleLoadData": (_error_t, [ctypes.POINTER(_handle), ctypes.c_char_p]),
    # hipError_t hipModuleGetFunction(hipFunction_t* function, hipModule_t module, const char* kname);
    "hipModuleGetFunction": (_error_t, [ctypes.POINTER(_handle), _handle, ctypes.c_char_p]),
    # hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gridDimX, gridDimY, gridDimZ,
    #     unsigned int blockDimX, blockDimY, blockDimZ, unsigned int sharedMemBytes, hipStream_t stream,
    #     void** kernelParams, void** extra);   grid in workgroups: clr multiplies it by blockDim
    "hipModuleLaunchKernel": (_error_t, [_handle, _uint, _uint, _uint, _uint, _uint, _uint, _uint, _handle,
                                         ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]),
    # const char* hipGetErrorName(hipError_t hip_error);  const char* hipGetErrorString(hipError_t hipError);
    "hipGetErrorName": (ctypes.c_char_p, [_error_t]),
    "hipGetErrorString": (ctypes.c_char_p, [_error_t]),
}


class HipError(RuntimeError):
    pass


class HipUnavailable(HipError):
    pass


def mapped_libraries(maps: Path = PROCESS_MAPS) -> list[str]:
    """The paths of the libamdhip64 files mapped into this process, in address order."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:                  # not Linux
        return []
    paths = (fields[5] for fields in (line.split(maxsplit=5) for line in lines)   # address perms offset dev inode [path]
             if len(fields) == 6 and Path(fields[5]).name.startswith("libamdhip64"))
    return list(dict.fromkeys(paths))


def mapped_library(maps: Path = PROCESS_MAPS) -> str | None:
    """The path of a libamdhip64 already mapped into this process, if any."""
    return next(iter(mapped_libraries(maps)), None)


def library_candidates() -> list[str]:
    """Where to look for the HIP runtime, in order (see the module docstring)."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        return [override]
    mapped = mapped_library()
    rocm = Path(os.environ.get("ROCM_PATH") or "/opt/rocm") / "lib" / LIBRARY_NAME
    return [*([mapped] if mapped else []), *([str(rocm)] if rocm.is_file() else []), LIBRARY_NAME]


def open_runtime() -> HipRuntime:
    """The process's HIP runtime, from the first candidate that loads."""
    failures = []
    for candidate in library_candidates():
        try:
            return _runtime_at(candidate)
        except OSError as exc:
            failures.append(f"{candidate} ({' '.join(str(exc).split())})")
    raise HipUnavailable(f"no HIP runtime: cannot load {'; '.join(failures)}; on a ROCm machine install a "
                         f"ROCm build of torch, or name libamdhip64.so in {LIBRARY_ENV}")


@functools.cache
def _runtime_at(path: str) -> HipRuntime:
    return HipRuntime(ctypes.CDLL(path), path)


class RuntimeBinding(abc.ABC):
    """The HIP calls HipBackend makes, whichever binding makes them (HipRuntime below, or
    hip_python.HipPythonRuntime): every call's hipError_t is checked, and raised with its
    name and text. Module and function handles are opaque to the caller."""

    path: str                     # the libamdhip64 the calls go to

    def check(self, error: int, call: str) -> None:
        if error:
            raise HipError(f"{call} failed: {self.describe(int(error))}")

    def describe(self, error: int) -> str:
        name, text = self.error_name_and_text(error)
        if text != name:          # older runtimes (ROCm 5.2, tried) answer hipGetErrorString with the name
            name = f"{name}: {text}"
        return f"{name} (hipError_t {error})"

    def launch_kernel(self, function, grid: tuple[int, int, int], block: tuple[int, int, int],
                      stream: int, kernarg: bytes) -> None:
        """Queue `function` on `stream` (0: the null stream), its kernarg bytes passed through `extra`."""
        if any(g > limit for g, limit in zip(grid, MAX_GRID)) or grid[0] * block[0] > MAX_GRID_X_ITEMS:
            raise ValueError(f"grid {tuple(grid)} of {tuple(block)} workitems: HIP launches at most "
                             f"{MAX_GRID} workgroups and {MAX_GRID_X_ITEMS} workitems in x")
        # The runtime copies the kernarg bytes during the call (clr hip_module.cpp), so these
        # buffers need not outlive it.
        arguments = ctypes.create_string_buffer(kernarg, len(kernarg))
        size = ctypes.c_size_t(len(kernarg))
        extra = (ctypes.c_void_p * 5)(HIP_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(arguments),
                                      HIP_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size), HIP_LAUNCH_PARAM_END)
        self.check(self.module_launch_kernel(function, grid, block, stream or None, extra), "hipModuleLaunchKernel")

    # What each binding provides.
    @abc.abstractmethod
    def error_name_and_text(self, error: int) -> tuple[str, str]:
        """hipGetErrorName and hipGetErrorString of `error`."""

    @abc.abstractmethod
    def module_launch_kernel(self, function, grid, block, stream: int | None, extra: ctypes.Array) -> int:
        """hipModuleLaunchKernel with no kernelParams and no shared memory; its hipError_t."""

    @abc.abstractmethod
    def get_device(self) -> int: ...

    @abc.abstractmethod
    def set_device(self, device: int) -> None: ...

    @abc.abstractmethod
    def load_module(self, image: bytes):
        """A module from a code object in memory; `image` must stay alive while it is loaded."""

    @abc.abstractmethod
    def get_function(self, module, symbol: str): ...


class HipRuntime(RuntimeBinding):
    """The ctypes binding."""

    def __init__(self, library: ctypes.CDLL, path: str):
        self.path = path
        for name, (restype, argtypes) in SIGNATURES.items():
            try:
                function = getattr(library, name)
            except AttributeError:
                raise HipUnavailable(f"{path} is not a HIP runtime: it has no {name}") from None
            function.restype, function.argtypes = restype, argtypes
            setattr(self, f"_{name}", function)

    def error_name_and_text(self, error: int) -> tuple[str, str]:
        name, text = ((f(error) or b"?").decode(errors="replace")
                      for f in (self._hipGetErrorName, self._hipGetErrorString))
        return name, text

    def get_device(self) -> int:
        device = ctypes.c_int()
        self.check(self._hipGetDevice(ctypes.byref(device)), "hipGetDevice")
        return device.value

    def set_device(self, device: int) -> None:
        self.check(self._hipSetDevice(device), "hipSetDevice")

    def load_module(self, image: bytes) -> int:
        module = _handle()
        self.check(self._hipModuleLoadData(ctypes.byref(module), image), "hipModuleLoadData")
        return module.value

    def get_function(self, module: int, symbol: str) -> int:
        function = _handle()
        self.check(self._hipModuleGetFunction(ctypes.byref(function), module, symbol.encode()),
                   f"hipModuleGetFunction('{symbol}')")
        return function.value

    def module_launch_kernel(self, function: int, grid, block, stream: int | None, extra: ctypes.Array) -> int:
        return self._hipModuleLaunchKernel(function, *grid, *block, 0, stream, None, extra)
