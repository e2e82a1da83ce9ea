"""The tier guard (tests/conftest.py): a test outside the `processes` tier that starts a
process fails, naming the tier, so `make unit` stays free of processes."""

import os
import subprocess

import pytest


@pytest.mark.parametrize(
    "start",
    [
        lambda: subprocess.Popen(["true"]),
        lambda: subprocess.run(["true"], check=True),
        lambda: os.fork(),
        lambda: os.posix_spawn("/bin/true", ["true"], dict(os.environ)),
    ],
    ids=["popen", "run", "fork", "posix_spawn"],
)
def test_a_unit_test_that_starts_a_process_fails_naming_the_tier(start):
    with pytest.raises(AssertionError, match="outside the processes tier"):
        start()

