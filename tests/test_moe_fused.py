"""The MoE layer's decode form in one launch (issue 25 item 2; asm/mxfp8_moe_gemm.s FUSED,
kernels.yaml mxfp8_moe_gemm_fused_direct) and the hook it needs.

The hook: a kernels.yaml kernel that declares `schedule: concurrent` (its workgroups wait on
each other through global memory) is launched by the op path (manifest ->
launcher.PreparedLaunch -> backends.emu) under the emulator's concurrent schedule; every other
kernel keeps the serial one. Checked end to end on the grid_flag fixture
(tests/fixtures/grid_flag.s): declared concurrent, its consumers see the producer's release;
declared serial (the default), the same launch is reported as a deadlock.

The kernel: on fresh random operands (NON-uniform scales), outputs and intermediates poisoned,
its q, scale and out equal the two-launch decode form's (swiglu_direct, then direct_sum_n32:
itself checked against a float64 MoE and the sorted form in tests/test_moe.py) bit for bit,
under the concurrent schedule's fixed (round-robin) order and a seeded one: one and several
column tiles per role (the magic divisions' 0 and non-0 paths; the sum role's 32-column
tiles, whose strips 2 and 3 read nothing, next to each other), a tail K step, top_k 1
to 16, an expert map with absent experts and ids out of range; and the layer's call through
the one launch against the float64 MoE's bound."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import gfxasm
from gfxasm.emu.concurrent import DeadlockError
from gfxasm.manifest import Manifest, ManifestError, default_manifest
from gfxasm.ops import moe_layer, mxfp8_moe_gemm

from conftest import FIXTURES
sys.path.insert(0, str(Path(__file__).parent / "emu"))                 # test_concurrent's own imports
from test_concurrent import launch_direct  # noqa: E402  (a manifest variant under Kernel.launch's own arguments)
from test_races import race_manifest  # noqa: E402,F401  (tests/fixtures/races.yaml, built)
from test_moe import built, check_layer, embedded, layer_operands, routing  # noqa: E402,F401  (built: the kernels)

GROUPS, PRODUCER = 5, 3


def grid_flag_manifest(tmp_path, race_manifest, schedule: str | None) -> Manifest:
    """A manifest holding grid_flag (MODE 0) with `schedule` (None: the field left out),
    built objects taken from the race fixtures' build directory."""
    line = "" if schedule is None else f"    schedule: {schedule}\n"
    path = tmp_path / "flag.yaml"
    path.write_text(
        f"build_dir: {race_manifest.build_dir}\n"
        "kernels:\n"
        "  grid_flag:\n"
        f"    source: {FIXTURES / 'grid_flag.s'}\n"
        "    workgroup: [64]\n"
        "    grid: [groups]\n"
        f"{line}"
        "    args:\n"
        "      - {name: x, type: '*f32', dir: in, rank: 1}\n"
        "      - {name: data, type: '*f32', dir: inout, rank: 1}\n"
        "      - {name: out, type: '*f32', dir: out, rank: 1}\n"
        "      - {name: flag, type: '*u32', dir: inout, rank: 1}\n"
        "      - {name: producer, type: u32}\n"
        "      - {name: groups, type: u32}\n"
        "    variants:\n"
        "      grid_flag: {defines: {MODE: 0}}\n")
    return Manifest.load(path)


def flag_args(gen: torch.Generator) -> dict:
    return dict(x=torch.randn(GROUPS * 64, generator=gen), data=torch.full((64,), float("nan")),
                out=torch.full((GROUPS * 64,), float("nan")), flag=torch.zeros(1, dtype=torch.uint32),
                producer=PRODUCER, groups=GROUPS)


def test_a_kernel_declared_concurrent_runs_under_the_concurrent_schedule(tmp_path, race_manifest, gen):
    kernel = grid_flag_manifest(tmp_path, race_manifest, "concurrent").kernel("grid_flag")
    assert kernel.schedule == "concurrent"
    args = flag_args(gen)
    result = gfxasm.launch(kernel, **args)
    x = args["x"].view(GROUPS, -1)
    assert torch.equal(args["data"], 2 * x[PRODUCER])
    assert torch.equal(args["out"].view(GROUPS, -1), 2 * x[PRODUCER] + x)
    assert result.timeline is not None                  # the concurrent schedule's record of the waits


def test_a_kernel_declared_serial_keeps_the_serial_schedule(tmp_path, race_manifest, gen):
    kernel = grid_flag_manifest(tmp_path, race_manifest, None).kernel("grid_flag")
    assert kernel.schedule == "serial"
    with pytest.raises(DeadlockError, match="concurrent"):
        gfxasm.launch(kernel, **flag_args(gen))


