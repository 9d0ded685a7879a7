"""Read the shipped catalogue files (marketplace/data/) into plain records. No Django imports.

The CSVs hold facts copied from public sources (see data/ATTRIBUTION.md); this module adds only the
values the console derives: the slug, a size estimate where the source has none, and the gated flag
from data/licenses.yaml. `load_catalogue` writes these records to the database.

Besides the shared catalogue's two CSVs it reads three files of the same kind of facts:
``models_extra.csv`` / ``datasets_extra.csv`` (rows the shared catalogue lacks: the Chinese model
families and datasets), ``likes.csv`` (the Hub likes a source gives, the popularity the list is
ordered by) and ``descriptions.yaml`` (Chinese names and descriptions, matched by hub id).
It also holds the search tokenizer, so the document and the query are cut the same way.
"""

from __future__ import annotations

import csv
import fnmatch
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

DATA_DIR = Path(__file__).resolve().parent / "data"
MODELS_CSV = DATA_DIR / "models.csv"
DATASETS_CSV = DATA_DIR / "datasets.csv"
MODELS_EXTRA_CSV = DATA_DIR / "models_extra.csv"
DATASETS_EXTRA_CSV = DATA_DIR / "datasets_extra.csv"
LIKES_CSV = DATA_DIR / "likes.csv"
DESCRIPTIONS_YAML = DATA_DIR / "descriptions.yaml"
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


# Search: a word is a run of ASCII letters and digits, or a run of other letters (Chinese has no
# spaces: "通义千问" is one run and matches as a substring, so "千问" finds it too). A middle dot
# joins Chinese names ("书生·浦语"), so it is dropped rather than cutting the name in two.
_WORD_RUN = re.compile(r"[^\W_]+")
_SCRIPT_RUN = re.compile(r"[0-9a-z]+|[^\x00-\x7f]+")
_JOINERS = str.maketrans("", "", "·・‧•")
MAX_QUERY_TERMS = 8


def search_terms(text: str) -> list[str]:
    """``"Qwen2.5-7B 通义千问"`` -> ``["qwen2", "5", "7b", "通义千问"]``: lower-case, NFKC-folded
    (full-width ``Ｑｗｅｎ`` is ``qwen``), ASCII words split from runs of other scripts."""
    folded = unicodedata.normalize("NFKC", text).lower().translate(_JOINERS)
    return [t for run in _WORD_RUN.findall(folded) for t in _SCRIPT_RUN.findall(run)]


def search_document(names: list[str], descriptions: list[str]) -> str:
    """The distinct terms of an asset's names (hub id, name, Chinese name, publisher, tasks,
    modalities) and the words of its descriptions. Numbers and sizes count in names only: a
    description that mentions "7B and 13B" must not make the 7B model match "13b"."""
    terms = search_terms(" ".join(names))
    terms += [t for t in search_terms(" ".join(descriptions)) if not any(c.isdigit() for c in t)]
    return " ".join(dict.fromkeys(terms))


def query_terms(q: str) -> list[str]:
    """The distinct terms of a search box query (at most eight); each must match."""
    return list(dict.fromkeys(search_terms(q)))[:MAX_QUERY_TERMS]


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
    likes: int | None = None  # Hub likes, as a source gives them; None = unknown
    name_zh: str = ""
    description: str = ""
    description_zh: str = ""

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


@dataclass(frozen=True)
class Likes:
    likes: int
    source: str


def read_likes(path: Path = LIKES_CSV) -> dict[tuple[str, str], Likes]:
    """``(kind, hub id) -> Likes``: the Hub likes a public source recorded for an asset."""
    likes: dict[tuple[str, str], Likes] = {}
    if not path.exists():
        return likes
    with path.open(newline="", encoding="utf-8") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            where = f"{path.name}:{line}"
            key = (row["kind"].strip(), row["hub_id"].strip())
            if key[0] not in (MODEL, DATASET) or key in likes:
                raise CatalogueError(f"{where}: unknown kind or repeated hub id {key!r}")
            value = _float(row["likes"], where)
            if value is None or value != int(value):
                raise CatalogueError(f"{where}: likes must be a whole number: {row['likes']!r}")
            likes[key] = Likes(likes=int(value), source=row["source"].strip())
    return likes


