"""Playwright for the browser tests: missing, it skips the module on a developer's machine and
fails it in CI (CI=true), where `.ci/run` installs it."""

from __future__ import annotations

import os
from typing import Any

import pytest


def playwright_expect() -> Any:
    """Playwright's `expect`, called at a test module's import."""
    try:
        from playwright.sync_api import expect
    except ImportError as missing:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            raise
        pytest.skip(f"playwright is not installed ({missing}): pip install -e '.[test]'",
                    allow_module_level=True)
    return expect
