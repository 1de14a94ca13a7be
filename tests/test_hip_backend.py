"""The HIP backend through its ctypes binding, against a recording stand-in libamdhip64
(and, at the end, through the opt-in hip-python binding against the same stand-in).

No gfx950 (and no ROCm) is reachable here: tests/hipstub/hipstub.c, built by the hip_stub
fixture, exports the HIP functions the binding calls with HIP's C signatures and logs each
call; the binding loads it through GFXASM_HIP_LIBRARY, by the same code that finds the real
runtime. torch's side (a ROCm build, the device's gcnArchName) is stubbed by the fixture.
What is verified: the call sequence and caching, the bytes and values crossing the C ABI
(kernarg, grid, block, stream, shared memory), the `extra` layout the runtime checks, error
names and texts, the refusals, and where the runtime is looked for. What is not: that a
real runtime and GPU accept these calls.
"""
import ctypes.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gfxasm.backends import hip, hip_python, hip_runtime
from gfxasm.backends.hip import HipBackend, HipError, HipUnavailable
from gfxasm.toolchain import find_tool


@pytest.fixture
def co(fixture_manifest):
    """axpb's .co: 32 kernarg bytes, no LDS."""
    return fixture_manifest.kernel("axpb").variant("axpb").co_path


@pytest.fixture
def kernarg(gen):
    return torch.randint(0, 256, (32,), generator=gen, dtype=torch.uint8).numpy().tobytes()


def launch(backend, co, kernarg, device=0, stream=0, grid=(1, 1, 1), symbol="axpb"):
    backend.launch(co, symbol, grid, (256, 1, 1), kernarg, device=device, stream=stream)


def test_first_launch_loads_then_later_launches_reuse(hip_stub, co, kernarg):
    backend = HipBackend()
    launch(backend, co, kernarg, stream=0x7F00DEAD1234, grid=(5, 2, 7))
    assert hip_stub.names() == ["hipGetDevice", "hipModuleLoadData", "hipModuleGetFunction",
                                "hipModuleLaunchKernel"]
    [_, (_, load), (_, get), (_, first)] = hip_stub.calls()
    # The runtime is handed the whole code object: the size it reads from the ELF header is the file's.
    assert load == {"device": "0", "amdgpu": "1", "bytes": str(co.stat().st_size)}
    assert get == {"module": "0", "name": "axpb"}
    assert first == {"device": "0", "module": "0", "function": "axpb", "grid": "5,2,7", "block": "256,1,1",
                     "shared": "0", "stream": str(0x7F00DEAD1234), "kernarg": kernarg.hex()}

    hip_stub.clear()
    second = bytes(reversed(kernarg))
    launch(backend, co, second, stream=0)
    assert hip_stub.names() == ["hipGetDevice", "hipModuleLaunchKernel"]
    [launched] = hip_stub.launches()
    assert launched["kernarg"] == second.hex() and launched["stream"] == "0"    # 0: the null stream


def test_launches_on_the_tensors_device_and_restores_the_current_one(hip_stub, co, kernarg):
    backend = HipBackend()
    launch(backend, co, kernarg, device=3)
    assert hip_stub.calls()[1] == ("hipSetDevice", {"device": "3"})
    assert hip_stub.calls()[-1] == ("hipSetDevice", {"device": "0"})
    assert hip_stub.launches()[0]["device"] == "3" and hip_stub.launches()[0]["module"] == "3"
    # A module belongs to one device: device 0 loads its own, then each device reuses its own.
    launch(backend, co, kernarg, device=0)
    launch(backend, co, kernarg, device=3)
    assert [c["device"] for n, c in hip_stub.calls() if n == "hipModuleLoadData"] == ["3", "0"]
    assert [(c["device"], c["module"]) for c in hip_stub.launches()] == [("3", "3"), ("0", "0"), ("3", "3")]


def test_a_rebuilt_code_object_is_loaded_again(hip_stub, co, kernarg, tmp_path):
    copy = tmp_path / "axpb.co"
    copy.write_bytes(co.read_bytes())
    backend = HipBackend()
    launch(backend, copy, kernarg)
    launch(backend, copy, kernarg)
    copy.write_bytes(co.read_bytes() + b"\0" * 8)        # same code, new file version: new size and mtime
    launch(backend, copy, kernarg)
    assert hip_stub.names().count("hipModuleLoadData") == 2


