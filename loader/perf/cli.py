"""Command-line entry points for `gfxasm stats` and `gfxasm bench` (wired by gfxasm.cli).

    gfxasm stats FILE.co [FILE.co ...] [--kernel NAME] [--block N] [--json] [--lds]
    gfxasm bench [--only SUBSTR] [--small] [--out bench/results.json] [--png bench/roofline.png]
                 [--sample-rounds N]

`bench` imports every bench/bench_*.py module of the checkout (this package's, or the
current folder when an installed gfxasm runs from a clone; with neither it says so and
exits 0), collects its `cases(full)` (a module needing an absent corpus, tests/ or
../shared is skipped with a notice) and runs them through bench.common.run, printing
'[i/N] label' before each: measured with device events on a gfx950, modelled by
gfxasm.perf.estimate otherwise (and marked "modelled").

`stats --lds` adds, per file, the LDS bank conflicts of the hottest loop's DS instructions
under every phase hypothesis of lds_banks (conflict cycles per execution, emulated lane
addresses), from a known small launch of the same code object: the checkout's
bench/bench_*.py cases(full=False) and LAUNCH_MODULES' small_cases(). A file with no known
launch says so.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from .stats import analyze, format_stats

REPO = Path(__file__).resolve().parents[2]


# Modules of a checkout whose small_cases() give launches of our other kernels, beside the
# bench/bench_*.py cases(full=False): where `gfxasm stats --lds` looks for a known launch.
LAUNCH_MODULES = ("bench.decode", "bench.mxfp8_gemm")


def known_launches(root: Path) -> list:
    """Small launches (BenchCases) of every kernel a checkout's benchmarks know how to launch."""
    cases = bench_cases(root, full=False)
    for name in LAUNCH_MODULES:
        try:
            cases += importlib.import_module(name).small_cases()
        except (ImportError, FileNotFoundError) as missing:
            print(f"gfxasm stats: no launches from {name}: {missing}", file=sys.stderr)
    return cases


def launch_of(co: str, kernel: str | None, cases: list):
    """The first case launching the same code object bytes (and kernel, if named), or None."""
    data = Path(co).read_bytes()
    for c in cases:
        if (kernel is None or c.kernel == kernel) and Path(c.co).is_file() and Path(c.co).read_bytes() == data:
            return c
    return None


def lds_report(co: str, kernel: str | None, cases: list) -> tuple[str, list | None]:
    """Bank conflicts of the hottest loop's DS instructions in a known launch of `co`
    (emulated lane addresses, every phase hypothesis), as text and as rows."""
    from .estimator import estimate, format_lds_conflicts
    c = launch_of(co, kernel, cases)
    if c is None:
        return (f"LDS bank conflicts: no known launch of {co} (bench/bench_*.py cases(full=False), "
                f"{', '.join(LAUNCH_MODULES)} small_cases())"), None
    est = estimate(c.co, c.grid, c.block, c.kernarg, c.buffers, c.kernel)
    return f"launch: {c.label} (grid {tuple(c.grid)})\n" + format_lds_conflicts(est), est.lds_conflicts


def stats_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gfxasm stats", description="static analysis of gfx950 code objects")
    ap.add_argument("files", nargs="+", help=".co files")
    ap.add_argument("--kernel", help="kernel symbol (when a file holds several)")
    ap.add_argument("--block", type=int, help="workgroup size in threads (default: from the metadata)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    ap.add_argument("--lds", action="store_true",
                    help="also LDS bank conflicts of the hottest loop, emulating a known small launch of the "
                         "file (from the checkout's benchmarks; seconds to a minute per file)")
    args = ap.parse_args(argv)
    root = checkout_root()
    cases = known_launches(root) if args.lds and root else []
    status = 0
    out = []
    for f in args.files:
        try:
            s = analyze(f, args.kernel, args.block)
            lds = lds_report(f, args.kernel, cases) if args.lds else None
        except Exception as exc:        # report and go on with the other files
            print(f"{f}: {exc}", file=sys.stderr)
            status = 1
            continue
        if args.json:
            out.append({**s.to_dict(), **({"lds_conflicts": lds[1]} if lds else {})})
        else:
            print(format_stats(s))
            if lds:
                print(lds[0])
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    return status


def checkout_root() -> Path | None:
    """The checkout whose bench/ `gfxasm bench` runs: this package's own (an editable install),
    else the current folder when it is one (an installed package run from a clone)."""
    for root in (REPO, Path.cwd()):
        if (root / "bench" / "common.py").is_file():
            return root
    return None


def bench_cases(root: Path, full: bool) -> list:
    """The cases of every bench/bench_*.py of `root`; a module needing what is absent here
    (the corpus, tests/, ../shared) is skipped with a notice."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))      # bench/ and tests/ are not in the package
    cases = []
    for path in sorted((root / "bench").glob("bench_*.py")):
        try:
            cases += importlib.import_module(f"bench.{path.stem}").cases(full)
        except (ImportError, FileNotFoundError) as missing:    # CorpusMissing is a FileNotFoundError
            print(f"gfxasm bench: skipped bench/{path.name}: {missing}", file=sys.stderr)
    return cases


def with_progress(cases: list):
    """The cases, each announced as '[i/N] label' before it runs (a modelled case takes a while)."""
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case.label}", flush=True)
        yield case


def bench_main(argv=None) -> int:
    root = checkout_root()
    ap = argparse.ArgumentParser(prog="gfxasm bench", description="benchmark every kernel in bench/ of a checkout")
    ap.add_argument("--only", help="run only configurations whose label contains this")
    ap.add_argument("--small", action="store_true", help="small shapes (quick check)")
    ap.add_argument("--out", default=str((root or Path.cwd()) / "bench" / "results.json"))
    ap.add_argument("--png", default=str((root or Path.cwd()) / "bench" / "roofline.png"))
    ap.add_argument("--sample-rounds", type=int, default=1,
                    help="workgroup rounds of one CU to simulate (modelled figures)")
    args = ap.parse_args(argv)
    if root is None:
        print("gfxasm bench: skipped: the benchmarks (bench/) are in a checkout of gfxasm, not in the installed "
              "package; run it from a clone", file=sys.stderr)
        return 0
    cases = bench_cases(root, not args.small)
    from bench.common import run
    if args.only:
        cases = [c for c in cases if args.only in c.label]
    if not cases:
        print("no bench cases found", file=sys.stderr)
        return 1
    run(with_progress(cases), out=args.out, png=args.png, sample_rounds=args.sample_rounds)
    return 0


if __name__ == "__main__":
    sys.exit(stats_main())
