"""Every route of the URL configuration, with sample values filled in for its parameters."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RegexPattern, RoutePattern

_SAMPLES = {
    "int": "1",
    "uuid": str(uuid.UUID(int=1)),
    "slug": "sample",
    "str": "sample",
    "path": "sample",
}


@dataclass(frozen=True)
class Route:
    path: str  # a concrete URL path with sample parameters
    name: str  # "namespace:name" or "" for unnamed
    has_params: bool


def _piece(pattern: RoutePattern | RegexPattern) -> tuple[str, bool] | None:
    if isinstance(pattern, RoutePattern):
        route = str(pattern._route)
        if "format" in route:  # DRF format-suffix duplicates
            return None

        def sub(m: re.Match[str]) -> str:
            conv = m.group(1) or "str"
            return _SAMPLES.get(conv, "sample")

        filled, n = re.subn(r"<(?:(\w+):)?\w+>", sub, route)
        return filled, n > 0
    regex = pattern._regex
    if "format" in regex:  # DRF format-suffix duplicates
        return None
    filled, n = re.subn(r"\(\?P<\w+>[^)]*\)", str(uuid.UUID(int=1)), regex)
    if re.search(r"[\\()\[\]|*+?]", filled.strip("^$")):
        return None  # an unconstrained regex we cannot sample honestly
    return filled.strip("^").rstrip("$"), n > 0


def iter_routes(prefix_filter: tuple[str, ...] = ("admin/",)) -> Iterator[Route]:
    def walk(patterns: list, prefix: str, ns: str, params: bool) -> Iterator[Route]:
        for p in patterns:
            piece = _piece(p.pattern)
            if piece is None:
                continue
            text, has = piece
            if isinstance(p, URLResolver):
                sub_ns = f"{ns}{p.namespace}:" if p.namespace else ns
                yield from walk(p.url_patterns, prefix + text, sub_ns, params or has)
            elif isinstance(p, URLPattern):
                path = "/" + prefix + text
                if any(path.startswith("/" + f) for f in prefix_filter):
                    continue
                yield Route(
                    path=path, name=f"{ns}{p.name}" if p.name else "", has_params=params or has
                )

    seen: set[str] = set()
    for route in walk(get_resolver().url_patterns, "", "", False):
        if route.path not in seen:
            seen.add(route.path)
            yield route
