"""Fixtures for the dashboard tests: a real headless Chromium driving the page of a real
3-node cluster.

The browser is Debian's `chromium` package (`/usr/bin/chromium`, or `RAFTCRON_CHROMIUM`),
driven by Playwright with `executable_path` set to it: `playwright install` downloads browsers
of its own, which this project never does. When the browser is missing, the session tries to
install it with apt-get (as root, unless `RAFTCRON_NO_BROWSER_INSTALL=1`); when it still
cannot be launched the tests are skipped with the reason, except under `CI=true`, where that
is a failure: CI must run them (`.ci/run` installs the browser).

What this module owns: the browser (one per session), the clusters (one shared by the tests
that leave it whole, fresh ones for the others), a fresh browser context per test (its own
sessionStorage), a screenshot when a test fails, and the screenshot paths in the terminal
summary. Every process it starts is ended at the end, also when a test fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

CHROMIUM = os.environ.get("RAFTCRON_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
APT_PACKAGES = ["chromium", "fonts-dejavu-core"]
INSTALL_TIMEOUT_S = 600
VIEWPORT = {"width": 1400, "height": 1000}
REFRESH_S = 1  # the page's refresh period in these tests (?refresh=1)

# Screenshots written this session, listed at the end of the run whatever `-s` says.
SCREENSHOTS: list[tuple[str, Path]] = []


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """No browser: a skip with the reason on a developer's machine, a failure in CI."""
    if in_ci():
        pytest.fail(f"CI must run the dashboard tests, but: {reason}", pytrace=False)
    print(f"dashboard tests skipped: {reason}")
    pytest.skip(reason)


# -- pytest hooks ----------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember each phase's report on the item, so fixtures know whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SCREENSHOTS:
        terminalreporter.section("dashboard screenshots")
        for what, path in SCREENSHOTS:
            terminalreporter.write_line(f"{what}: {path}")


def _failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "report_call", None)
    return report is not None and report.failed


# -- the browser -----------------------------------------------------------------------------


