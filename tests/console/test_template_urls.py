"""Links and forms in templates name their URL (``{% url %}``), so a moved route cannot leave a
dead link behind. The exceptions are the 500 and 503 pages, which render with no URL resolution."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

LITERAL = re.compile(r'\b(?:href|action|hx-get|hx-post)="/(?!/)')
# The server-error and unavailable pages render without context processors or URL reversing (they
# may be what failed: a 503 is the database or Redis gone), so they link the site root literally.
ALLOWED = {"500.html", "503.html"}


def test_templates_link_by_url_name_not_by_literal_path() -> None:
    roots = [Path(d) for d in settings.TEMPLATES[0]["DIRS"]]
    roots += [p for p in Path(settings.BASE_DIR).glob("*/templates") if p.is_dir()]
    found = []
    for root in roots:
        for path in root.rglob("*.html"):
            if path.name in ALLOWED and path.parent == root:
                continue
            for n, line in enumerate(path.read_text().splitlines(), start=1):
                if LITERAL.search(line):
                    found.append(f"{path.relative_to(settings.BASE_DIR)}:{n}")
    assert roots and not found, found
