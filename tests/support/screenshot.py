"""Take the README's screenshot: `uv run python -m tests.support.screenshot [PATH] [URL_PATH]`.

Starts the embedded console in a temporary directory with the demo data, logs in as the demo
customer in headless Chromium and saves a PNG of the page. The page is in Chinese: without a CJK
font (Debian: `apt-get install fonts-wqy-zenhei`) Chromium draws its characters as boxes.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.support import servers
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, log_in


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "static/console/screenshot.png")
    url_path = sys.argv[2] if len(sys.argv) > 2 else "/"
    user = sys.argv[3] if len(sys.argv) > 3 else "demo"
    with (
        tempfile.TemporaryDirectory() as tmp_dir,
        servers.embedded_demo(Path(tmp_dir)) as stack,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(
            base_url=stack.url, viewport={"width": 1280, "height": 800}, locale="zh-CN"
        )
        log_in(page, user, servers.DEMO_LOGINS[user])
        page.goto(url_path)
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(target), full_page=False)
        browser.close()
    print(f"saved {target}")


if __name__ == "__main__":
    main()
