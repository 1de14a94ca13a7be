"""gfxasm.perf.grid: workgroup classes of a grid, and the dispatch simulation of them.

The dispatch tests use stand-in class times whose makespans follow by hand from the rules
(grid.py's docstring); the class tests use a microkernel whose workgroups' work depends on
their id in a way the test sets, so the boundaries are known by construction.
"""
from __future__ import annotations

import struct

import pytest
import torch

from gfxasm import emu, perf
from gfxasm.perf import grid as G
from gfxasm.perf import params as P
from gfxasm.perf.estimator import representative_workgroups
from gfxasm.perf.trace import record

from . import microkernels as mk

ITERS_LONG, ITERS_SHORT = 16, 4
STRIDE = ITERS_LONG * 1024


def tiered_read(a: int, b: int) -> bytes:
    """1-wave workgroups reading 1 KiB per iteration (one 16-byte load per lane, waited for):
    workgroup x < a runs ITERS_LONG iterations, a <= x < b ITERS_SHORT, x >= b exits at once."""
    body = f"""
  s_load_dwordx2 s[4:5], s[0:1], 0x0
  v_and_b32 v0, 0x3ff, v0
  v_lshlrev_b32 v1, 4, v0
  s_mul_i32 s8, s2, {STRIDE}
  v_add_u32 v1, s8, v1
  s_mov_b32 s10, {ITERS_SHORT}
  s_cmp_lt_u32 s2, {b}
  s_cselect_b32 s9, s10, 0
  s_mov_b32 s10, {ITERS_LONG}
  s_cmp_lt_u32 s2, {a}
  s_cselect_b32 s9, s10, s9
  s_waitcnt lgkmcnt(0)
  s_cmp_eq_u32 s9, 0
  s_cbranch_scc1 L_end
L_loop:
  global_load_dwordx4 v[4:7], v1, s[4:5]
  s_waitcnt vmcnt(0)
  v_add_u32 v1, 0x400, v1
  s_sub_u32 s9, s9, 1
  s_cmp_lg_u32 s9, 0
  s_cbranch_scc1 L_loop
L_end:"""
    return mk.assemble("tiered_read", body, threads=64)


def launch(a: int, b: int, groups: int) -> dict:
    src = torch.empty(groups * STRIDE, dtype=torch.uint8)
    return dict(co=tiered_read(a, b), grid=(groups, 1, 1), block=(64, 1, 1),
                kernarg=struct.pack("<QQ", src.data_ptr(), 0), buffers=[src])


def one_class(total: int, sampled: int = 1) -> G.GridClasses:
    return G.GridClasses([G.WorkgroupClass(100, [], total, sampled)], [(0, total, 0)], 100 * sampled, 0, 0)


class Table:
    """Stand-in class times: seconds(class, k, active) from a formula; remembers the calls."""

    def __init__(self, formula):
        self.formula, self.calls = formula, set()

    def __call__(self, c, k, active):
        self.calls.add((c, k, active))
        return self.formula(c, k, active)


# ------------------------------------------------------------------ dispatch

def test_full_rounds_of_one_class_cost_rounds_times_a_round():
    t = Table(lambda c, k, a: 1.0 + k)
    assert G.makespan(one_class(3 * 256 * 2), t, 3 * 256 * 2, 2, 256) == 9.0
    assert t.calls == {(0, 2, 256)}


def test_a_tail_round_runs_on_the_cus_it_occupies():
    # 258 workgroups, one per CU: a full round, then 2 workgroups alone on 2 CUs
    t = Table(lambda c, k, a: 0.5 + a / 512)
    assert G.makespan(one_class(258), t, 258, 1, 256) == 1.0 + (0.5 + 2 / 512)
    # 300 workgroups, two per CU: CUs 0-43 hold 2, the others 1 (round-robin over the CUs).
    # Pass 1 at 256 CUs: k=1 ends at 0.5 + 1/4, k=2 at 1 + 1/4 ... busy CUs over [0, 1.25):
    # 256 until 0.75, then 44: mean (256 x 0.75 + 44 x 0.5) / 1.25 = 171.2 -> 171
    t = Table(lambda c, k, a: 0.5 * k + a / 1024)
    assert G.makespan(one_class(300), t, 300, 2, 256) == 1.0 + 171 / 1024
    assert (0, 2, 171) in t.calls


def test_early_exit_workgroups_cost_only_their_own_time():
    # 300 working workgroups then 300 that exit after 0.001: the tail's 44 CUs run beside
    # the exits' short lives (300 x 0.001 CU-seconds over its 1 s: mean 44.3 -> 44)
    classes = G.GridClasses([G.WorkgroupClass(100, [], 300, 1), G.WorkgroupClass(1, [], 300)],
                            [(0, 300, 0), (300, 600, 1)], 100, 0, 0)
    t = Table(lambda c, k, a: 0.001 if c else 0.5 + a / 512)
    padded = G.makespan(classes, t, 600, 1, 256)
    assert padded == 1.0 + (0.5 + 44 / 512)
    assert padded == G.makespan(one_class(300), Table(t.formula), 300, 1, 256)


def test_whole_grid_counts_scale_the_sampled_classes():
    # a sample of one class stands for that class's workgroups (the exits are left out) ...
    assert one_class(1000, sampled=4).scale() == 250
    exits = G.WorkgroupClass(2, [], 700)
    assert G.GridClasses([G.WorkgroupClass(100, [], 300, 1), exits], [(0, 300, 0), (300, 1000, 1)],
                         100, 0, 0).scale() == 300
    # ... a sample of two classes by their executed instructions
    mixed = G.GridClasses([G.WorkgroupClass(100, [], 30, 1), G.WorkgroupClass(2, [], 70, 1)],
                          [(0, 30, 0), (30, 100, 1)], 102, 0, 0)
    assert mixed.scale() == (30 * 100 + 70 * 2) / 102
    assert not mixed.sample_uniform and one_class(5).sample_uniform
    assert [mixed.class_of(n) for n in (0, 29, 30, 99)] == [0, 0, 1, 1]


