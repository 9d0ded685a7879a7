"""On a phone-sized screen no button label breaks into vertical text (下单, 查看 did)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser

from tests.support.browser import give_session

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# For each visible button: does its label take more than one line?
WRAPPED_BUTTONS = """() => [...document.querySelectorAll('main .btn')]
  .filter(b => b.offsetParent !== null && b.textContent.trim())
  .filter(b => {
    const style = getComputedStyle(b);
    const line = parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.5;
    const inner = b.clientHeight - parseFloat(style.paddingTop) - parseFloat(style.paddingBottom);
    return inner > line * 1.5;
  })
  .map(b => b.textContent.trim())"""


def test_no_button_label_wraps_on_a_narrow_screen(
    browser: Browser,
    live_server,
    alice,
) -> None:
    context = browser.new_context(
        base_url=live_server.url, locale="zh-CN", viewport={"width": 340, "height": 700}
    )
    give_session(context, alice, live_server.url)
    page = context.new_page()
    for path in ("/billing/statement/", "/prices/", "/billing/quote/", "/accounts/ssh-keys/"):
        page.goto(path)
        assert page.locator("main .btn").count() > 0, path
        assert page.evaluate(WRAPPED_BUTTONS) == [], path
    context.close()
