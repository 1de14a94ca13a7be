"""The calibration data set and the launch of aiter's f4gemm objects it rests on."""
from __future__ import annotations

import random
import struct
from collections import Counter

import pytest
import torch

from bench import calib_data
from gfxasm import emu
from gfxasm.perf import aiter_f4gemm as F


def _metadata_offsets(cfg: F.F4Config) -> dict[str, int]:
    from gfxasm import corpus
    info = emu.load(str(corpus.path(cfg.co))).kernel(cfg.symbol).info
    assert info.metadata[".kernarg_segment_size"] == F.KERNARG_BYTES
    return {a[".name"]: a[".offset"] for a in info.metadata[".args"] if a[".name"] != "pad"}


@pytest.mark.parametrize("tile", ["32x128", "256x256"])
def test_f4gemm_kernarg_lands_where_the_code_object_metadata_says(tile):
    cfg = next(c for c in F.configs().values() if c.co.endswith(f"_BpreShuffle_{tile}.co"))
    off = _metadata_offsets(cfg)
    rng = random.Random(7)
    M, N, K = rng.randrange(1, 5000), rng.randrange(1, 300) * 32, rng.randrange(1, 300) * 32
    t = [torch.empty(n + 1, 8, dtype=torch.uint8) for n in range(5)]    # distinct addresses
    raw = F.kernarg(t[0], t[1], t[2], t[3], t[4], M, N, K, alpha=0.75, beta=-2.5, log2_k_split=3)
    assert len(raw) == F.KERNARG_BYTES
    q = lambda name: struct.unpack_from("<Q", raw, off[name])[0]        # noqa: E731
    u = lambda name: struct.unpack_from("<I", raw, off[name])[0]        # noqa: E731
    f = lambda name: struct.unpack_from("<f", raw, off[name])[0]        # noqa: E731
    assert (q("D"), q("A"), q("B"), q("ScaleA"), q("ScaleB")) == tuple(x.data_ptr() for x in t)
    assert q("C") == 0                                                   # no bias
    assert (f("alpha"), f("beta")) == (0.75, -2.5)
    assert (u("Mdim"), u("Ndim"), u("Kdim")) == (M, N, K)
    # gemm_a4w4_asm: stride_C0 = out.stride(0); A/B row strides in FP4 elements; scales in bytes
    assert (u("strideC0"), u("strideA0"), u("strideB0")) == (8, 16, 16)
    assert (u("strideScaleA0"), u("strideScaleB0")) == (8, 8)
    assert u("log2_k_split") == 3


def test_f4gemm_grid_follows_the_host_rule():
    cfgs = F.configs()
    plain = next(c for c in cfgs.values() if c.tile_m == 96 and c.tile_n == 256)
    split = next(c for c in cfgs.values() if c.split_k and c.tile_m == 256)
    assert F.grid(plain, 1000, 2560, 8192) == (10, 11, 1)
    # split-K: k_per_tg = K / 2^s rounded up to 256 -> ceil(K / k_per_tg) slices
    assert F.grid(split, 512, 512, 8192, 2) == (2, 2, 4)
    assert F.grid(split, 512, 512, 32000, 3) == (2, 2, 8)      # 4000 -> 4096 per slice
    with pytest.raises(ValueError, match="log2_k_split"):
        F.grid(plain, 64, 256, 1024, 1)
    with pytest.raises(ValueError, match="K"):
        F.kernarg(*[torch.empty(1)] * 5, 1, 32, 48)