@pytest.mark.parametrize("grid", [(2**31, 1, 1), (1, 2**16 + 1, 1), (1, 1, 2**16 + 1), (2**24, 1, 1)])
def test_a_grid_beyond_what_hip_launches_is_refused_by_name(hip_stub, co, kernarg, grid):
    # (2**24, 1, 1) of 256 workitems is 2**32 workitems in x.
    with pytest.raises(ValueError, match=r"grid \(.*\) of \(256, 1, 1\) workitems: HIP launches at most"):
        launch(HipBackend(), co, kernarg, grid=grid, device=1)
    assert hip_stub.launches() == [] and hip_stub.calls()[-1] == ("hipSetDevice", {"device": "0"})
    launch(HipBackend(), co, kernarg, grid=(2**24 - 1, 2**16, 2**16))      # the largest it takes
    assert hip_stub.launches()[0]["grid"] == f"{2**24 - 1},{2**16},{2**16}"


def test_a_device_that_is_not_gfx950_is_refused_before_any_hip_call(hip_stub, co, kernarg):
    hip_stub.arch[1] = "gfx942:sramecc+:xnack-"
    with pytest.raises(HipError, match=r"device 1 is gfx942:sramecc\+:xnack-, not gfx950"):
        launch(HipBackend(), co, kernarg, device=1)
    hip_stub.arch[1] = "gfx9500"                          # the name, not a prefix of it
    with pytest.raises(HipError, match="device 1 is gfx9500, not gfx950"):
        launch(HipBackend(), co, kernarg, device=1)
    assert hip_stub.names() == []


def test_lds_beyond_160_kib_is_refused_before_loading(hip_stub, tmp_path):
    # The manifest cannot ask for this, so the .co is assembled by hand: 200000 bytes of LDS.
    source = tmp_path / "big_lds.s"
    source.write_text(
        '.amdgcn_target "amdgcn-amd-amdhsa--gfx950"\n.amdhsa_code_object_version 5\n'
        ".text\n.globl big\n.p2align 8\n.type big,@function\nbig:\n    s_endpgm\n.size big, .-big\n"
        ".rodata\n.p2align 6\n.amdhsa_kernel big\n  .amdhsa_group_segment_fixed_size 200000\n"
        "  .amdhsa_user_sgpr_kernarg_segment_ptr 1\n  .amdhsa_next_free_vgpr 1\n  .amdhsa_next_free_sgpr 5\n"
        "  .amdhsa_accum_offset 4\n.end_amdhsa_kernel\n")
    co = tmp_path / "big_lds.co"
    subprocess.run([find_tool("clang"), "-x", "assembler", "-target", "amdgcn-amd-amdhsa", "-mcpu=gfx950",
                    f"--ld-path={find_tool('ld.lld')}", str(source), "-o", str(co)], check=True)
    with pytest.raises(HipError, match="needs 200000 bytes of LDS; gfx950 allows 163840"):
        launch(HipBackend(), co, b"", symbol="big")
    assert "hipModuleLoadData" not in hip_stub.names()


def test_a_kernarg_size_that_does_not_match_the_code_object_is_refused(hip_stub, co, kernarg):
    with pytest.raises(HipError, match="takes 32 kernarg bytes, got 24: is the .co stale"):
        launch(HipBackend(), co, kernarg[:24])
    with pytest.raises(HipError, match="has no kernel 'axmb'"):
        launch(HipBackend(), co, kernarg, symbol="axmb")
    assert "hipModuleLoadData" not in hip_stub.names() and hip_stub.launches() == []


