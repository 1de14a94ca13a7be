"""A pytest plugin for timing a suite that does not fit the time at hand (`-m full` on the
device machine): the collected tests in a seeded random order, and each finished test's
outcome and seconds appended to a log as it ends, so a run stopped at a time limit still
says how many tests ended in how long, and which.

    PYTHONPATH=bench GFXASM_SUITE_LOG=log.jsonl pytest -p suite_sample -m full -n auto

Every xdist worker draws the same order (same seed: the workers must agree on the
collection), and the controller writes the log (xdist hands it every report). One JSON
line per test phase: nodeid, when, outcome, duration, and the seconds since the session
began. A random order spreads every module's one-time setup over the run, so a rate taken
from the start of such a run overstates the whole run's time somewhat (setups are paid
early, not amortised).
"""
from __future__ import annotations

import json
import os
import random
import time

import pytest

SEED = int(os.environ.get("GFXASM_SUITE_SEED", "20261128"))
_STARTED = time.time()


def pytest_collection_modifyitems(session, config, items) -> None:
    random.Random(SEED).shuffle(items)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("GFXASM_SUITE_LOG")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):      # a worker's reports reach the controller too
        return
    with open(path, "a") as f:
        f.write(json.dumps(dict(nodeid=report.nodeid, when=report.when, outcome=report.outcome,
                                duration=report.duration, at=time.time() - _STARTED)) + "\n")