# ------------------------------------------------------------------ classes

@pytest.mark.parametrize("a, b, total", [(1, 257, 1000), (300, 301, 1000), (700, 1000, 1000), (513, 513, 777),
                                         (0, 5, 2)])
def test_probes_find_the_class_boundaries(a, b, total):
    kw = launch(a, b, total)
    k = emu.load(kw["co"]).kernel()
    grid = kw["grid"]
    chosen = representative_workgroups(grid, 1, 1)
    tr = record(k, grid, kw["block"], kw["kernarg"], kw["buffers"], chosen)
    gc = G.find_classes(k, grid, kw["block"], kw["kernarg"], kw["buffers"], tr, [0])
    b = min(b, total)
    expect = [(lo, hi) for lo, hi in ((0, a), (a, b), (b, total)) if hi > lo]
    assert [(lo, hi) for lo, hi, _ in gc.segments] == expect
    work = [gc.classes[c].instructions for _, _, c in gc.segments]
    assert work == sorted(work, reverse=True) and len(set(work)) == len(work)
    assert sum(c.workgroups for c in gc.classes) == total
    assert gc.probed < total / 4 or total < 16


def test_a_padded_grid_costs_what_its_used_workgroups_do():
    used, padded = 300, 1000
    e_used = perf.estimate(**launch(used, used, used), workgroups_per_cu=1)
    e_pad = perf.estimate(**launch(used, used, padded), workgroups_per_cu=1)
    assert [c["workgroups"] for c in e_pad.workgroup_classes] == [used, padded - used]
    assert e_pad.dram_bytes == pytest.approx(e_used.dram_bytes, rel=0.01)
    # the 700 exits, 3 per CU after the last working round, add well under a microsecond
    assert e_used.seconds <= e_pad.seconds <= e_used.seconds + 1e-6
    # the sample scaling charged them as 2 more rounds of reads; the tail (44 CUs) beats a
    # full round: more HBM share per CU
    assert e_pad.rounds == 4 and e_used.rounds == 2
    full_round = e_used.cycles_per_round / e_used.clock_hz
    assert full_round < e_used.seconds - e_used.launch_overhead_s < 2 * full_round


def test_uniform_full_rounds_keep_the_sample_scaling_bit_for_bit(monkeypatch):
    def no_dispatch(*args):
        raise AssertionError("dispatch simulated")
    monkeypatch.setattr(G, "makespan", no_dispatch)
    e = perf.estimate(**launch(768, 768, 768), workgroups_per_cu=1)
    assert e.rounds == 3 and [c["workgroups"] for c in e.workgroup_classes] == [768]
    assert e.seconds == e.rounds * e.cycles_per_round / e.clock_hz + e.launch_overhead_s
    with pytest.raises(AssertionError, match="dispatch simulated"):      # a tail round is simulated
        perf.estimate(**launch(769, 769, 769), workgroups_per_cu=1)


@pytest.mark.full
def test_aiter_fmoe_padded_grid_boundary_is_num_valid_ids():
    # aiter's fused-MoE stage 1 as launched (moe_sorting's largest block count): the
    # workgroups of blocks past num_valid_ids / tile_M exit; the probes must find exactly
    # that boundary, and the grid must cost what its used blocks do (+ the exits' time)
    from gfxasm.perf import aiter_fmoe
    cfg = aiter_fmoe.configs()["_ZN5aiter54fmoe_stage1_bf16_pertokenFp8_doweight_g1u1_128x128_pf3E"]
    shape = (16, 4096, 384, 128, 8)
    ids, weights = aiter_fmoe.routing(16, 128, 8)
    used_blocks = int(aiter_fmoe.moe_sorting(ids, weights, 128, cfg.tile_m)[3][0]) // cfg.tile_m
    kw = aiter_fmoe.launch(cfg, *shape)
    gx, blocks, _ = kw["grid"]
    whole = perf.estimate(**kw)
    used = perf.estimate(**aiter_fmoe.launch(cfg, *shape, used_blocks_only=True))
    assert [c["workgroups"] for c in whole.workgroup_classes] == [gx * used_blocks, gx * (blocks - used_blocks)]
    assert whole.seconds == pytest.approx(used.seconds, abs=1e-6)
    assert whole.dram_bytes == pytest.approx(used.dram_bytes, rel=0.01)


def test_skip_mfma_reaches_every_timing_run(monkeypatch):
    # estimate(skip_mfma=False) runs the sample and the class search's probes with the MFMAs
    # computed (a kernel branching on their results, FP8 prefill's post-hoc lazy test, must
    # not see stale registers in the probes); the choice is part of the trace cache's key
    from gfxasm.perf import estimator
    seen = []

    def recording(real):
        def wrapped(*args, skip_mfma=True, **kwargs):
            seen.append(skip_mfma)
            return real(*args, skip_mfma=skip_mfma, **kwargs)
        return wrapped
    monkeypatch.setattr(estimator, "record", recording(estimator.record))
    monkeypatch.setattr(G, "record", recording(G.record))
    monkeypatch.setattr(estimator, "_TRACES", {})       # (an earlier test's trace of these arguments would serve)
    kw = launch(300, 300, 1000)
    perf.estimate(**kw, workgroups_per_cu=1, skip_mfma=False)
    assert len(seen) >= 2 and not any(seen)                  # the sample and at least one probe
    seen.clear()
    perf.estimate(**kw, workgroups_per_cu=1)                   # not the cached trace of the other choice
    assert seen and all(seen)