def test_an_unknown_schedule_is_refused_by_name(tmp_path, race_manifest):
    with pytest.raises(ManifestError, match="schedule.*serial, concurrent"):
        grid_flag_manifest(tmp_path, race_manifest, "eager")


ALPHA, BETA, LIMIT = 1.702, 1.0, 7.0

FUSED_CASES = [  # (T, top_k, E, H, I, expert map, seed of the order (None: round-robin))
    (2, 3, 16, 32, 64, False, None),     # 2 gate tiles (K 32: only a tail step), 1 column tile (down magic 0)
    (1, 1, 8, 64, 32, False, 3),         # one gate tile (up magic 0), one slot, 2 column tiles
    (3, 5, 16, 160, 64, True, 1),        # 2 gate tiles (K 160: a tail step), 5 column tiles,
                                         # absent experts, ids out of range
    (2, 16, 32, 96, 64, False, 2),       # top_k 16: every row of the sum's tile; 3 column tiles
]


def decode_operands(T, top_k, E, H, I, with_map: bool):
    """Random layer operands; with_map: E global ids, half of them absent (-1), ids out of
    range in the first and a later slot."""
    gen = torch.Generator().manual_seed(1000 * T + 10 * top_k + E + H + I)
    E_local = E // 2 if with_map else E
    x, xs, w1, w1s, w2, w2s = layer_operands(T, H, I, E_local, gen)
    ids = routing("random", T, top_k, E, gen).to(torch.int32)
    expert_map = None
    if with_map:
        expert_map = torch.full((E,), -1, dtype=torch.int32)
        expert_map[torch.randperm(E, generator=gen)[:E_local]] = torch.randperm(E_local, generator=gen).to(torch.int32)
        ids[0, 0], ids[-1, -1] = -1, E
    tw = torch.rand(T, top_k, generator=gen) + 0.1
    return dict(x=x, xs=xs, w1=w1, w1s=w1s, w2=w2, w2s=w2s, tw=tw, ids=ids, expert_map=expert_map)


