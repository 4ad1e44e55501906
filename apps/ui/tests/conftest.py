"""A Chromium for the browser tests: Debian's, driven by Playwright (one per test module)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from telescope_ui.testing import chromium_path


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield browser
        browser.close()
