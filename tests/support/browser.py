"""Headless Chromium for the browser tests and the README screenshot (Debian's, never downloaded)."""

from __future__ import annotations

import os

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialling out of this closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
