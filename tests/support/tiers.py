"""The suite runs tier by tier, cheapest first, and a failure in the unit tier ends the run there: a typo in a
config check is reported in a minute, not after the emulator and the FSDP2 runs. `pytest -q tests/unit` runs
the unit tier alone."""
import pytest

# Folders under tests/, in the order they run; a folder not listed runs last.
TIERS = ("unit", "process", "hostile", "gcs", "pico", "ranks", "slurm")


def tier_of(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else ""


def _rank(item) -> int:
    tier = tier_of(item.nodeid)
    return TIERS.index(tier) if tier in TIERS else len(TIERS)


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_rank)  # stable: each file keeps its own order


_unit_failed: list[str] = []


def pytest_runtest_logreport(report):
    if report.failed and tier_of(report.nodeid) == "unit":
        _unit_failed.append(report.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    if _unit_failed and nextitem is not None and tier_of(nextitem.nodeid) != "unit":
        item.session.shouldstop = f"{len(set(_unit_failed))} unit test(s) failed: the slower tiers did not run"
