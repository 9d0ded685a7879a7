"""Take the README's screenshot: `uv run python -m tests.support.screenshot [PATH] [URL_PATH]`.

Starts the embedded console in a temporary directory with the demo data, logs in as the demo
customer in headless Chromium and saves a PNG of the page.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.support import servers
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "static/console/screenshot.png")
    url_path = sys.argv[2] if len(sys.argv) > 2 else "/"
    user = sys.argv[3] if len(sys.argv) > 3 else "demo"
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        env = servers.embedded_env(tmp)
        servers.manage(env, "migrate", "--noinput", "-v", "0")
        servers.manage(env, "demo_setup")
        stack = servers.Stack(env=env, port=servers.free_port(), tmp=tmp)
        stack.start_web()
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 800}, locale="zh-CN")
                page.goto(stack.url + "/accounts/login/")
                page.fill("input[name=login]", user)
                page.fill(
                    "input[name=password]",
                    "ops-password-2026" if user == "ops" else "demo-password-2026",
                )
                page.click("#login-form button[type=submit]")
                page.wait_for_url(stack.url + "/")
                page.goto(stack.url + url_path)
                page.wait_for_load_state("networkidle")
                page.screenshot(path=str(target), full_page=False)
                browser.close()
        finally:
            stack.stop()
    print(f"saved {target}")


if __name__ == "__main__":
    main()
