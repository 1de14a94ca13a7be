"""The HIP backend up to the hip-python calls.

No gfx950 (and no ROCm) is reachable here, so hip-python is replaced by RecordingHip
(conftest.py). What is verified: the call sequence and caching, the kernarg bytes,
grid/block/stream, the refusals before launch, and error reporting. What is not: that a
real runtime accepts these calls.
"""
import subprocess
import sys

import pytest

from gfxasm.backends.hip import HipBackend, HipError, HipUnavailable
from gfxasm.toolchain import find_tool

from conftest import RecordingHip


def names(calls):
    return [c[0] for c in calls]


@pytest.fixture
def co(fixture_manifest):
    """axpb's variant and .co: 32 kernarg bytes, no LDS."""
    variant = fixture_manifest.kernel("axpb").variant("axpb")
    return variant.co_path


KERNARG = bytes(range(32))


def test_first_launch_loads_then_later_launches_reuse(co):
    hip = RecordingHip()
    backend = HipBackend(hip)
    backend.launch(co, "axpb", (5, 2, 1), (256, 1, 1), KERNARG, device=0, stream=0x1234)
    assert names(hip.calls) == ["hipGetDevice", "hipGetDeviceProperties", "hipModuleLoadData",
                                "hipModuleGetFunction", "hipModuleLaunchKernel"]
    assert hip.calls[3][2] == b"axpb"
    [launch] = hip.launches
    assert launch["grid"] == (5, 2, 1) and launch["block"] == (256, 1, 1)
    assert launch["shared"] == 0 and launch["params"] is None and launch["stream"] == 0x1234
    assert launch["kernarg"] == KERNARG
    assert launch["function"] == ("module on device 0", b"axpb")

    hip.calls.clear()
    second = bytes(reversed(KERNARG))
    backend.launch(co, "axpb", (1, 1, 1), (256, 1, 1), second, device=0, stream=0)
    assert names(hip.calls) == ["hipGetDevice", "hipModuleLaunchKernel"]
    assert hip.launches[1]["kernarg"] == second
    assert hip.launches[1]["stream"] is None            # stream 0: the null stream


def test_launches_on_the_tensors_device_and_restores_the_current_one(co):
    hip = RecordingHip(current_device=1)
    backend = HipBackend(hip)
    backend.launch(co, "axpb", (1, 1, 1), (256, 1, 1), KERNARG, device=0, stream=0)
    assert hip.calls[1] == ("hipSetDevice", 0)
    assert ("hipModuleLoadData", 0, co.stat().st_size) in hip.calls
    assert ("hipModuleLaunchKernel", 0) in hip.calls
    assert hip.calls[-1] == ("hipSetDevice", 1) and hip.current_device == 1
    # A module belongs to one device: device 1 loads its own.
    backend.launch(co, "axpb", (1, 1, 1), (256, 1, 1), KERNARG, device=1, stream=0)
    assert [c for c in hip.calls if c[0] == "hipModuleLoadData"] == [
        ("hipModuleLoadData", 0, co.stat().st_size), ("hipModuleLoadData", 1, co.stat().st_size)]


def test_a_rebuilt_code_object_is_loaded_again(co, tmp_path):
    copy = tmp_path / "axpb.co"
    copy.write_bytes(co.read_bytes())
    hip = RecordingHip()
    backend = HipBackend(hip)
    backend.launch(copy, "axpb", (1, 1, 1), (256, 1, 1), KERNARG, device=0, stream=0)
    copy.write_bytes(co.read_bytes() + b"\0" * 8)        # same code, new file: new size and mtime
    backend.launch(copy, "axpb", (1, 1, 1), (256, 1, 1), KERNARG, device=0, stream=0)
    assert names(hip.calls).count("hipModuleLoadData") == 2


def test_a_device_that_is_not_gfx950_is_refused_before_loading(co):
    hip = RecordingHip(arch=b"gfx942:sramecc+:xnack-", current_device=2)
    with pytest.raises(HipError, match="device 0 is gfx942:sramecc\\+:xnack-, not gfx950"):
        HipBackend(hip).launch(co, "axpb", (1, 1, 1), (256, 1, 1), KERNARG, device=0, stream=0)
    assert "hipModuleLoadData" not in names(hip.calls) and "hipModuleLaunchKernel" not in names(hip.calls)
    assert hip.current_device == 2                       # restored even though the launch failed


def test_lds_beyond_160_kib_is_refused_before_loading(tmp_path):
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
    hip = RecordingHip()
    with pytest.raises(HipError, match="needs 200000 bytes of LDS; gfx950 allows 163840"):
        HipBackend(hip).launch(co, "big", (1, 1, 1), (64, 1, 1), b"", device=0, stream=0)
    assert "hipModuleLoadData" not in names(hip.calls)


def test_a_kernarg_size_that_does_not_match_the_code_object_is_refused(co):
    hip = RecordingHip()
    with pytest.raises(HipError, match="takes 32 kernarg bytes, got 24: is the .co stale"):
        HipBackend(hip).launch(co, "axpb", (1, 1, 1), (256, 1, 1), bytes(24), device=0, stream=0)
    with pytest.raises(HipError, match="has no kernel 'axmb'"):
        HipBackend(hip).launch(co, "axmb", (1, 1, 1), (256, 1, 1), KERNARG, device=0, stream=0)
    assert "hipModuleLaunchKernel" not in names(hip.calls)


@pytest.mark.parametrize("call, code, text", [
    ("hipModuleLoadData", 200, "device kernel image is invalid"),
    ("hipModuleLaunchKernel", 719, "unspecified launch failure"),
])
def test_a_failing_call_raises_with_hipGetErrorString(co, call, code, text):
    hip = RecordingHip(fail={call: RecordingHip.hipError_t(code)})
    with pytest.raises(HipError) as error:
        HipBackend(hip).launch(co, "axpb", (1, 1, 1), (256, 1, 1), KERNARG, device=0, stream=0)
    assert str(error.value).startswith(f"{call} failed: {text}")


def test_without_hip_python_the_error_is_one_line(co, monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)        # makes `from hip import hip` fail, as here
    with pytest.raises(HipUnavailable) as error:
        HipBackend().launch(co, "axpb", (1, 1, 1), (256, 1, 1), KERNARG, device=0, stream=0)
    assert str(error.value).startswith("no HIP runtime") and "\n" not in str(error.value)
    assert "pip install hip-python" in str(error.value)
