"""The README's attention and MoE/GEMM figures re-modelled under named parameter sets (issue 25,
item 1: the timing model on the gfx950 ruler, docs/model-ruler.md).

    python3 bench/ruler.py [--jobs N] [--only TEXT] [--set NAME:field=value,...] [--out F]

Each row is one README figure's launch(es), modelled by the same bench code the README
quotes (bench/causal_model.py for attention, bench/moe.py, bench/decode.py,
bench/mxfp8_gemm.py) under every parameter set in one process, so each emulator trace is
recorded once and replayed per set (gfxasm.perf.estimator caches traces). Default sets:
params.CORNERS (optimistic, default, pessimistic). Objects: whatever build/ holds (no build
is run). Figures are modelled, never measured.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gfxasm.perf import params as P                           # noqa: E402

BASE = P.DEFAULT


def _with(changes: dict):
    """Make `changes` of params.DEFAULT the set every estimate without params= uses."""
    P.DEFAULT = dataclasses.replace(BASE, **changes)


def _prefill(kind: str, Hq: int, Hk: int, S: int, causal: bool, B: int = 1):
    def run() -> dict:
        import torch
        from gfxasm.ops import batch_prefill as bp
        from bench import attention_launches as launches
        from bench import causal_model as cm
        launch = {"fp8": lambda: launches.paged(bp.FP8), "fp8 blk": lambda: launches.paged(bp.FP8, block_scales=True),
                  "bf16 paged": lambda: launches.paged(torch.bfloat16), "bf16 dense": lambda: launches.DENSE_BF16}[kind]()
        seconds, detail = cm.modelled_seconds(launch, B, Hq, Hk, S, causal)
        out = dict(seconds=seconds, tflops=launches.flops(B, Hq, S, causal) / seconds / 1e12)
        # the steady-state workgroup: the longest probed (causal) or the sample (non-causal)
        tiles = -(-S // cm.Q_TILE)
        cap = cm.tiles_under_cap(S, cm.PROBE_CAP_KEYS) if causal else None
        wg = None
        if causal:
            t = max(cm.probe_tiles(tiles, cap))
            wg = (tiles - 1 - t, 0, 0)
        e = cm.estimate(launch, B, Hq, Hk, S, S, causal, workgroup=wg, class_search=cap is None)
        out.update(mfma_busy=e.mfma_utilization, valu_busy=e.valu_utilization, clock_ghz=e.clock_hz / 1e9)
        return out
    return run


def _moe(T: int):
    def run() -> dict:
        from bench import moe
        r = moe.row(T)
        return dict(us=r["us"], steps={k: v["us"] for k, v in r["steps"].items()})
    return run


def _decode(index: int):
    def run() -> dict:
        from bench import decode
        r = decode.bench(*decode.CONFIGS[index])
        return dict(us=r["seconds"] * 1e6)
    return run


def _gemm(layer: str, tp: int, M: int):
    def run() -> dict:
        from bench import mxfp8_gemm as g
        N, K = g.layers(tp)[layer]
        s, parts = g.modelled_seconds(g.mx.plan(M, N, K), M, N, K)
        return dict(us=s * 1e6, mfma_busy=max(p["mfma_utilization"] for p in parts))
    return run


ROWS = {
    "prefill fp8 h6/1 128k c": _prefill("fp8", 6, 1, 131072, True),
    "prefill fp8 blk h6/1 128k c": _prefill("fp8 blk", 6, 1, 131072, True),
    "prefill bf16 paged h6/1 128k c": _prefill("bf16 paged", 6, 1, 131072, True),
    "fmha bf16 dense h6/1 128k c": _prefill("bf16 dense", 6, 1, 131072, True),
    "prefill fp8 h6/1 16k c": _prefill("fp8", 6, 1, 16384, True),
    "fmha bf16 dense B4 H64/8 S8192 nc": _prefill("bf16 dense", 64, 8, 8192, False, B=4),
    "decode fp8 scale/shift B128 Hq8/1 8k": _decode(0),
    "decode fp8 descale B128 Hq8/1 8k": _decode(1),
    "decode bf16 B128 Hq8/1 8k": _decode(2),
    "moe T1": _moe(1),
    "moe T16": _moe(16),
    "moe T64": _moe(64),
    "mxfp8 gemm gate_up TP1 M64": _gemm("gate_up", 1, 64),
    "mxfp8 gemm qkv TP1 M16": _gemm("qkv", 1, 16),
    "mxfp8 gemm down TP1 M1": _gemm("down", 1, 1),
}


def one(job) -> dict:
    label, sets = job
    out = {}
    for name, changes in sets.items():
        _with(changes)
        t0 = time.time()
        try:
            out[name] = ROWS[label]()
        except Exception as exc:                       # a row that cannot run says why
            out[name] = dict(error=f"{type(exc).__name__}: {exc}")
        out[name]["wall_s"] = round(time.time() - t0, 1)
    _with({})
    return dict(label=label, sets=out)


def use_disasm_cache(path: str) -> None:
    """Disassemble from a file written by make_disasm_cache (a machine without LLVM)."""
    import hashlib
    import pickle
    from gfxasm.emu import decode
    table = pickle.loads(Path(path).read_bytes())
    decode.disassemble = lambda code: table[hashlib.sha256(code).hexdigest()]


def make_disasm_cache(objects: list[str], path: str) -> None:
    import hashlib
    import pickle
    from gfxasm.disasm import disassemble
    table = {}
    for f in objects:
        code = Path(f).read_bytes()
        table[hashlib.sha256(code).hexdigest()] = disassemble(code)
    Path(path).write_bytes(pickle.dumps(table))


def parse_set(text: str) -> tuple[str, dict]:
    name, _, rest = text.partition(":")
    return name, P.overrides([p for p in rest.split(",") if p])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--only", default="", help="rows whose label contains this text")
    ap.add_argument("--set", action="append", default=[], metavar="NAME:field=value,...")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "ruler.json"))
    ap.add_argument("--disasm-cache", help="disassembly of the objects, from --make-disasm-cache (no LLVM there)")
    ap.add_argument("--make-disasm-cache", nargs="+", metavar="CO", help="write --disasm-cache's file for these objects")
    args = ap.parse_args(argv)
    if args.make_disasm_cache:
        make_disasm_cache(args.make_disasm_cache, args.disasm_cache)
        return 0
    if args.disasm_cache:
        use_disasm_cache(args.disasm_cache)
    sets = dict(parse_set(s) for s in args.set) if args.set else dict(P.CORNERS)
    jobs = [(label, sets) for label in ROWS if args.only in label]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with mp.get_context("fork").Pool(max(1, min(args.jobs, len(jobs)))) as pool, \
            open(out.with_suffix(".jsonl"), "w") as log:     # row by row: long rows
        rows = []
        for r in pool.imap_unordered(one, jobs):
            rows.append(r)
            print(json.dumps(r), flush=True)
            log.write(json.dumps(r) + "\n")
            log.flush()
    out.write_text(json.dumps(dict(sets=sets, rows=rows), indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
