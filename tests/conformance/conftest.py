"""The ../shared/conformance extras run only where that folder exists; elsewhere they are
deselected (not skipped, not passed) and the session header says how many."""
from __future__ import annotations

from .cases import SHARED_DIR

_deselected: list = []


def pytest_collection_modifyitems(config, items):
    if SHARED_DIR.is_dir():
        return
    keep = [item for item in items if item.get_closest_marker("shared_conformance") is None]
    _deselected[:] = [item for item in items if item.get_closest_marker("shared_conformance") is not None]
    if _deselected:
        config.hook.pytest_deselected(items=_deselected)
        items[:] = keep


def pytest_report_collectionfinish(config, items):
    if _deselected:
        return (f"conformance: {len(_deselected)} ../shared/conformance extras deselected "
                f"({SHARED_DIR} is absent); the corpus cases run")
    return None
