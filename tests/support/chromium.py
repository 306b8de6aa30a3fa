"""Debian's headless Chromium for the browser tests (never ``playwright install``: no download).

scripts/test.sh installs ``chromium`` (apt) where it is missing; Playwright's Python package
drives it through ``executable_path``.
"""

from __future__ import annotations

__all__ = ["CHROMIUM", "CHROMIUM_ARGS"]

CHROMIUM = "/usr/bin/chromium"
#: Headless, no sandbox (containers), software rendering (WebGL falls back to SwiftShader), and
#: none of the browser's own network traffic.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
