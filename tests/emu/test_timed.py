"""The timed schedule (gfxasm.emu.timed): the timing model's per-CU simulation orders the
waves and lands the loads.

Known order: a wave issues an LDS DMA, another wave reads the same LDS bytes with no
barrier between, a number of cycles later that the test sets with s_nop (the model's rule:
s_nop N holds the wave (N + 1) x issue_quantum cycles). The DMA completes after the
global-memory latency of gfxasm.perf.params: a reader half that latency later sees the old
bytes, a reader twice that latency later the new ones; under lockstep it sees the new
ones either way (the DMA lands at its wave's s_waitcnt, which runs first). The schedule is
deterministic (two runs, same bits), and hardware-proven corpus code comes out right under
it: a strict-clean paged attention and causal group FMHA, and the MLA decode of finding F2
(docs/conformance.md), which the lockstep order gets wrong. The schedule runs the timing
model's own rules: replaying the streams each wave executed under it with
gfxasm.perf.model.simulate_cu gives the same cycle count per workgroup, the same matrix-pipe
busy time and the same instruction counts.
Budget: about 10 s for this file on one core.
"""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

import gfxasm.emu as emu
from gfxasm.perf import model, params, stats
from kernel_source import assemble
from test_strict import X, source
from tests.conformance import cases, cases_mla

# Both waves fill LDS[0:512) with x[256 + id] and meet at a barrier. Wave 0 then DMAs
# x[0:64] into LDS[0:256); wave 1, {delay} later and with no barrier, reads LDS[0:256)
# and stores what it saw to out[0:64].
DMA_THEN_READ = """
  global_load_dword v3, v2, s[4:5] offset:1024   // v3 = x[256 + id]
  s_waitcnt vmcnt(0)
  ds_write_b32 v2, v3
  s_waitcnt lgkmcnt(0)
  s_barrier
  v_readfirstlane_b32 s20, v1         // 0 in wave 0, 64 in wave 1
  s_nop 4
  s_cmp_eq_u32 s20, 0
  s_cbranch_scc0 L_reader
  s_mov_b32 m0, 0
  buffer_load_dword v2, s[12:15], 0 offen lds    // LDS[4 l] = x[l]
  s_waitcnt vmcnt(0)
  s_branch L_end
L_reader:
{delay}
  v_subrev_u32 v6, 0x100, v2          // 4 (id - 64)
  ds_read_b32 v4, v6
  s_waitcnt lgkmcnt(0)
  global_store_dword v6, v4, s[6:7]
  s_waitcnt vmcnt(0)
L_end:
"""


def dma_latency_cycles() -> float:
    prm = params.DEFAULT
    return (prm.global_latency_ns + prm.dram_extra_latency_ns) * 1e-9 * prm.clock_hz


def delay(cycles: float) -> str:
    """s_nop 15 instructions holding a wave at least `cycles` (64 cycles each in the model)."""
    per = 16 * params.DEFAULT.issue_quantum
    return "\n".join(["  s_nop 15"] * math.ceil(cycles / per))


def read_by_wave_1(cycles: float, schedule: str) -> np.ndarray:
    co = assemble(source(DMA_THEN_READ.format(delay=delay(cycles)), lds=512))
    t_in = torch.from_numpy(X.view(np.int32).copy())
    t_out = torch.full((1024,), -1, dtype=torch.int32)
    t_aux = torch.zeros(64, dtype=torch.int32)
    kernarg = struct.pack("<QQQ", t_in.data_ptr(), t_out.data_ptr(), t_aux.data_ptr())
    emu.load(co).kernel("k").launch(grid=(1, 1, 1), block=(128, 1, 1), kernarg=kernarg,
                                    buffers=[t_in, t_out, t_aux], strict=False, schedule=schedule)
    return t_out.numpy().view(np.float32)[:64].copy()


def test_lds_dma_lands_after_its_latency_not_before_a_barrier_free_reader():
    latency = dma_latency_cycles()
    assert latency > 500                               # the premise: hundreds of cycles
    old, new = X[256:320], X[:64]
    np.testing.assert_array_equal(read_by_wave_1(latency / 2, "timed"), old)
    np.testing.assert_array_equal(read_by_wave_1(2 * latency, "timed"), new)
    np.testing.assert_array_equal(read_by_wave_1(latency / 2, "lockstep"), new)


def _mla():
    return cases_mla.mla_decode_fp8([64, 130])


def _launch(case, trace=None):
    emu.load(case.path).kernel(case.symbol).launch(grid=case.grid, block=case.block, kernarg=case.kernarg,
                                                   buffers=case.buffers, strict=False, schedule="timed",
                                                   trace=trace)


class Streams:
    """The launch's trace hook: per wave, the instructions it executed (indices into the
    program) and the active lanes of each of its memory instructions."""

    def attach(self, ex):
        self.ex = ex
        self.streams = [[] for _ in range(ex.waves.count)]
        self.lanes = [[] for _ in range(ex.waves.count)]

    def __call__(self, inst, w):
        ex = self.ex
        memory = stats.classify(inst) in ("vmem", "lds_dma", "ds")
        for wave in ex.wave_ids(w).tolist():
            self.streams[wave].append(ex.program.by_pc[inst.pc])
            if memory:
                self.lanes[wave].append(int(np.unpackbits(ex.waves.sgpr[wave, 126:128].view(np.uint8)).sum()))

    def replay_matches(self, program):
        """simulate_cu over each workgroup's streams gives what the live CU got."""
        cus, slots = self.ex.schedule.cus, self.ex.waves.slot
        for slot, cu in enumerate(cus):
            waves = np.flatnonzero(slots == slot)
            streams = [model.WaveStream(np.array(self.streams[wave]), np.array(self.lanes[wave]), slot, n)
                       for n, wave in enumerate(waves)]
            got = model.simulate_cu(streams, program.insts, waves_per_group=len(waves), groups_resident=1,
                                    active_cus=min(params.NUM_CUS, len(cus)))
            assert got.group_done == [cu.group_done[slot]], slot
            assert (got.mfma_busy, got.issued) == (cu.mfma_busy, cu.issued), slot


def test_same_launch_same_bits():
    """The MLA decode's LDS race (F2) makes its output depend on the order: two runs under
    the timed schedule give the same bits, and the right answer."""
    outputs = []
    for _ in range(2):
        case = _mla()
        _launch(case)
        case.check()
        outputs.append([b.clone() for b in case.buffers])
    for a, b in zip(*outputs):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("make", [
    lambda: cases.paged_attention([1, 77], Hk=1, gqa=16),
    lambda: cases.fmha_fwd_group([5, 250], [9, 250], 2, 1, causal=True),
], ids=["pa_bf16_gqa16_ctx1_77", "fmha_causal_group_5_250"])
def test_corpus_code_is_right_under_the_timed_schedule(make):
    """Both objects are strict-clean (every register read after its s_waitcnt), so the
    replay's load scoreboard, which the live CU leaves out, holds no wave back."""
    case = make()
    streams = Streams()
    _launch(case, streams)
    case.check()
    streams.replay_matches(emu.load(case.path).kernel(case.symbol).program)
