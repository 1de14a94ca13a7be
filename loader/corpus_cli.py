"""`gfxasm corpus`: fetch the pinned aiter corpus, and measure the emulator's coverage of it.

    gfxasm corpus fetch [--wheel FILE]      download (or take FILE), check sha256, extract
    gfxasm corpus fetch-extra NAME [--file FILE]
                                            a pinned object no wheel carries (from GitHub
                                            at its aiter commit, or FILE), sha256 checked
    gfxasm corpus path                      print where the corpus is
    gfxasm corpus coverage [-v] [--jobs N] [--json FILE] [--under DIR]
                                            per gfx950 code object: decodes, every mnemonic
                                            implemented, every format check passed
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from multiprocessing import Pool
from pathlib import Path

from . import corpus


def _coverage(args) -> int:
    from .emu.coverage import CoverageReport, object_coverage
    root = corpus.root()
    paths = [p for p in corpus.gfx950_code_objects() if p.is_relative_to(root / corpus.GFX950_DIR / args.under)]
    with Pool(args.jobs) as pool:
        report = CoverageReport(pool.map(object_coverage, paths, chunksize=8))
    print(f"{report.covered} / {len(paths)} gfx950 code objects of {corpus.PACKAGE}=={corpus.VERSION} "
          f"are covered (decode, every mnemonic implemented, every format check passed)")
    blockers = report.blockers()
    if blockers:
        print("what blocks the others (objects blocked):")
        for what, n in blockers.most_common(None if args.verbose else 25):
            print(f"  {n:5d}  {what}")
    if args.verbose:
        for o in report.objects:
            if not o.covered:
                print(f"{o.path.relative_to(root)}: " + "; ".join(
                    [o.decode_error] * bool(o.decode_error) + sorted(o.missing) + sorted(o.rejected)))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "corpus": f"{corpus.PACKAGE}=={corpus.VERSION}", "covered": report.covered, "total": len(paths),
            "blockers": dict(blockers.most_common()),
            "objects": {str(o.path.relative_to(root)): o.covered for o in report.objects}}, indent=1))
    return 0


def corpus_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gfxasm corpus", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="action", required=True)
    fetch = sub.add_parser("fetch", help="download the pinned wheel with pip, check its sha256, extract it")
    fetch.add_argument("--wheel", type=Path, help=f"use this copy of {corpus.WHEEL} instead of downloading")
    extra = sub.add_parser("fetch-extra", help="store a pinned extra object (sha256 checked)")
    extra.add_argument("name", choices=sorted(corpus.EXTRA_OBJECTS))
    extra.add_argument("--file", type=Path, help="use this copy instead of downloading it from GitHub")
    sub.add_parser("path", help="print the corpus directory")
    cov = sub.add_parser("coverage", help="which corpus code objects the emulator can run")
    cov.add_argument("-v", "--verbose", action="store_true", help="every blocker, and each blocked object")
    cov.add_argument("--jobs", type=int, default=os.cpu_count(), help="worker processes")
    cov.add_argument("--json", help="write the report as JSON to this file")
    cov.add_argument("--under", default="", help="only objects under this folder of hsa/gfx950 (e.g. fmoe)")
    args = ap.parse_args(argv)
    try:
        if args.action == "fetch":
            corpus.fetch(args.wheel)
        elif args.action == "fetch-extra":
            corpus.fetch_extra(args.name, args.file)
        elif args.action == "path":
            print(corpus.root())
        else:
            return _coverage(args)
    except (corpus.CorpusMissing, RuntimeError, OSError) as exc:
        print(f"gfxasm corpus {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0