@dataclass(frozen=True)
class Description:
    """Chinese name and descriptions for the assets whose hub id matches one of ``match``."""

    kind: str
    match: tuple[str, ...]  # hub ids or shell patterns ("Qwen/*"), case-insensitive
    name_zh: str  # "{name}" is replaced by the asset's name
    description: str
    description_zh: str
    source: str

    def matches(self, kind: str, hub_id: str) -> bool:
        hub = hub_id.lower()
        return kind == self.kind and any(fnmatch.fnmatchcase(hub, m.lower()) for m in self.match)


def read_descriptions(path: Path = DESCRIPTIONS_YAML) -> list[Description]:
    """The entries of descriptions.yaml, in file order (the first entry that matches wins)."""
    if not path.exists():
        return []
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    entries = []
    for n, spec in enumerate(raw, start=1):
        where = f"{path.name} entry {n}"
        kind = str(spec.get("kind", ""))
        match = spec.get("match") or []
        if kind not in (MODEL, DATASET) or not match or not spec.get("source"):
            raise CatalogueError(f"{where}: needs a kind, hub ids to match and a source")
        entries.append(
            Description(
                kind=kind,
                match=tuple(str(m) for m in ([match] if isinstance(match, str) else match)),
                name_zh=" ".join(str(spec.get("name_zh", "")).split()),
                description=" ".join(str(spec.get("description", "")).split()),
                description_zh=" ".join(str(spec.get("description_zh", "")).split()),
                source=" ".join(str(spec["source"]).split()),
            )
        )
    return entries


def _with_source(source: str, extra: str) -> str:
    parts = [p.strip() for p in source.split(" + ")]
    return source if extra in parts else f"{source} + {extra}"


def read_catalogue(
    kind: str,
    base: Path | None = None,
    extra: Path | None = None,
    likes_csv: Path = LIKES_CSV,
    descriptions_yaml: Path = DESCRIPTIONS_YAML,
) -> list[AssetRecord]:
    """Every shipped asset of ``kind``: the shared catalogue's rows, then the added rows, with the
    likes and the Chinese names and descriptions merged in. Each source used is named in the
    record's ``source`` (joined by `` + ``). A hub id in both files is an error."""
    if kind not in (MODEL, DATASET):
        raise CatalogueError(f"unknown asset kind {kind!r}")
    base = base or (MODELS_CSV if kind == MODEL else DATASETS_CSV)
    extra = extra or (MODELS_EXTRA_CSV if kind == MODEL else DATASETS_EXTRA_CSV)
    records = list(read_assets(kind, base))
    seen = {r.hub_id.lower() for r in records}
    if extra.exists():
        for rec in read_assets(kind, extra):
            if rec.hub_id.lower() in seen:
                raise CatalogueError(f"{extra.name}: {rec.hub_id} is already in {base.name}")
            seen.add(rec.hub_id.lower())
            records.append(rec)
    likes = read_likes(likes_csv)
    descriptions = read_descriptions(descriptions_yaml)
    merged = []
    for rec in records:
        changes: dict[str, Any] = {}
        found = likes.get((kind, rec.hub_id))
        if found is not None:
            changes["likes"] = found.likes
            changes["source"] = _with_source(rec.source, found.source)
        entry = next((d for d in descriptions if d.matches(kind, rec.hub_id)), None)
        if entry is not None:
            changes["name_zh"] = entry.name_zh.replace("{name}", rec.name)
            changes["description"] = entry.description
            changes["description_zh"] = entry.description_zh
            changes["source"] = _with_source(changes.get("source", rec.source), entry.source)
        merged.append(replace(rec, **changes) if changes else rec)
    return merged


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
