"""A real browser for the page tests: Debian's ``chromium`` (``scripts/install.sh`` installs it) driven by
Playwright's Python package with ``executable_path`` (Playwright's own browser download cannot be reached from
here). Console errors and uncaught page errors are collected, so a test can assert there were none; screenshots
go to ``$DGRPO_TEST_ARTIFACTS`` (default ``test-artifacts/``, ignored by git) for a person to look at."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ARTIFACTS = Path(os.environ.get("DGRPO_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts"))


def chromium_path() -> str:
    """The browser binary: ``$DGRPO_CHROMIUM``, else ``chromium`` on PATH. Missing is a failure, not a skip:
    the set-up installs it."""
    path = os.environ.get("DGRPO_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "no chromium: run scripts/install.sh (it installs Debian's chromium package)"
    return path


@dataclass
class Browser:
    page: Any  # playwright.sync_api.Page
    errors: list[str] = field(default_factory=list)

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@contextmanager
def browser(width: int = 1280, height: int = 900) -> Iterator[Browser]:
    """A headless page; ``errors`` collects console errors and uncaught exceptions while it is open."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chrome = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"], headless=True)
        try:
            page = chrome.new_page(viewport={"width": width, "height": height})
            b = Browser(page)
            page.on("console", lambda m: b.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: b.errors.append(f"page error: {e}"))
            yield b
        finally:
            chrome.close()