def test_data_set_is_rebuilt_from_the_corpus_with_a_stratified_split():
    committed = calib_data.load()
    assert calib_data.build() == committed
    gemms = [p for p in committed if p["family"] != "fmoe"]
    strata = Counter((p["kernel"], p["regime"]) for p in gemms)
    fit = Counter((p["kernel"], p["regime"]) for p in gemms if p["split"] == "fit")
    for key, n in strata.items():
        assert fit[key] == n // 2, key                  # at most half, both sides when n >= 2
    assert sum(fit.values()) <= len(committed) / 2
    # fused MoE: split by shape (twins on one side), at most half of the rows fitted on
    fmoe = [p for p in committed if p["family"] == "fmoe"]
    side = {}
    for p in fmoe:
        assert side.setdefault(tuple(p[k] for k in calib_data.FMOE_SHAPE), p["split"]) == p["split"]
    assert 0 < sum(p["split"] == "fit" for p in fmoe) <= len(fmoe) // 2
    for p in committed:
        M = p.get("M")
        if M is not None:
            assert p["regime"] == ("M<=64" if M <= 64 else "64<M<=1024" if M <= 1024 else "M>1024")
    assert {p["family"] for p in committed} == {"f4gemm", "bf16gemm", "fmha", "fmoe"}


def test_fit_returns_the_best_point_it_evaluated_and_set_parses_fields():
    import dataclasses
    import math

    from bench import calibrate
    from gfxasm.perf import params as P

    rng = random.Random(3)
    target = rng.uniform(20000.0, 60000.0)
    point = {"id": 0, "family": "f4gemm", "regime": "M<=64", "measured_us": 10.0}

    class Pool:                                   # a loss with its minimum at `target`; it holds
        def run(self, changes, ids=None):         # a second point the fit is not given
            out = {n: {"modelled_us": 10.0 * (1.0 + abs(math.log(changes["vmem_inflight_bytes"] / target)))}
                   for n in (0, 1)}
            return {n: r for n, r in out.items() if ids is None or n in ids}

    def stopped_early(loss, x0, method, bounds, options):
        # as Nelder-Mead cut off by maxfev may: evaluates the initial simplex and a few
        # points, then answers with a vertex that is not the best it saw
        tried = [list(v) for v in options["initial_simplex"]] + [[x0[0] + d] for d in (-0.7, 0.4, 0.9)]
        for x in tried:
            loss(x)
        return max(tried, key=loss)

    start = dataclasses.replace(P.DEFAULT, vmem_inflight_bytes=36864.0)
    seen = []
    pool = Pool()
    run = pool.run
    asked = []
    pool.run = lambda ch, ids=None: seen.append(ch["vmem_inflight_bytes"]) or asked.append(set(ids)) or run(ch, ids)
    got = calibrate.fit(pool, [point], start, 3, ("vmem_inflight_bytes",), minimize=stopped_early)
    got = got["vmem_inflight_bytes"]
    assert len(set(seen)) >= 4
    assert all(a == {0} for a in asked)                                # only the points it fits on
    assert got == min(seen, key=lambda v: abs(math.log(v / target)))     # never a worse vertex
    with pytest.raises(ValueError, match="unset"):
        calibrate.fit(Pool(), [point], dataclasses.replace(P.DEFAULT, vmem_inflight_bytes=None), 3,
                      ("vmem_inflight_bytes",))
    assert P.overrides(["vmem_inflight_bytes=32768", "dram_queue=md1", "lds_conflicts=none", "valu_cycles=8"]) == {
        "vmem_inflight_bytes": 32768.0, "dram_queue": "md1", "lds_conflicts": None, "valu_cycles": 8}
    with pytest.raises(ValueError, match="NAME=VALUE"):
        P.overrides(["no_such_field=1"])


def test_shape_split_keeps_every_gemm_shape_on_one_side():
    points = calib_data.load()
    before = {p["id"]: p["split"] for p in points if p["family"] in ("fmha", "fmoe")}
    calib_data.shape_split(points)
    gemms = [p for p in points if p["family"] in ("f4gemm", "bf16gemm")]
    side = {}
    for p in gemms:                                     # no (kernel, N, K) on both sides
        assert side.setdefault((p["kernel"], p["N"], p["K"]), p["split"]) == p["split"]
    per_kernel = Counter(p["kernel"] for p in gemms)
    fit = Counter(p["kernel"] for p in gemms if p["split"] == "fit")
    for kernel, n in per_kernel.items():
        assert fit[kernel] <= n // 2, kernel            # at most half of a kernel's rows fitted on
        assert fit[kernel] < n, kernel                   # every kernel has held-out rows
    assert sum(fit.values()) > len(gemms) / 3           # the packing leaves most of the half to the fit
    assert {p["id"]: p["split"] for p in points if p["family"] in ("fmha", "fmoe")} == before


