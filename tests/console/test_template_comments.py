"""Django's ``{# #}`` comment is one line only: a ``{#`` without its ``#}`` on the same line is
printed on the page as text (it was, on every instance page). Longer comments use
``{% comment %}``."""

from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def test_no_template_comment_spans_lines() -> None:
    broken = []
    for path in sorted(TEMPLATES.rglob("*.html")) + sorted(TEMPLATES.rglob("*.txt")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            rest = line
            while "{#" in rest:
                rest = rest[rest.index("{#") + 2 :]
                if "#}" not in rest:
                    broken.append(f"{path.relative_to(TEMPLATES)}:{number}")
                    break
                rest = rest[rest.index("#}") + 2 :]
    assert not broken, broken
    assert sum(1 for _ in TEMPLATES.rglob("*.html")) > 50
