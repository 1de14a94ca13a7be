"""Command-line entry points for `gfxasm stats` and `gfxasm bench` (wired by gfxasm.cli).

    gfxasm stats FILE.co [FILE.co ...] [--kernel NAME] [--block N] [--json]
    gfxasm bench [--only SUBSTR] [--small] [--out bench/results.json] [--png bench/roofline.png]
                 [--sample-rounds N]

`bench` imports every bench/bench_*.py module of the checkout, collects its
`cases(full)` and runs them through bench.common.run: measured with device events on a
gfx950, modelled by gfxasm.perf.estimate otherwise (and marked "modelled").
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from .stats import analyze, format_stats

REPO = Path(__file__).resolve().parents[2]


def stats_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gfxasm stats", description="static analysis of gfx950 code objects")
    ap.add_argument("files", nargs="+", help=".co files")
    ap.add_argument("--kernel", help="kernel symbol (when a file holds several)")
    ap.add_argument("--block", type=int, help="workgroup size in threads (default: from the metadata)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(argv)
    status = 0
    out = []
    for f in args.files:
        try:
            s = analyze(f, args.kernel, args.block)
        except Exception as exc:        # report and go on with the other files
            print(f"{f}: {exc}", file=sys.stderr)
            status = 1
            continue
        if args.json:
            out.append(s.to_dict())
        else:
            print(format_stats(s))
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    return status


def bench_modules(root: Path = REPO):
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    for path in sorted((root / "bench").glob("bench_*.py")):
        yield importlib.import_module(f"bench.{path.stem}")


def bench_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gfxasm bench", description="benchmark every kernel in bench/")
    ap.add_argument("--only", help="run only configurations whose label contains this")
    ap.add_argument("--small", action="store_true", help="small shapes (quick check)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    ap.add_argument("--png", default=str(REPO / "bench" / "roofline.png"))
    ap.add_argument("--sample-rounds", type=int, default=1,
                    help="workgroup rounds of one CU to simulate (modelled figures)")
    args = ap.parse_args(argv)
    modules = list(bench_modules())    # puts the checkout on sys.path: bench/ is not in the package
    from bench.common import run
    cases = []
    for mod in modules:
        cases += mod.cases(not args.small)
    if args.only:
        cases = [c for c in cases if args.only in c.label]
    if not cases:
        print("no bench cases found", file=sys.stderr)
        return 1
    run(cases, out=args.out, png=args.png, sample_rounds=args.sample_rounds)
    return 0


if __name__ == "__main__":
    sys.exit(stats_main())