@pytest.mark.parametrize("call, code, message", [
    ("hipGetDevice", 1, "hipGetDevice failed: hipErrorInvalidValue: invalid argument (hipError_t 1)"),
    ("hipModuleLoadData", 200,
     "hipModuleLoadData failed: hipErrorInvalidImage: device kernel image is invalid (hipError_t 200)"),
    ("hipModuleGetFunction", 500,
     "hipModuleGetFunction('axpb') failed: hipErrorNotFound: named symbol not found (hipError_t 500)"),
    ("hipModuleLaunchKernel", 719,
     "hipModuleLaunchKernel failed: hipErrorLaunchFailure: unspecified launch failure (hipError_t 719)"),
    ("hipSetDevice", 999, "hipSetDevice failed: hipErrorUnknown (hipError_t 999)"),   # text = name: said once
])
def test_a_failing_call_raises_with_the_errors_name_and_text(hip_stub, co, kernarg, monkeypatch, call, code, message):
    backend = HipBackend()
    hip_stub.fail(call, code)
    with pytest.raises(HipError) as error:
        launch(backend, co, kernarg, device=2)
    assert str(error.value) == message
    if call not in ("hipGetDevice", "hipSetDevice"):
        assert hip_stub.calls()[-1] == ("hipSetDevice", {"device": "0"})    # restored despite the failure
    # Nothing half-made was cached: the next launch completes.
    monkeypatch.delenv("HIPSTUB_FAIL")
    hip_stub.clear()
    launch(backend, co, kernarg, device=2)
    assert [c["kernarg"] for c in hip_stub.launches()] == [kernarg.hex()]


def test_a_torch_that_is_not_a_rocm_build_is_refused(hip_stub, co, kernarg, monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(HipUnavailable, match=r"no HIP runtime: this PyTorch is not a ROCm build \(torch.version.hip"):
        launch(HipBackend(), co, kernarg)
    assert hip_stub.names() == []


def test_a_missing_runtime_is_hip_unavailable_in_one_line(hip_stub, co, kernarg, monkeypatch, tmp_path):
    monkeypatch.setenv(hip_runtime.LIBRARY_ENV, str(tmp_path / "nowhere" / "libamdhip64.so"))
    with pytest.raises(HipUnavailable) as error:
        launch(HipBackend(), co, kernarg)
    assert str(error.value).startswith(f"no HIP runtime: cannot load {tmp_path}/nowhere/libamdhip64.so (")
    assert "\n" not in str(error.value)

    # Nothing set, nothing mapped, an empty ROCM_PATH, and a name the dynamic loader cannot find
    # (not libamdhip64.so itself: this machine may have Debian's libamdhip64-5 installed).
    monkeypatch.delenv(hip_runtime.LIBRARY_ENV)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path))
    monkeypatch.setattr(hip_runtime, "LIBRARY_NAME", "libamdhip64-absent.so")
    assert hip_runtime.mapped_library() is None
    with pytest.raises(HipUnavailable, match="no HIP runtime: cannot load libamdhip64-absent.so .*GFXASM_HIP_LIBRARY"):
        launch(HipBackend(), co, kernarg)


def test_a_library_that_is_not_a_hip_runtime_is_refused(hip_stub, co, kernarg, monkeypatch):
    monkeypatch.setenv(hip_runtime.LIBRARY_ENV, "libm.so.6")
    with pytest.raises(HipUnavailable, match="libm.so.6 is not a HIP runtime: it has no hipGetDevice"):
        launch(HipBackend(), co, kernarg)


# These run hip_runtime.py alone in a fresh interpreter: once a libamdhip64 is mapped it stays
# for the process's life.
LOAD_HIP_RUNTIME = """
import ctypes, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("hip_runtime", sys.argv[1])
hip_runtime = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hip_runtime)
"""
SEARCH = LOAD_HIP_RUNTIME + """
before = hip_runtime.library_candidates()
ctypes.CDLL(sys.argv[2])                  # as a ROCm torch maps its libamdhip64 when imported
after = hip_runtime.library_candidates()
print(json.dumps([before, after, hip_runtime.open_runtime().path]))
"""


