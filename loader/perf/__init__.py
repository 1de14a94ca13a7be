"""gfxasm.perf: static analysis of gfx950 code objects and an MI355X timing model.

    gfxasm.perf.analyze(path)             -> stats.Stats (registers, occupancy, mix, loops)
    gfxasm.perf.estimate(path, grid=..., block=..., kernarg=..., buffers=[...])
                                          -> estimate.Estimate (modelled seconds, FLOP, DRAM bytes)
Importing it registers the emulator's schedule "timed" (timed.py).
CLI hooks for `gfxasm stats` / `gfxasm bench`: cli.stats_main(argv), cli.bench_main(argv).
"""
from .estimator import Estimate, estimate, format_lds_conflicts
from .params import DEFAULT, Params
from .stats import Stats, analyze, format_stats
from . import timed  # noqa: F401  (registers schedule="timed" with the emulator)

__all__ = ["analyze", "format_stats", "Stats", "estimate", "Estimate", "format_lds_conflicts", "Params",
           "DEFAULT"]
