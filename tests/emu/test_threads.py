"""Strict emulator launches from several threads at once (issue 26, crash 5).

The emulator sets its compiled bookkeeping (gfxasm.emu.fast, numba) up lazily, at the
first strict launch of a process that has fast.MIN_WAVES waves or more. Two threads making
that first launch together used to run the setup twice, and the second jitted an already
jitted function (TypeError, ~1 in 3 processes with two threads, nearly always with four).
So each round here is a FRESH Python process (nothing set up yet) in which four threads,
held at a barrier, each make a first strict launch of a real kernel at once: both
mxfp8_gemm families (the VALU GEMV, M <= 2, and the MFMA GEMM), each launch of 64 waves or
more so that it takes the compiled path. Every output must equal, bit for bit, the same
call run serially in this process — launches share decoded programs, per-instruction
caches, hazard tables and the op's plan cache, so a concurrent run that disturbed any of
them would show here — and the serial outputs must match the float64 reference within
the op's own error bound, so the comparison is against a right answer.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gfxasm
from gfxasm.ops import mxfp8_gemm as gemm_op

REPO = Path(__file__).resolve().parents[2]
# (M, N, K): M <= 2 takes the GEMV (mxfp8_gemv_m1 / _m2), larger M the MFMA kernel; every
# launch has at least 64 waves (the compiled path's threshold outside tests/emu).
CASES = [(1, 256, 256), (2, 128, 512), (16, 1024, 256), (5, 1024, 128)]
ROUNDS = 3


def inputs(seed: int, M: int, N: int, K: int):
    """Random e4m3 operands (every finite code range, some zeros) and E8M0 scales near 1."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(M, K, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(N, K, generator=g) * 4).to(torch.float8_e4m3fn)
    sa = torch.randint(118, 136, (M, K // 32), generator=g, dtype=torch.uint8)
    sb = torch.randint(118, 136, (N, K // 32), generator=g, dtype=torch.uint8)
    return a, sa, b, sb


# Run in a fresh interpreter: four threads wait at a barrier, then each makes its first
# strict launch; the outputs go back through torch.save. It checks that nothing was set up
# before the threads start, and reports whether the compiled path was set up at all.
CHILD = r"""
import sys, threading, torch
sys.path.insert(0, sys.argv[1])
from tests.emu.test_threads import CASES, inputs
import gfxasm
from gfxasm.emu import fast
assert not fast._loaded, "the compiled bookkeeping was set up before the first launch"
barrier = threading.Barrier(len(CASES))
outs, errors = {}, []
def work(i):
    args = inputs(i, *CASES[i])
    barrier.wait()
    try:
        outs[i] = gfxasm.mxfp8_gemm(*args)
    except BaseException as exc:
        import traceback
        errors.append(traceback.format_exc())
threads = [threading.Thread(target=work, args=(i,)) for i in range(len(CASES))]
for t in threads: t.start()
for t in threads: t.join()
if errors:
    sys.exit("".join(errors))
torch.save({"outs": outs, "compiled": fast._loaded[0] is not None}, sys.argv[2])
"""


def _numba_wanted() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return os.environ.get("GFXASM_EMU_NUMBA") != "0"


@pytest.fixture(scope="module")
def serial():
    """Each case run alone, one after another, in this process."""
    outs = {}
    for i, case in enumerate(CASES):
        args = inputs(i, *case)
        outs[i] = gfxasm.mxfp8_gemm(*args)
        err = (outs[i].double() - gemm_op.reference(*args).double()).abs()
        assert (err <= gemm_op.error_bound(*args)).all(), f"case {case}: serial result off the reference"
    return outs


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_first_launches_from_four_threads_match_serial(serial, round_, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("GFXASM_BACKEND",)}
    result = tmp_path / "outs.pt"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(REPO), str(result)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"threaded launches failed:\n{proc.stderr[-4000:]}"
    got = torch.load(result)
    # With numba present the first launches must really have set the compiled path up
    # (else this test could not see the race it is about).
    assert got["compiled"] == _numba_wanted()
    for i, case in enumerate(CASES):
        want, out = serial[i], got["outs"][i]
        assert out.dtype == want.dtype and out.shape == want.shape
        assert torch.equal(out.view(torch.int16), want.view(torch.int16)), f"case {case}: threaded != serial"