def _install_chromium() -> str | None:
    """Try `apt-get install` of the browser; None when it worked, else why not."""
    if os.environ.get("RAFTCRON_NO_BROWSER_INSTALL") == "1":
        return "RAFTCRON_NO_BROWSER_INSTALL=1"
    if shutil.which("apt-get") is None:
        return "apt-get is not available"
    if os.geteuid() != 0:
        return "not root, so apt-get cannot install it"
    print(f"{CHROMIUM} is missing: apt-get install {' '.join(APT_PACKAGES)} ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *APT_PACKAGES]
    try:
        for command in (["apt-get", "update", "-q"], install):
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
            )
            if done.returncode != 0:
                return f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}"
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"apt-get did not finish: {error}"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the dashboard tests (Debian's package, driven by Playwright).

    Module-scoped, not session-scoped: Playwright's sync API runs an event loop in this thread
    while it is started, and later tests call asyncio.run().
    """
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        unavailable(f"playwright is not installed ({error}): pip install -e '.[test]'")
    if not Path(CHROMIUM).exists():
        why_not = _install_chromium()
        if not Path(CHROMIUM).exists():
            unavailable(f"{CHROMIUM} is missing and could not be installed: {why_not}")
    playwright = sync_playwright().start()
    try:
        try:
            launched = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS
            )
        except PlaywrightError as error:
            unavailable(f"{CHROMIUM} could not be launched: {str(error)[:800]}")
        try:
            yield launched
        finally:
            launched.close()
    finally:
        playwright.stop()


class Page:
    """A page of the dashboard in a fresh browser context, with what it logged."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.page = context.new_page()
        self.page_errors: list[str] = []
        self.page.on("pageerror", lambda error: self.page_errors.append(str(error)))

    def open(self, node: LocalNode, *, wait: bool = True) -> Any:
        """Load the dashboard from `node`; with `wait`, until it shows that node's name."""
        self.page.goto(f"{node.url}/?refresh={REFRESH_S}")
        if wait:
            from playwright.sync_api import expect

            expect(self.page.locator("#this-node")).to_contain_text(node.node_id)
        return self.page


@pytest.fixture
def dashboard(browser: Any, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Page]:
    """A fresh browser context (own sessionStorage); a screenshot if the test fails."""
    from playwright.sync_api import expect

    expect.set_options(timeout=15_000)
    context = browser.new_context(viewport=VIEWPORT)
    page = Page(context)
    try:
        yield page
        if _failed(request):
            path = tmp_path / "failure.png"
            page.page.evaluate("window.scrollTo(0, 0)")
            page.page.screenshot(path=str(path), full_page=True)
            SCREENSHOTS.append((f"{request.node.name} failed; the page then", path))
            print(f"screenshot of the page when the test failed: {path}")
        assert not page.page_errors, f"JavaScript errors in the page: {page.page_errors}"
    finally:
        context.close()


@pytest.fixture(scope="session")
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard-screenshots")


@pytest.fixture
def screenshot(
    screenshot_dir: Path, record_property: Callable[[str, object], None]
) -> Callable[[Any, str], Path]:
    """Write a full-page PNG, list it in the terminal summary and the JUnit properties."""

    def take(page: Any, name: str) -> Path:
        path = screenshot_dir / f"{re.sub(r'[^a-z0-9-]+', '-', name.lower())}.png"
        page.evaluate("window.scrollTo(0, 0)")  # the sticky header belongs at the top
        page.screenshot(path=str(path), full_page=True)
        SCREENSHOTS.append((name, path))
        record_property(f"screenshot {name}", str(path))
        print(f"dashboard screenshot ({name}): {path}")
        return path

    return take


# -- clusters --------------------------------------------------------------------------------


def _cluster_problems(cluster: LocalCluster) -> list[str]:
    where = f"(node logs under {cluster.base_dir})"
    problems = [
        f"{node.node_id} exited by itself with code {node.process.returncode} {where}"
        for node in cluster.crashed_nodes()
        if node.process is not None
    ]
    problems += [f"a traceback through our code {where}:\n{t}" for t in cluster.tracebacks()]
    return problems


def _check_dashboard_is_served(cluster: LocalCluster) -> None:
    node = cluster.nodes[0]
    status, body, headers = cluster.request(node, "GET", "/")
    if status != 200 or "text/html" not in headers.get("Content-Type", ""):
        pytest.fail(
            f"GET / on {node.node_id} answered {status} {str(body)[:200]!r}: is "
            "dashboard.routes() in build_app (cluster/http/app.py)?",
            pytrace=False,
        )


class Clusters:
    """Starts clusters under one folder; at the end checks and closes every one of them."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.opened: list[LocalCluster] = []

    def open(self, **options: Any) -> LocalCluster:
        options.setdefault("raft", FAST_RAFT)
        cluster = LocalCluster(self.base_dir / f"c{len(self.opened) + 1}", **options)
        self.opened.append(cluster)
        cluster.start()
        cluster.wait_ready(timeout_s=30)
        _check_dashboard_is_served(cluster)
        return cluster

    def finish(self) -> None:
        problems: list[str] = []
        try:
            for cluster in self.opened:
                problems += _cluster_problems(cluster)
        finally:
            for cluster in self.opened:
                cluster.close()
        if problems:
            pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One ready 3-node cluster (no tokens) for the tests that leave it whole."""
    clusters = Clusters(tmp_path_factory.mktemp("dashboard-cluster"))
    try:
        yield clusters.open()
    finally:
        clusters.finish()


SMALL_BUDGET_BYTES = 4 * 1024**2  # the budget_cluster's: a few dozen jobs of 60 KB fill it


@pytest.fixture(scope="module")
def budget_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One ready 3-node cluster (no tokens) whose state budget is SMALL_BUDGET_BYTES, for the
    tests of the state panel (they fill it, so it is not the shared cluster)."""
    clusters = Clusters(tmp_path_factory.mktemp("dashboard-budget-cluster"))
    try:
        yield clusters.open(settings={"budget": {"bytes": SMALL_BUDGET_BYTES}})
    finally:
        clusters.finish()


@pytest.fixture
def fresh_clusters(tmp_path: Path) -> Iterator[Clusters]:
    """Clusters for one test (with tokens, or one the test hurts)."""
    clusters = Clusters(tmp_path)
    try:
        yield clusters
    finally:
        clusters.finish()
