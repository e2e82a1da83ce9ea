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
