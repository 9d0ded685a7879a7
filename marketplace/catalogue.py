"""Read the shipped catalogue files (marketplace/data/) into plain records. No Django imports.

The CSVs hold facts copied from public sources (see data/ATTRIBUTION.md); this module adds only the
values the console derives: the slug, a size estimate where the source has none, and the gated flag
from data/licenses.yaml. `load_catalogue` writes these records to the database.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DATA_DIR = Path(__file__).resolve().parent / "data"
MODELS_CSV = DATA_DIR / "models.csv"
DATASETS_CSV = DATA_DIR / "datasets.csv"
LICENSES_YAML = DATA_DIR / "licenses.yaml"
IMAGES_YAML = DATA_DIR / "images.yaml"

MODEL = "model"
DATASET = "dataset"

# bf16 / fp16 weights: two bytes per parameter.
BYTES_PER_PARAM_ESTIMATE = 2

# A slug is what appears after /models/ or /datasets/ on a node: lower-case ASCII, digits, ., _, -,
# starting with a letter or digit, never "..". The mount validation (mounts.py) uses the same rule.
SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,159}$")
# A hub id: "name" or "publisher/name", each part as the Hugging Face Hub allows.
HUB_ID_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class CatalogueError(ValueError):
    """A catalogue file holds a row the console cannot use; the message names file and row."""


def is_valid_slug(slug: str) -> bool:
    return bool(SLUG_RE.fullmatch(slug)) and ".." not in slug


def is_valid_hub_id(hub_id: str) -> bool:
    parts = hub_id.split("/")
    return (
        1 <= len(parts) <= 2
        and all(HUB_ID_PART_RE.fullmatch(p) for p in parts)
        and not any(p in {".", ".."} or ".." in p for p in parts)
    )


def slug_for(hub_id: str) -> str:
    """`meta-llama/Llama-2-7b-hf` -> `meta-llama--llama-2-7b-hf` (unique: hub ids are unique
    case-insensitively, and `--` never occurs in a Hub repo name)."""
    if not is_valid_hub_id(hub_id):
        raise CatalogueError(f"not a hub id: {hub_id!r}")
    slug = hub_id.lower().replace("/", "--")
    if not is_valid_slug(slug):
        raise CatalogueError(f"hub id {hub_id!r} gives an unusable slug {slug!r}")
    return slug


def _split(value: str, sep: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v.strip() for v in value.split(sep) if v.strip()))


def _float(value: str, where: str) -> float | None:
    if not value.strip():
        return None
    try:
        number = float(value)
    except ValueError as exc:
        raise CatalogueError(f"{where}: not a number: {value!r}") from exc
    if number < 0:
        raise CatalogueError(f"{where}: negative: {value!r}")
    return number


@dataclass(frozen=True)
class LicenseRecord:
    key: str
    name: str
    url: str = ""
    gated: bool = False
    terms: str = ""


@dataclass(frozen=True)
class AssetRecord:
    kind: str  # MODEL or DATASET
    hub_id: str
    slug: str
    name: str
    publisher: str
    tasks: tuple[str, ...]
    modalities: tuple[str, ...]
    params_billion: float | None
    size_gb: float | None
    size_estimated: bool
    license: str  # "" = the source gives none
    source: str

    @property
    def task(self) -> str:
        return self.tasks[0] if self.tasks else ""


def estimate_size_gb(params_billion: float | None) -> float | None:
    """Weights on disk at bf16: parameters × 2 bytes, in 10^9 bytes."""
    if params_billion is None:
        return None
    return round(params_billion * BYTES_PER_PARAM_ESTIMATE, 3)


def read_assets(kind: str, path: Path | None = None) -> Iterator[AssetRecord]:
    """Yield one record per CSV row, with the derived values filled in."""
    if kind not in (MODEL, DATASET):
        raise CatalogueError(f"unknown asset kind {kind!r}")
    path = path or (MODELS_CSV if kind == MODEL else DATASETS_CSV)
    with path.open(newline="", encoding="utf-8") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            where = f"{path.name}:{line}"
            hub_id = row["hub_id"].strip()
            params = _float(row.get("params_billion", ""), where) if kind == MODEL else None
            size = _float(row.get("size_gb", ""), where)
            estimated = False
            if size is None and kind == MODEL:
                size = estimate_size_gb(params)
                estimated = size is not None
            publisher = row["publisher"].strip() or (hub_id.split("/")[0] if "/" in hub_id else "")
            yield AssetRecord(
                kind=kind,
                hub_id=hub_id,
                slug=slug_for(hub_id),
                name=row["name"].strip() or hub_id,
                publisher=publisher,
                tasks=_split(row["task"], ";"),
                modalities=_split(row["modality"], ","),
                params_billion=params,
                size_gb=size,
                size_estimated=estimated,
                license=row["license"].strip(),
                source=row["source"].strip(),
            )


def read_licenses(path: Path = LICENSES_YAML) -> dict[str, LicenseRecord]:
    raw: dict[str, dict[str, Any]] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return {
        key: LicenseRecord(
            key=key,
            name=str(spec.get("name") or key),
            url=str(spec.get("url") or ""),
            gated=bool(spec.get("gated", False)),
            terms=str(spec.get("terms") or "").strip(),
        )
        for key, spec in raw.items()
    }


def license_record(key: str, known: dict[str, LicenseRecord]) -> LicenseRecord:
    """The record for a license id; an id not in licenses.yaml is shown as itself, not gated."""
    if key in known:
        return known[key]
    url = key if key.startswith(("http://", "https://")) else ""
    return LicenseRecord(key=key, name=key, url=url)


@dataclass(frozen=True)
class Port:
    name: str
    port: int
    protocol: str = "tcp"


@dataclass(frozen=True)
class LaunchTemplate:
    command: str
    workdir: str
    ports: tuple[Port, ...]
    env: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "workdir": self.workdir,
            "ports": [{"name": p.name, "port": p.port, "protocol": p.protocol} for p in self.ports],
            "env": dict(self.env),
        }


@dataclass(frozen=True)
class ImageVersionRecord:
    slug: str
    framework_version: str
    cuda: str
    cudnn: str
    python: str
    container: str
    size_gb: float
    gpus: tuple[str, ...]
    contents: tuple[str, ...]
    layer: tuple[str, ...]
    recommended: bool
    launch: LaunchTemplate


@dataclass(frozen=True)
class ImageRecord:
    slug: str
    name: str
    framework: str
    homepage: str
    summary: str
    versions: tuple[ImageVersionRecord, ...]


# GPU model codes as the fleet names them (slices/fleets/*.yaml), and how people write them.
GPU_MODELS = ("RTX4090", "A800", "H800")
GPU_LABELS = {"RTX4090": "RTX 4090", "A800": "A800", "H800": "H800"}


def gpu_code(value: str) -> str:
    """``"RTX 4090"`` / ``"rtx4090"`` -> ``"RTX4090"``; "" for anything that is not a known card."""
    code = "".join(str(value).split()).upper()
    return code if code in GPU_MODELS else ""


# docker reference: [registry/]repo[:tag], lower-case repo path, no digest needed here.
CONTAINER_RE = re.compile(
    r"^(?:[a-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
)


def _launch(base: dict[str, Any], override: dict[str, Any] | None) -> LaunchTemplate:
    merged = dict(base)
    for key, value in (override or {}).items():
        if key == "env":
            merged["env"] = {**merged.get("env", {}), **value}
        else:
            merged[key] = value
    ports = tuple(
        Port(name=str(p["name"]), port=int(p["port"]), protocol=str(p.get("protocol", "tcp")))
        for p in merged.get("ports", [])
    )
    return LaunchTemplate(
        command=" ".join(str(merged.get("command", "")).split()),
        workdir=str(merged.get("workdir", "/workspace")),
        ports=ports,
        env={str(k): str(v) for k, v in merged.get("env", {}).items()},
    )


def read_images(path: Path = IMAGES_YAML) -> list[ImageRecord]:
    """Parse images.yaml, merging each image's launch template over the defaults, and validate."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    default_launch = raw.get("defaults", {}).get("launch", {})
    images: list[ImageRecord] = []
    seen: set[str] = set()
    for spec in raw["images"]:
        image_launch = _launch(default_launch, spec.get("launch")).as_dict()
        versions = []
        for v in spec["versions"]:
            slug = str(v["slug"])
            if not is_valid_slug(slug) or slug in seen:
                raise CatalogueError(f"image version slug {slug!r} is invalid or repeated")
            seen.add(slug)
            container = str(v["container"])
            if not CONTAINER_RE.fullmatch(container):
                raise CatalogueError(f"{slug}: not a container reference: {container!r}")
            gpus = tuple(gpu_code(g) for g in v["gpus"])
            if "" in gpus:
                raise CatalogueError(f"{slug}: unknown GPU models in {v['gpus']}")
            versions.append(
                ImageVersionRecord(
                    slug=slug,
                    framework_version=str(v["framework_version"]),
                    cuda=str(v["cuda"]),
                    cudnn=str(v.get("cudnn", "")),
                    python=str(v["python"]),
                    container=container,
                    size_gb=float(v["size_gb"]),
                    gpus=gpus,
                    contents=tuple(str(c) for c in v.get("contents", ())),
                    layer=tuple(str(c) for c in v.get("layer", ())),
                    recommended=bool(v.get("recommended", False)),
                    launch=_launch(image_launch, v.get("launch")),
                )
            )
        images.append(
            ImageRecord(
                slug=str(spec["slug"]),
                name=str(spec["name"]),
                framework=str(spec["framework"]),
                homepage=str(spec.get("homepage", "")),
                summary=" ".join(str(spec.get("summary", "")).split()),
                versions=tuple(versions),
            )
        )
    return images