def test_sweep_reports_each_split_on_its_held_out_points_only():
    import statistics

    from bench import calib_sweep
    rng = random.Random(5)
    points = []
    for n in range(40):
        points.append({"id": n, "family": "f4gemm", "kernel": rng.choice(["f4gemm_32x128", "f4gemm_128x512"]),
                       "regime": rng.choice(["M<=64", "M>1024"]), "measured_us": rng.uniform(2.0, 300.0),
                       "split_row": rng.choice(["fit", "held"]), "split_shape": rng.choice(["fit", "held"])})
    modelled = {p["id"]: p["measured_us"] * rng.uniform(0.7, 1.4) for p in points}
    for split in ("row", "shape"):
        got = calib_sweep.held_out(points, modelled, split)
        for name, member in (("GEMM", lambda p: True), ("GEMM M<=64", lambda p: p["regime"] == "M<=64"),
                             ("f4gemm 32x128", lambda p: p["kernel"] == "f4gemm_32x128"),
                             ("f4gemm wide (N tile >= 2 M tile, >= 384)", lambda p: p["kernel"] == "f4gemm_128x512")):
            errs = [modelled[p["id"]] / p["measured_us"] - 1 for p in points
                    if p[f"split_{split}"] == "held" and member(p)]
            assert got[name]["n"] == len(errs)
            assert got[name]["signed_median"] == statistics.median(errs)
            assert got[name]["median"] == statistics.median(abs(e) for e in errs)
            assert got[name]["p90"] in [abs(e) for e in errs] and got[name]["p90"] >= got[name]["median"]
        short = any(p[f"split_{split}"] == "held" and p["measured_us"] < 8 for p in points)
        assert "fmha" not in got and ("GEMM under 8 us" in got) == short      # empty groups left out


def test_sweep_fits_a_step_on_its_split_and_families_only(monkeypatch):
    from bench import calib_sweep, calibrate
    rng = random.Random(7)
    points = [{"id": n, "family": fam, "kernel": "f4gemm_32x128", "regime": "M<=64",
               "measured_us": rng.uniform(2.0, 50.0), "split_row": rng.choice(["fit", "held"]),
               "split_shape": rng.choice(["fit", "held"])}
              for n, fam in enumerate(["f4gemm", "fmoe", "fmha", "bf16gemm"] * 6)]
    fitted_on = []

    class FakePool:
        def __init__(self, pts, jobs):
            pass

        def run(self, changes, ids=None):
            return {p["id"]: {"modelled_us": p["measured_us"] * (1 + changes.get("power_mfma", 0))} for p in points}

        def close(self):
            pass

    def fake_fit(pool, side, start, maxfev, names):
        fitted_on.append(sorted(p["id"] for p in side))
        return {"power_mfma": 0.25}

    monkeypatch.setattr(calibrate, "Pool", FakePool)
    monkeypatch.setattr(calibrate, "fit", fake_fit)
    plan = {"steps": [{"tag": "all", "fit": "shape", "names": ["power_mfma"]},
                      {"tag": "some", "fit": "row", "families": ["f4gemm", "fmha"], "names": ["power_mfma"]}]}
    done = calib_sweep.run(plan, points, 1)
    assert fitted_on[0] == sorted(p["id"] for p in points if p["split_shape"] == "fit")
    assert fitted_on[1] == sorted(p["id"] for p in points if p["split_row"] == "fit" and
                                  p["family"] in ("f4gemm", "fmha"))
    assert done["some"]["params"] == {"power_mfma": 0.25}
    assert done["some"]["modelled_us"][0] == points[0]["measured_us"] * 1.25
