"""The one loader of the catalogue's manifest directories (recipes and AI applications).

A recipe (``marketplace/recipes/<slug>/``) and an AI app (``marketplace/apps/<slug>/``) are each a
directory with a ``manifest.yaml`` and the files the image runs. What every such manifest shares is
read and checked here, once: the YAML mapping, its one-line text fields, the slug that names its
directory, the image version, the files it ships and its environment. ``marketplace.recipes`` and
``marketplace.aiapps`` read their own fields on top. Pure: no Django; ``CatalogueError`` names the
file and the field it cannot use (``FILE: reason``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from marketplace.catalogue import CatalogueError, is_valid_slug

MANIFEST = "manifest.yaml"
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")

# Chinese characters and punctuation: a folded YAML line break between two of them is no space.
_CJK = "\u3000-\u303f\u3400-\u9fff\uff00-\uffef"
_CJK_GAP = re.compile(f"(?<=[{_CJK}]) (?=[{_CJK}])")

T = TypeVar("T")


def manifest_text(data: dict[str, Any], key: str, where: str, *, required: bool = True) -> str:
    """A manifest's text field on one line (recipes and AI apps): whitespace folded to one space,
    none between two Chinese characters; ``CatalogueError`` when it is not text or missing."""
    value = data.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise CatalogueError(f"{where}: {key} must be text")
    value = _CJK_GAP.sub("", " ".join(str(value).split()))
    if required and not value:
        raise CatalogueError(f"{where}: {key} is missing")
    return value


@dataclass(frozen=True)
class Manifest:
    """One directory's manifest, read and found to be a mapping; ``where`` names its file."""

    directory: Path
    data: dict[str, Any]
    where: str
    noun: str  # "recipe", "app": in messages ("is not in the recipe's directory")

    def text(self, key: str, *, required: bool = True) -> str:
        return manifest_text(self.data, key, self.where, required=required)

    def slug(self) -> str:
        """The ``slug`` field: a valid slug, the name of the manifest's directory."""
        slug = self.text("slug")
        if not is_valid_slug(slug) or slug != self.directory.name:
            raise CatalogueError(
                f"{self.where}: slug {slug!r} must be valid and name its directory"
            )
        return slug

    def image(self) -> str:
        """The ``image`` field: an image version's slug (the catalogue checks it exists)."""
        image = self.text("image")
        if not is_valid_slug(image):
            raise CatalogueError(f"{self.where}: image {image!r} is not an image version slug")
        return image

    def files(self) -> tuple[str, ...]:
        """The ``files`` the image runs: plain names of files in the manifest's directory."""
        files = tuple(str(f) for f in self.data.get("files") or ())
        for name in files:
            if "/" in name or name.startswith(".") or not (self.directory / name).is_file():
                raise CatalogueError(
                    f"{self.where}: file {name!r} is not in the {self.noun}'s directory"
                )
        return files

    def env(self) -> dict[str, str]:
        """The ``env`` mapping: ``NAME: value`` pairs, each value one line (the runtime reads
        them as an env file, one variable a line)."""
        env_data = self.data.get("env") or {}
        if not isinstance(env_data, dict):
            raise CatalogueError(f"{self.where}: env must map names to values")
        env: dict[str, str] = {}
        for key, value in env_data.items():
            if (
                not isinstance(key, str)
                or not ENV_NAME.fullmatch(key)
                or isinstance(value, (dict, list))
            ):
                raise CatalogueError(f"{self.where}: env {key!r} is not NAME: value")
            if "\n" in str(value) or "\r" in str(value):
                raise CatalogueError(f"{self.where}: env {key} must be one line")
            env[key] = str(value)
        return env


def read_manifest(directory: Path, noun: str) -> Manifest:
    """The directory's ``manifest.yaml``; ``CatalogueError`` when it is unreadable or no mapping."""
    path = directory / MANIFEST
    where = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogueError(f"{where}: {exc}") from exc
    if not isinstance(data, dict):
        raise CatalogueError(f"{where}: not a mapping")
    return Manifest(directory=directory, data=data, where=where, noun=noun)


def manifest_dirs(root: Path) -> Iterator[Path]:
    """The directories under ``root`` that hold a manifest, by name."""
    return (d for d in sorted(root.iterdir()) if (d / MANIFEST).is_file())


def read_all(root: Path, read_one: Callable[[Path], T]) -> list[T]:
    """Every manifest directory under ``root`` read with ``read_one``, by directory name."""
    return [read_one(d) for d in manifest_dirs(root)]
