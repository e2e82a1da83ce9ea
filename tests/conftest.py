import os

from hypothesis import HealthCheck, settings

# CI runs the full example budget; a developer's run may lower it with HYPOTHESIS_PROFILE=dev.
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: object) -> None:
    """A SIGTERM (a CI job's timeout, `timeout N pytest`) ends the run like Ctrl-C: fixtures
    are torn down and atexit hooks run, so the node processes, namespaces and mounts tests made
    are removed. By default SIGTERM ends Python at once and a started node outlives the run
    (one did, by hours, after `timeout 120 pytest tests/storage/`)."""
    import signal
    import threading

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


# -- test tiers ---------------------------------------------------------------------------------
# `processes`: the test starts processes (nodes, workers, a browser, the chaos smoke, a command
# such as openssl or ip) or forks. `make unit` runs the others, `make integration` these, and
# `make test` both. A test is in the tier when it uses a fixture that starts processes, or its
# module says `pytestmark = pytest.mark.processes`; a test outside the tier that starts one
# anyway fails, naming the tier, so the split cannot drift.
PROCESS_FIXTURES = frozenset({
    "cluster", "cluster_factory", "module_cluster_factory", "shared_cluster", "fresh_clusters",
    "budget_cluster",
    "start_worker", "node", "fresh_node", "browser", "dashboard", "lab", "needs_fuse",
})


def pytest_collection_modifyitems(items: list) -> None:
    import pytest

    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.processes)


def _refuse_processes(monkeypatch, nodeid: str) -> None:
    import os
    import subprocess

    def refused(*args: object, **kwargs: object):
        raise AssertionError(
            f"{nodeid} started a process outside the processes tier: mark its module "
            "`pytestmark = pytest.mark.processes` (or use a fixture that starts processes)"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refused)
    monkeypatch.setattr(os, "fork", refused)
    monkeypatch.setattr(os, "posix_spawn", refused)
    monkeypatch.setattr(os, "posix_spawnp", refused)


import pytest  # noqa: E402  (below the hypothesis profiles, which must load first)

# croniter's import asks platform.architecture(), which runs the `file` command: a unit test
# whose code path imports the cron parser first (the node command, the CLI) then "started a
# process" under the tier guard, or not, depending on which test of the worker ran before it.
import raftcron.scheduler.cronexpr  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _tier_guard(request: pytest.FixtureRequest):
    # Its own MonkeyPatch, not the `monkeypatch` fixture: sharing the test's would change the
    # order in which the test's other fixtures and its patches are undone.
    if request.node.get_closest_marker("processes") is not None:
        yield
        return
    with pytest.MonkeyPatch.context() as patches:
        _refuse_processes(patches, request.node.nodeid)
        yield