def test_the_runtime_already_in_the_process_comes_first_then_rocm_path(hipstub_library, tmp_path):
    torch_lib, rocm_lib = tmp_path / "torch" / "lib", tmp_path / "rocm" / "lib"
    for folder in (torch_lib, rocm_lib):
        folder.mkdir(parents=True)
        shutil.copy(hipstub_library, folder / "libamdhip64.so")
    env = {k: v for k, v in os.environ.items() if k != hip_runtime.LIBRARY_ENV} | {"ROCM_PATH": str(tmp_path / "rocm")}
    result = subprocess.run([sys.executable, "-c", SEARCH, hip_runtime.__file__, str(torch_lib / "libamdhip64.so")],
                            env=env, capture_output=True, text=True, check=True)
    before, after, opened = json.loads(result.stdout)
    assert before == [str(rocm_lib / "libamdhip64.so"), "libamdhip64.so"]
    assert after == [str(torch_lib / "libamdhip64.so"), str(rocm_lib / "libamdhip64.so"), "libamdhip64.so"]
    assert opened == str(torch_lib / "libamdhip64.so")


REAL = LOAD_HIP_RUNTIME + """
runtime = hip_runtime.open_runtime()
try:
    device = runtime.get_device()
except hip_runtime.HipError as error:
    device = str(error)
print(json.dumps([runtime.describe(200), device]))
"""
REAL_LIBRARY = ctypes.util.find_library("amdhip64")


@pytest.mark.skipif(REAL_LIBRARY is None, reason="no real HIP runtime here (Debian: apt-get install libamdhip64-5)")
def test_a_real_hip_runtime_binds_and_reports_errors():
    """Against an actual libamdhip64 (on CI's machine, Debian's ROCm 5.2 build, with no GPU):
    every bound function resolves, and a failing call is reported by name."""
    env = os.environ | {hip_runtime.LIBRARY_ENV: REAL_LIBRARY}
    result = subprocess.run([sys.executable, "-c", REAL, hip_runtime.__file__], env=env, capture_output=True,
                            text=True, check=True)
    invalid_image, device = json.loads(result.stdout)
    assert invalid_image.startswith("hipErrorInvalidImage") and invalid_image.endswith("(hipError_t 200)")
    assert isinstance(device, int) or device.startswith("hipGetDevice failed: hipError")


# --- The opt-in hip-python binding (GFXASM_HIP_BINDING=hip-python) -----------------------------

def test_an_unknown_binding_is_refused_by_name(hip_stub, co, kernarg, monkeypatch):
    monkeypatch.setenv(hip.BINDING_ENV, "hipify")
    with pytest.raises(HipUnavailable, match="GFXASM_HIP_BINDING='hipify': the HIP bindings are 'ctypes', 'hip-python'"):
        launch(HipBackend(), co, kernarg)
    assert hip_stub.names() == []


def test_hip_python_asked_for_but_not_installed_says_so(hip_stub, co, kernarg, monkeypatch):
    monkeypatch.delenv(hip_runtime.LIBRARY_ENV)
    monkeypatch.setenv(hip.BINDING_ENV, "hip-python")
    monkeypatch.setitem(sys.modules, "hip", None)           # as if hip-python were not installed
    with pytest.raises(HipUnavailable, match=r"GFXASM_HIP_BINDING=hip-python, but hip-python cannot be imported"):
        launch(HipBackend(), co, kernarg)
    assert hip_stub.names() == []


def test_hip_python_of_an_unknown_line_or_beside_gfxasm_hip_library_is_refused(hip_stub, co, kernarg, monkeypatch):
    monkeypatch.setenv(hip.BINDING_ENV, "hip-python")
    with pytest.raises(HipUnavailable, match="GFXASM_HIP_LIBRARY names the library of gfxasm's ctypes binding"):
        launch(HipBackend(), co, kernarg)
    monkeypatch.delenv(hip_runtime.LIBRARY_ENV)
    monkeypatch.setitem(sys.modules, "hip", SimpleNamespace(hip=SimpleNamespace()))
    monkeypatch.setattr(hip_python.importlib.metadata, "version", lambda distribution: "0.0.2")
    with pytest.raises(HipUnavailable, match=r"hip-python 0.0.2: gfxasm calls hip-python 6.x, 7.x, 10.x only"):
        launch(HipBackend(), co, kernarg)
    assert hip_stub.names() == []


