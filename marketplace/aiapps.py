"""AI applications of the catalogue (AI 应用，即开即玩): a web UI (and an API) a minute after one click.

Each application is a directory of ``marketplace/apps/`` with a ``manifest.yaml`` and the serving
code the image runs (``server.py``), the way a recipe is (``marketplace/recipes.py``). This module
only reads and checks the manifests: no Django, no money. Ordering an app, its health check and
its API key are the console's (``slices.services.apps``); prices come from the price book.

A manifest says what the app is (names and descriptions in Chinese and English, a category), what
it runs on (an image version, the models it may mount with the default first, the GPU models and
their least, recommended and most cards), how it starts (the command, run by ``sh -c`` inside the
instance like an image's launch command; catalogue data, never user input), its web ports, the
health check that says it answers (port, path, expected status) and how long that usually takes,
and the API it serves, if any. ``read_app`` refuses a broken manifest with ``FILE: reason``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from marketplace.catalogue import CatalogueError, gpu_code, is_valid_hub_id
from marketplace.manifests import MANIFEST, read_all, read_manifest
from marketplace.manifests import manifest_text as _text

APPS_DIR = Path(__file__).resolve().parent / "apps"
CATEGORIES = ("chat", "image", "finetune", "workbench")
API_KINDS = ("openai",)
MAX_CARDS = 8  # an app runs on one host
MAX_READY_SECONDS = 30 * 60
HEALTH_PATH = re.compile(r"^/[A-Za-z0-9._~/-]{0,200}$")


@dataclass(frozen=True)
class GpuOption:
    """A GPU model the app runs on: the least cards, the preset, the most."""

    gpu_model: str  # a fleet GPU model code ("RTX4090")
    min_cards: int
    recommended_cards: int
    max_cards: int


@dataclass(frozen=True)
class AppPort:
    port: int
    name: str
    name_zh: str
    primary: bool  # what the Open button opens

    def localized_name(self, language: str) -> str:
        return self.name_zh if language.startswith("zh") and self.name_zh else self.name


@dataclass(frozen=True)
class HealthCheck:
    port: int
    path: str
    status: int


@dataclass(frozen=True)
class AppApi:
    kind: str  # "openai"
    port: int
    base_path: str  # "/v1"


@dataclass(frozen=True)
class AiApp:
    slug: str
    category: str
    name: str
    name_zh: str
    summary: str
    summary_zh: str
    image: str  # an image version slug
    models: tuple[str, ...]  # hub ids; the first is the default
    gpus: tuple[GpuOption, ...]  # the first is the recommended one
    command: str
    ports: tuple[AppPort, ...]
    health: HealthCheck
    ready_seconds: int
    directory: Path
    datasets: tuple[str, ...] = ()
    api: AppApi | None = None
    files: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    order: int = 100

    @property
    def default_model(self) -> str:
        return self.models[0]

    @property
    def recommended(self) -> GpuOption:
        return self.gpus[0]

    @property
    def primary_port(self) -> AppPort:
        return next((p for p in self.ports if p.primary), self.ports[0])

    def gpu_option(self, gpu_model: str) -> GpuOption | None:
        code = gpu_code(gpu_model)
        return next((g for g in self.gpus if g.gpu_model == code), None)

    def localized_name(self, language: str) -> str:
        return self.name_zh if language.startswith("zh") and self.name_zh else self.name

    def localized_summary(self, language: str) -> str:
        return self.summary_zh if language.startswith("zh") and self.summary_zh else self.summary


def _int(value: Any, where: str, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CatalogueError(f"{where}: {what} must be a whole number from {low} to {high}")
    return value


def _port(value: Any, where: str, what: str) -> int:
    return _int(value, where, what, 1024, 65535)


def _gpus(data: Any, where: str) -> tuple[GpuOption, ...]:
    if not isinstance(data, list) or not data:
        raise CatalogueError(f"{where}: gpus must list at least one GPU model")
    out: list[GpuOption] = []
    for i, entry in enumerate(data):
        what = f"gpus[{i}]"
        if not isinstance(entry, dict):
            raise CatalogueError(f"{where}: {what} must be a mapping")
        code = gpu_code(str(entry.get("model", "")))
        if not code:
            raise CatalogueError(f"{where}: {what}.model {entry.get('model')!r} is not a GPU model")
        if any(g.gpu_model == code for g in out):
            raise CatalogueError(f"{where}: {what}.model {code} is listed twice")
        low = _int(entry.get("min_cards"), where, f"{what}.min_cards", 1, MAX_CARDS)
        high = _int(entry.get("max_cards", low), where, f"{what}.max_cards", low, MAX_CARDS)
        preset = _int(
            entry.get("recommended_cards", low), where, f"{what}.recommended_cards", low, high
        )
        out.append(GpuOption(code, low, preset, high))
    return tuple(out)


def _ports(data: Any, where: str) -> tuple[AppPort, ...]:
    if not isinstance(data, list) or not data or len(data) > 4:
        raise CatalogueError(f"{where}: ports must list one to four web ports")
    out: list[AppPort] = []
    for i, entry in enumerate(data):
        what = f"ports[{i}]"
        if not isinstance(entry, dict):
            raise CatalogueError(f"{where}: {what} must be a mapping")
        port = _port(entry.get("port"), where, f"{what}.port")
        if any(p.port == port for p in out):
            raise CatalogueError(f"{where}: {what}.port {port} is listed twice")
        out.append(
            AppPort(
                port=port,
                name=_text(entry, "name", f"{where}: {what}"),
                name_zh=_text(entry, "name_zh", f"{where}: {what}", required=False),
                primary=bool(entry.get("primary", False)),
            )
        )
    if sum(p.primary for p in out) > 1:
        raise CatalogueError(f"{where}: only one port may be primary")
    return tuple(out)


def _health(data: Any, ports: tuple[AppPort, ...], where: str) -> HealthCheck:
    if not isinstance(data, dict):
        raise CatalogueError(f"{where}: health must give port, path and status")
    port = _port(data.get("port"), where, "health.port")
    if port not in {p.port for p in ports}:
        raise CatalogueError(f"{where}: health.port {port} is not one of the app's ports")
    path = str(data.get("path", ""))
    if not HEALTH_PATH.fullmatch(path) or ".." in path:
        raise CatalogueError(f"{where}: health.path {path!r} must be an absolute URL path")
    status = _int(data.get("status", 200), where, "health.status", 200, 399)
    return HealthCheck(port, path, status)


def _api(data: Any, ports: tuple[AppPort, ...], where: str) -> AppApi | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise CatalogueError(f"{where}: api must give kind, port and base_path")
    kind = str(data.get("kind", ""))
    if kind not in API_KINDS:
        raise CatalogueError(f"{where}: api.kind must be one of {list(API_KINDS)}")
    port = _port(data.get("port"), where, "api.port")
    if port not in {p.port for p in ports}:
        raise CatalogueError(f"{where}: api.port {port} is not one of the app's ports")
    base = str(data.get("base_path", "/v1"))
    if not re.fullmatch(r"/[a-z0-9]{1,16}", base):
        raise CatalogueError(f"{where}: api.base_path {base!r} must be like /v1")
    return AppApi(kind, port, base)


def _hub_ids(data: Any, where: str, key: str, *, required: bool) -> tuple[str, ...]:
    values = data.get(key) or []
    if not isinstance(values, list) or (required and not values):
        raise CatalogueError(f"{where}: {key} must list hub ids")
    out = tuple(str(v) for v in values)
    for hub_id in out:
        if not is_valid_hub_id(hub_id):
            raise CatalogueError(f"{where}: {key} {hub_id!r} is not a hub id")
    if len(set(out)) != len(out):
        raise CatalogueError(f"{where}: {key} lists a hub id twice")
    return out


def read_app(directory: Path) -> AiApp:
    """One app directory; ``CatalogueError`` names the file and the field it cannot use."""
    manifest = read_manifest(directory, "app")
    data, where = manifest.data, manifest.where
    slug = manifest.slug()
    category = _text(data, "category", where)
    if category not in CATEGORIES:
        raise CatalogueError(f"{where}: category must be one of {list(CATEGORIES)}")
    image = manifest.image()
    ports = _ports(data.get("ports"), where)
    files = manifest.files()
    env = manifest.env()
    return AiApp(
        slug=slug,
        category=category,
        name=_text(data, "name", where),
        name_zh=_text(data, "name_zh", where),
        summary=_text(data, "summary", where),
        summary_zh=_text(data, "summary_zh", where),
        image=image,
        models=_hub_ids(data, where, "models", required=True),
        datasets=_hub_ids(data, where, "datasets", required=False),
        gpus=_gpus(data.get("gpus"), where),
        command=_text(data, "command", where),
        ports=ports,
        health=_health(data.get("health"), ports, where),
        ready_seconds=_int(data.get("ready_seconds"), where, "ready_seconds", 1, MAX_READY_SECONDS),
        api=_api(data.get("api"), ports, where),
        directory=directory,
        files=files,
        env=env,
        order=_int(data.get("order", 100), where, "order", 0, 1000),
    )


def read_apps(root: Path = APPS_DIR) -> list[AiApp]:
    """Every app under ``root`` in its catalogue order; slugs are unique (their directories)."""
    return sorted(read_all(root, read_app), key=lambda a: (a.order, a.slug))


def check_references(
    app: AiApp, image_versions: set[str], model_ids: set[str], dataset_ids: set[str]
) -> None:
    """The app names catalogue entries that exist: ``CatalogueError`` with ``FILE: reason``."""
    where = str(app.directory / MANIFEST)
    if app.image not in image_versions:
        raise CatalogueError(f"{where}: image {app.image!r} is not an image version")
    for hub_id in app.models:
        if hub_id not in model_ids:
            raise CatalogueError(f"{where}: model {hub_id!r} is not in the catalogue")
    for hub_id in app.datasets:
        if hub_id not in dataset_ids:
            raise CatalogueError(f"{where}: dataset {hub_id!r} is not in the catalogue")


@lru_cache(maxsize=1)
def _shipped() -> tuple[AiApp, ...]:
    return tuple(read_apps())


def shipped_apps() -> list[AiApp]:
    return list(_shipped())


def get_app(slug: str) -> AiApp | None:
    return next((a for a in _shipped() if a.slug == slug), None)
