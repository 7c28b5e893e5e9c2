"""The suite runs tier by tier and a failure in the unit tier ends the run there: a typo in a config check is
reported in a minute, not after the emulator and the FSDP2 runs. `pytest -q tests/unit` runs the unit tier alone.

After the unit tier, the longest tiers go first: the workers (pytest-xdist, one test file per worker at a time)
take the files in this order, so the loaded stops and the multi-rank runs start early and the short files fill
the other workers' time instead of trailing at the end."""
import pytest

# Folders under tests/, in the order they run; a folder not listed runs last.
TIERS = ("unit", "loaded", "slurm", "ranks", "process", "gcs", "s3", "pico", "hostile")


def tier_of(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else ""


def _rank(item) -> int:
    tier = tier_of(item.nodeid)
    return TIERS.index(tier) if tier in TIERS else len(TIERS)


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_rank)  # stable: each file keeps its own order


_unit_failed: list[str] = []
_config = None  # the run's config: on the xdist controller it holds the plugin that stops every worker


def pytest_runtest_logreport(report):
    if report.failed and tier_of(report.nodeid) == "unit":
        _unit_failed.append(report.nodeid)
        dsession = _config.pluginmanager.getplugin("dsession") if _config else None
        if dsession is not None:  # the xdist controller: every worker stops at once, whatever tier it is in
            dsession.shouldstop = _stop_reason()


def _stop_reason() -> str:
    return f"{len(set(_unit_failed))} unit test(s) failed: the slower tiers did not run"


def pytest_configure(config):
    global _config
    _config = config


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    if _unit_failed and nextitem is not None and tier_of(nextitem.nodeid) != "unit":
        item.session.shouldstop = _stop_reason()