def poisoned(T, top_k, H, I):
    """q, scale and out filled with NaN bytes (0x7f e4m3 is NaN, 0xff E8M0 is NaN), in
    poisoned buffers (the bytes around them must stay)."""
    S = T * top_k
    made = [embedded(torch.empty(shape, dtype=dtype), fill)
            for shape, dtype, fill in (((S, I), torch.float8_e4m3fn, 0x7F), ((S, I // 32), torch.float8_e8m0fnu, 0xFF),
                                       ((T, H), torch.bfloat16, 0xFF))]
    return [v for v, _ in made], [b for _, b in made]


def two_launches(o, q, scale, out, E):
    """The decode form's two launches (the down step at the one launch's 32 columns)."""
    for kernel, variant, args in (
            mxfp8_moe_gemm.direct_swiglu_launch_args(o["x"], o["xs"], o["w1"], o["w1s"], o["ids"], o["expert_map"], E,
                                                     q, scale, ALPHA, BETA, LIMIT),
            mxfp8_moe_gemm.direct_sum_launch_args(q, scale, o["w2"], o["w2s"], o["ids"], o["expert_map"], E, o["tw"],
                                                  out, nt=moe_layer.FUSED_NT)):
        gfxasm.launch(kernel, variant, **args)


def one_launch(o, q, scale, out, E, seed, counter_at_launch=None):
    """The one launch under the concurrent schedule; the counter at 0 unless given."""
    flag = torch.zeros(1, dtype=torch.uint32)
    kernel, variant, args = moe_layer.fused_launch_args(o["x"], o["xs"], o["w1"], o["w1s"], o["w2"], o["w2s"],
                                                        o["tw"], o["ids"], o["expert_map"], E, q, scale, flag, out,
                                                        ALPHA, BETA, LIMIT)
    chosen = default_manifest().kernel(kernel).variant(variant)
    if counter_at_launch is not None:
        flag[0] = counter_at_launch(args["producers"])
    result = launch_direct(chosen, args, schedule="concurrent", seed=seed)
    assert int(flag[0]) == args["producers"]               # every producer released once, skipped ones too
    return result


@pytest.mark.parametrize("T,top_k,E,H,I,with_map,seed", FUSED_CASES)
def test_one_launch_equals_the_two_launches(built, T, top_k, E, H, I, with_map, seed):
    o = decode_operands(T, top_k, E, H, I, with_map)
    (q2, s2, out2), bases2 = poisoned(T, top_k, H, I)
    two_launches(o, q2, s2, out2, E)
    (q1, s1, out1), bases1 = poisoned(T, top_k, H, I)
    result = one_launch(o, q1, s1, out1, E, seed)
    assert out1.isfinite().all()
    for a, b in ((q1, q2), (s1, s2), (out1, out2)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))   # skipped slots: poison in both
    for a, b in zip(bases1, bases2):
        assert torch.equal(a, b)                                         # nothing written around them
    waited = [g for g, line in result.timeline.groups.items() if line.waits]
    assert waited and min(waited) >= T * top_k * (I // 32)              # only the sum role waits


def test_a_counter_not_zeroed_at_launch_is_reported_as_a_race(built):
    """The down workgroups trust the counter: one that already reads the producer count at
    launch lets them read q while the producers write it, which strict mode reports (the
    acquire then orders nothing: no release wrote the value it read)."""
    from gfxasm.emu import HazardError
    o = decode_operands(2, 3, 16, 64, 64, False)
    (q, scale, out), _ = poisoned(2, 3, 64, 64)
    with pytest.raises(HazardError, match="cross-workgroup race") as raised:
        one_launch(o, q, scale, out, 16, None, counter_at_launch=lambda producers: producers)
    assert "of buffers[7] is read" in str(raised.value)                 # q: the 8th pointer argument


def test_the_layer_takes_one_launch_at_decode_sizes(built):
    """gfxasm.mxfp8_moe at T <= FUSED_MAX_TOKENS runs the one launch (a kernel declared
    concurrent) and meets the float64 MoE's bound; the two-launch form is kept above."""
    T = moe_layer.FUSED_MAX_TOKENS
    assert moe_layer.choose_form(T, 5, None) == "fused"
    assert moe_layer.choose_form(T + 1, 5, None) == ("direct" if T < moe_layer.DIRECT_MAX_TOKENS else "sorted")
    assert default_manifest().kernel(moe_layer.FUSED_KERNEL).schedule == "concurrent"
    E, gen = 16, torch.Generator().manual_seed(11)
    expert_map = torch.full((E,), -1, dtype=torch.int32)
    expert_map[torch.randperm(E, generator=gen)[:8]] = torch.randperm(8, generator=gen).to(torch.int32)
    check_layer(T, 4, E, 96, 64, None, "random", expert_map=expert_map, E_local=8, seed=5)


def test_workgroup_ids_too_large_for_the_magic_division_are_refused():
    moe_layer.check_id_division(2**16, 2**16)                           # ids up to 2^16 - 1: below 2^32
    with pytest.raises(ValueError, match="2\\^32"):
        moe_layer.check_id_division(2**16, 2**16 + 1)


@pytest.mark.parametrize("probe", [1, 2])
def test_the_phase_probes_stop_the_sum_role_where_they_say(built, probe):
    """bench/moe.py --one-launch times the phases on two objects assembled aside with
    FUSED_PROBE (asm/mxfp8_moe_gemm.s header): under the concurrent schedule the producers'
    q and scale are the two launches' in both, the sum role writes nothing, and it waits for
    the producers with probe 1 (ends at its acquire) and not at all with probe 2 (ends where
    it would poll). The shipped object is not touched (the probes build elsewhere)."""
    from bench.moe import probe_variant
    T, top_k, E, H, I = 2, 3, 16, 64, 64
    o = decode_operands(T, top_k, E, H, I, False)
    (q2, s2, out2), _ = poisoned(T, top_k, H, I)
    two_launches(o, q2, s2, out2, E)
    (q1, s1, out1), bases = poisoned(T, top_k, H, I)
    poison = [b.clone() for b in bases]
    flag = torch.zeros(1, dtype=torch.uint32)
    kernel, variant, args = moe_layer.fused_launch_args(o["x"], o["xs"], o["w1"], o["w1s"], o["w2"], o["w2s"],
                                                        o["tw"], o["ids"], None, E, q1, s1, flag, out1,
                                                        ALPHA, BETA, LIMIT)
    shipped = default_manifest().kernel(kernel).variant(variant)
    probed = probe_variant(str(shipped.co_path), probe)
    assert probed.co_path != shipped.co_path and probed.defines["FUSED_PROBE"] == probe
    result = launch_direct(probed, args, schedule="concurrent")
    assert int(flag[0]) == args["producers"]
    for a, b in ((q1, q2), (s1, s2)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert torch.equal(bases[2], poison[2])                              # out: not a byte written
    waited = sorted(g for g, line in result.timeline.groups.items() if line.waits)
    producers = args["producers"]
    assert waited == (list(range(producers, producers + args["down_tiles"] * T)) if probe == 1 else [])
