"""The HIP calls of hip_runtime.RuntimeBinding made through AMD's hip-python (opt-in:
GFXASM_HIP_BINDING=hip-python; `pip install 'gfxasm[hip-python]'` or the hip-python of your ROCm).

hip-python opens the HIP runtime itself, by a name of its own choosing, the first time one of
its functions is called:

    6.x, 7.x   dlopen("libamdhip64.so"), the name in `hip.chip.DLL`
    10.x       rocm.bindings.util.paths.get_library_path("amdhip64"): a libamdhip64.so bundled
               in the rocm package, rocm_sdk's, $ROCM_PATH/lib's (default /opt/rocm), else the
               bare name

That can be a second HIP runtime beside the one a ROCm torch mapped, which would be handed
stream handles and device pointers it never made. So before hip-python's first call, the name
it will open is asked of the dynamic loader with RTLD_NOLOAD: it must resolve to the very
library torch mapped (same handle), or nothing is called and HipUnavailable says why.

Call forms that differ between the lines: 6.x/7.x take a kernel name only as bytes (10.x also
takes str), and the package is `hip` there but an alias of `rocm.bindings` in 10.x; both
return (hipError_t, values...) tuples and take the `extra` array as a ctypes object. Tested
(tests/test_hip_backend.py) against the recording stand-in runtime with 10.0.0.0.1.2 and
7.2.2.562.43; nothing here has run on a GPU.
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import os

from .hip_runtime import LIBRARY_ENV, HipError, HipUnavailable, RuntimeBinding, mapped_libraries

DISTRIBUTION = "hip-python"
LINES = (6, 7, 10)               # hip-python major versions whose call forms are known here


def open_hip_python() -> HipPythonRuntime:
    """hip-python's binding, once the library it opens is shown to be the one torch mapped."""
    if os.environ.get(LIBRARY_ENV):
        raise HipUnavailable(f"{LIBRARY_ENV} names the library of gfxasm's ctypes binding; hip-python opens its "
                             f"own (see gfxasm.backends.hip_python): unset {LIBRARY_ENV} or the hip-python binding")
    try:
        version = importlib.metadata.version(DISTRIBUTION)
        from hip import hip
    except (importlib.metadata.PackageNotFoundError, ImportError) as exc:
        raise HipUnavailable(f"GFXASM_HIP_BINDING=hip-python, but hip-python cannot be imported ({exc}): install "
                             f"the hip-python of your ROCm, or leave GFXASM_HIP_BINDING unset for the ctypes "
                             f"binding") from None
    major = int(version.split(".")[0])
    if major not in LINES:
        raise HipUnavailable(f"hip-python {version}: gfxasm calls hip-python {', '.join(f'{v}.x' for v in LINES)} "
                             f"only")
    name = _library_name(major)
    _require_torchs_library(name, version)
    return HipPythonRuntime(hip, name)


def _library_name(major: int) -> str:
    """The name or path hip-python passes to dlopen on its first call."""
    if major >= 10:
        from rocm.bindings.util.paths import get_library_path
        return os.fsdecode(get_library_path("amdhip64"))
    from hip import chip
    return os.fsdecode(chip.DLL)


def _loaded_handle(name: str) -> int | None:
    """The dynamic loader's handle for `name` if that resolves to a library already loaded."""
    try:
        return ctypes.CDLL(name, mode=os.RTLD_NOW | os.RTLD_NOLOAD)._handle
    except OSError:
        return None


def _require_torchs_library(name: str, version: str) -> None:
    mapped = mapped_libraries()
    if len(mapped) != 1:
        raise HipUnavailable(
            f"hip-python {version}: {'no libamdhip64 is' if not mapped else f'{len(mapped)} are'} mapped into this "
            f"process{'' if not mapped else ' (' + ', '.join(mapped) + ')'}; gfxasm uses hip-python only when it "
            f"binds the one HIP runtime a ROCm torch mapped")
    [torchs] = mapped
    theirs = _loaded_handle(name)
    if theirs is None or theirs != _loaded_handle(torchs):
        raise HipUnavailable(
            f"hip-python {version} would open {name!r}, which "
            f"{'is not loaded in this process' if theirs is None else 'is another library'}: a second HIP runtime "
            f"beside torch's {torchs}, handed streams and pointers it never made. Make that name resolve to "
            f"torch's library (10.x: $ROCM_PATH/lib/libamdhip64.so; 6.x/7.x: its soname), or leave "
            f"GFXASM_HIP_BINDING unset for the ctypes binding, which uses torch's")


class HipPythonRuntime(RuntimeBinding):
    def __init__(self, hip, path: str):
        self._hip, self.path = hip, path

    @staticmethod
    def _call(call: str, function, *args) -> tuple:
        """hip-python's `function`(*args): its (hipError_t, ...) tuple."""
        try:
            return function(*args)
        except ValueError as exc:      # hip-python turns the C result into its enum, which lacks the code
            raise HipError(f"{call} failed with a hipError_t hip-python does not know ({exc})") from None

    def error_name_and_text(self, error: int) -> tuple[str, str]:
        code = self._hip.hipError_t(error)
        _, name = self._hip.hipGetErrorName(code)
        _, text = self._hip.hipGetErrorString(code)
        return bytes(name).decode(errors="replace"), bytes(text).decode(errors="replace")

    def get_device(self) -> int:
        error, device = self._call("hipGetDevice", self._hip.hipGetDevice)
        self.check(error, "hipGetDevice")
        return device

    def set_device(self, device: int) -> None:
        (error,) = self._call("hipSetDevice", self._hip.hipSetDevice, device)
        self.check(error, "hipSetDevice")

    def load_module(self, image: bytes):
        error, module = self._call("hipModuleLoadData", self._hip.hipModuleLoadData, image)
        self.check(error, "hipModuleLoadData")
        return module

    def get_function(self, module, symbol: str):
        call = f"hipModuleGetFunction('{symbol}')"
        error, function = self._call(call, self._hip.hipModuleGetFunction, module, symbol.encode())  # 6.x/7.x: bytes
        self.check(error, call)
        return function

    def module_launch_kernel(self, function, grid, block, stream: int | None, extra: ctypes.Array) -> int:
        (error,) = self._call("hipModuleLaunchKernel", self._hip.hipModuleLaunchKernel, function, *grid, *block, 0,
                              stream, None, extra)
        return error