# Each hip-python line tested sits in its own folder (one environment holds one version),
# installed there by .ci/run with `pip install --target`; a test runs it in a fresh interpreter
# with that folder on PYTHONPATH, the stand-in runtime mapped as a ROCm torch maps its own.
HIP_PYTHON_DIR = Path(os.environ.get("GFXASM_HIP_PYTHON_DIR") or Path.home() / ".cache" / "gfxasm" / "hip-python")
HIP_PYTHON_VERSIONS = ("10.0.0.0.1.2", "7.2.2.562.43")


@pytest.fixture(params=HIP_PYTHON_VERSIONS)
def hip_python_dir(request) -> Path:
    folder = HIP_PYTHON_DIR / request.param
    if not (folder / "hip").is_dir():
        pytest.skip(f"hip-python {request.param} is not installed in {folder} (.ci/run: pip install --target "
                    f"{folder} hip-python=={request.param})")
    return folder


@pytest.fixture(scope="module")
def stub_named(tmp_path_factory):
    """The stand-in runtime built at `path` with DT_SONAME `soname` (the name the dynamic loader
    matches a bare dlopen against, as hip-python 6.x/7.x opens "libamdhip64.so")."""
    def build(path: Path, soname: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([find_tool("clang"), "-shared", "-fPIC", "-O1", f"-Wl,-soname,{soname}",
                        str(Path(__file__).parent / "hipstub" / "hipstub.c"), "-o", str(path)], check=True)
        return path
    return build


TORCH_SIDE = """
import ctypes, json, os, sys
from pathlib import Path
from types import SimpleNamespace
import torch
from gfxasm.backends.hip import HipBackend, HipError, HipUnavailable
from gfxasm.backends.hip_runtime import mapped_libraries

library, co, kernarg = sys.argv[1], Path(sys.argv[2]), bytes.fromhex(sys.argv[3])
ctypes.CDLL(library)                  # as a ROCm torch maps its libamdhip64 when imported
torch.version.hip = "7.0.0-hipstub"
torch.cuda.get_device_properties = lambda device: SimpleNamespace(gcnArchName="gfx950:sramecc+:xnack-")
log = Path(os.environ["HIPSTUB_LOG"])
"""
SAME_CALLS = TORCH_SIDE + """
seen = {}
for binding in ("ctypes", "hip-python"):
    os.environ["GFXASM_HIP_BINDING"] = binding
    backend = HipBackend()
    log.unlink(missing_ok=True)
    backend.launch(co, "axpb", (5, 2, 7), (256, 1, 1), kernarg, device=3, stream=0x7F00DEAD1234)
    backend.launch(co, "axpb", (1, 1, 1), (256, 1, 1), kernarg[::-1], device=3, stream=0)
    failures = []
    for code in (500, 12345):             # 12345: a code no HIP release has
        os.environ["HIPSTUB_FAIL"] = f"hipModuleGetFunction:{code}"
        try:
            HipBackend().launch(co, "axpb", (1, 1, 1), (256, 1, 1), kernarg, device=0, stream=0)
        except HipError as error:
            failures.append(str(error))
    del os.environ["HIPSTUB_FAIL"]
    seen[binding] = {"calls": log.read_text().splitlines(), "failures": failures, "library": backend.runtime.path}
print(json.dumps(seen))
"""


def run_torch_side(script, hip_python_dir, library, co, kernarg, **env):
    env = {k: v for k, v in os.environ.items() if k not in (hip_runtime.LIBRARY_ENV, hip.BINDING_ENV)} | env
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hip_python_dir), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", script, str(library), str(co), kernarg.hex()], env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_hip_python_makes_the_calls_the_ctypes_binding_makes(hip_python_dir, stub_named, co, kernarg, tmp_path):
    # ROCM_PATH/lib/libamdhip64.so (soname libamdhip64.so) is torch's and the one each line opens.
    rocm = tmp_path / "rocm"
    library = stub_named(rocm / "lib" / "libamdhip64.so", "libamdhip64.so")
    log = tmp_path / "calls.log"
    seen = run_torch_side(SAME_CALLS, hip_python_dir, library, co, kernarg, ROCM_PATH=str(rocm), HIPSTUB_LOG=str(log))
    by_ctypes, by_hip_python = seen["ctypes"], seen["hip-python"]
    assert by_hip_python["calls"] == by_ctypes["calls"]
    launches = [dict(item.split("=", 1) for item in line.split()[1:]) for line in by_ctypes["calls"]
                if line.startswith("hipModuleLaunchKernel")]
    assert [(c["device"], c["grid"], c["stream"], c["kernarg"]) for c in launches] == [
        ("3", "5,2,7", str(0x7F00DEAD1234), kernarg.hex()), ("3", "1,1,1", "0", kernarg[::-1].hex())]
    assert [line.split()[0] for line in by_ctypes["calls"]] == [
        "hipGetDevice", "hipSetDevice", "hipModuleLoadData", "hipModuleGetFunction", "hipModuleLaunchKernel",
        "hipSetDevice", "hipGetDevice", "hipSetDevice", "hipModuleLaunchKernel", "hipSetDevice",
        "hipGetDevice", "hipModuleLoadData", "hipModuleGetFunction",          # fails
        "hipGetDevice", "hipModuleLoadData", "hipModuleGetFunction"]          # fails
    assert by_hip_python["failures"][0] == by_ctypes["failures"][0] == (
        "hipModuleGetFunction('axpb') failed: hipErrorNotFound: named symbol not found (hipError_t 500)")
    assert by_ctypes["failures"][1] == "hipModuleGetFunction('axpb') failed: hipErrorUnknown (hipError_t 12345)"
    assert by_hip_python["failures"][1] == ("hipModuleGetFunction('axpb') failed with a hipError_t hip-python does "
                                            "not know (12345 is not a valid hipError_t)")
    assert by_ctypes["library"] == str(library)
    assert by_hip_python["library"] == (str(library) if hip_python_dir.name.startswith("10.") else "libamdhip64.so")


REFUSED = TORCH_SIDE + """
os.environ["GFXASM_HIP_BINDING"] = "hip-python"
try:
    HipBackend().launch(co, "axpb", (1, 1, 1), (256, 1, 1), kernarg, device=0, stream=0)
    refusal = None
except HipUnavailable as error:
    refusal = str(error)
mapped = mapped_libraries()
calls_by_hip_python = log.read_text().splitlines() if log.exists() else []
os.environ["GFXASM_HIP_BINDING"] = "ctypes"          # the default binding still uses torch's library
HipBackend().launch(co, "axpb", (1, 1, 1), (256, 1, 1), kernarg, device=0, stream=0)
print(json.dumps([refusal, mapped, calls_by_hip_python, log.read_text().splitlines()]))
"""


def test_hip_python_opening_another_runtime_than_torchs_is_refused(hip_python_dir, stub_named, co, kernarg, tmp_path):
    # torch's is TORCH/lib/libamdhip64.so.6 (soname libamdhip64.so.6); the name each line would
    # open resolves to a second copy, OTHER/lib/libamdhip64.so, through ROCM_PATH or the loader path.
    torchs = stub_named(tmp_path / "torch" / "lib" / "libamdhip64.so.6", "libamdhip64.so.6")
    other = stub_named(tmp_path / "other" / "lib" / "libamdhip64.so", "libamdhip64.so")
    log = tmp_path / "calls.log"
    refusal, mapped, calls_by_hip_python, calls = run_torch_side(
        REFUSED, hip_python_dir, torchs, co, kernarg, ROCM_PATH=str(other.parent.parent),
        LD_LIBRARY_PATH=str(other.parent), HIPSTUB_LOG=str(log))
    opens = str(other) if hip_python_dir.name.startswith("10.") else "libamdhip64.so"
    assert refusal.startswith(f"hip-python {hip_python_dir.name} would open '{opens}', which is not loaded in this "
                              f"process: a second HIP runtime beside torch's {torchs}")
    assert mapped == [str(torchs)] and calls_by_hip_python == []          # nothing opened, nothing called
    assert calls[-1].startswith("hipModuleLaunchKernel device=0")
