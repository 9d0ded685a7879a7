"""Marketplace actions other apps call: mount specifications for an order, license acceptance,
catalogue loading, and the fetchers that raise 404.

The ordering flow calls :func:`build_mount_specs` with the assets the user picked; it refuses
unknown or unlisted assets and gated assets whose license the user has not accepted, and returns the
read-only mounts the provisioning drivers apply (see ``marketplace/mounts.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlencode

from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Prefetch, Q
from django.http import Http404, QueryDict
from django.urls import reverse
from django.utils import timezone
from django.utils.text import Truncator
from django.utils.translation import gettext_noop

from console.errors import DomainError, ErrorCode
from console.ids import parse_uuid
from console.loading import LoadReport, upsert
from console.retries import TRANSIENT_ERRORS
from console.tenancy import user_of
from marketplace import catalogue, mounts
from marketplace.choices import AssetKind
from marketplace.models import (
    GENERIC_LICENSE_NAMES,
    Asset,
    Image,
    ImageVersion,
    License,
    LicenseAcceptance,
    pack,
)
from marketplace.mounts import MountSpec
from marketplace.querysets import FACT_FIELDS

logger = logging.getLogger(__name__)

# The order form belongs to the ordering issue (slices); these query strings preset it.
ORDER_FORM_PATH = "/instances/new/"
FACETS_CACHE_TIMEOUT = 300
# pg_advisory_xact_lock key serialising catalogue loads (any constant unique to this purpose).
LOAD_LOCK_KEY = 0x6D6B745F6C6F6164  # "mkt_load"


class MountRefused(DomainError):  # noqa: N818 - reads as a domain event: "mount refused"
    """The requested assets cannot be mounted; ``code`` says why, ``assets`` which ones.

    403 when a license must be accepted first, 400 otherwise; ``assets`` travels in the API body.
    """

    def __init__(
        self, code: ErrorCode, template: str, assets: Iterable[str] = (), **params: Any
    ) -> None:
        status = 403 if code == ErrorCode.LICENSE_NOT_ACCEPTED else 400
        super().__init__(template, code=code, http_status=status, assets=list(assets), **params)

    @property
    def assets(self) -> list[str]:
        return cast(list[str], self.params["assets"])


UNKNOWN_ASSET = ErrorCode.UNKNOWN_ASSET
LICENSE_NOT_ACCEPTED = ErrorCode.LICENSE_NOT_ACCEPTED
INVALID_MOUNT = ErrorCode.INVALID_MOUNT


# --- fetchers -----------------------------------------------------------------------------------
def get_listed_asset(kind: str, slug: str) -> Asset:
    try:
        return Asset.objects.listed().select_related("license").get(kind=kind, slug=slug)
    except Asset.DoesNotExist:
        raise Http404 from None


def get_asset_by_hub_id(kind: str, hub_id: str) -> Asset:
    """A listed asset by its hub id (stable across databases, unlike public ids): what a recipe
    such as the one-click demo names, e.g. ``("model", "meta-llama/Llama-2-7b-hf")``."""
    try:
        return Asset.objects.listed().select_related("license").get(kind=kind, hub_id=hub_id)
    except Asset.DoesNotExist:
        raise Http404 from None


def assets_by_hub_id(kind: str, hub_ids: Iterable[str]) -> dict[str, Asset]:
    """The listed assets of ``kind`` among ``hub_ids``, by hub id, in one query (an app's page
    names several models)."""
    wanted = list(hub_ids)
    found = Asset.objects.listed().select_related("license").filter(kind=kind, hub_id__in=wanted)
    return {a.hub_id: a for a in found}


def get_license(public_id: Any) -> License:
    pk = parse_uuid(public_id)
    if pk is None:
        raise Http404
    try:
        return License.objects.get(public_id=pk)
    except License.DoesNotExist:
        raise Http404 from None


def get_listed_image(slug: str) -> Image:
    try:
        return Image.objects.listed().get(slug=slug)
    except Image.DoesNotExist:
        raise Http404 from None


def image_software(ref: str) -> tuple[tuple[str, str], ...]:
    """What an image version holds, as (name, version) pairs: ``framework`` (its name and
    version), ``python``, ``cuda`` and ``torch`` (from its contents, "PyTorch 2.1.2"); () for no
    image or one no longer listed. The simulated shell answers ``python --version`` from it."""
    if not ref:
        return ()
    version = (
        ImageVersion.objects.filter(slug=str(ref))
        .select_related("image")
        .only("framework_version", "python", "cuda", "contents", "image__framework")
        .first()
    )
    if version is None:
        return ()
    pairs = [
        ("framework", f"{version.image.framework} {version.framework_version}".strip()),
        ("python", version.python),
        ("cuda", version.cuda),
    ]
    for item in version.contents or []:
        name, _, number = str(item).partition(" ")
        if name == "PyTorch" and number:
            pairs.append(("torch", number.split()[0]))
            break
    return tuple((k, v) for k, v in pairs if v)


def get_image_version(ref: str) -> ImageVersion:
    """A listed image version by slug (what ``?image=`` carries) or public id; 404 otherwise."""
    qs = ImageVersion.objects.listed().select_related("image")
    pk = parse_uuid(ref)
    try:
        return qs.get(public_id=pk) if pk else qs.get(slug=str(ref))
    except ImageVersion.DoesNotExist:
        raise Http404 from None


class ImageRefused(DomainError):  # noqa: N818 - reads as a domain event: "image refused"
    """An order's ``image`` names no listed image version or family (a 400 on the field)."""

    code = ErrorCode.INVALID
    http_status = 400
    field = "image"


def _version_key(version: ImageVersion) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Newer first when sorted descending: the framework's version, then CUDA's, then Python's,
    compared as numbers ("2.10" after "2.9"; "core_r0.8.0" after "core_r0.5.0")."""

    def numbers(text: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", text or ""))

    return numbers(version.framework_version), numbers(version.cuda), numbers(version.python)


def resolve_image_version(ref: str, gpu_model: str) -> ImageVersion:
    """What an order's ``image`` names: a listed version's public id or slug, or a listed image
    family's slug (``pytorch``, as ``GET /api/v1/images/`` lists them), which means the family's
    newest listed version that supports ``gpu_model`` (a fleet code or product name).

    Raises :class:`ImageRefused` (field ``image``) when nothing listed matches, or the family has
    no version for that card. A version named exactly is returned even if it does not support the
    card: the order says so with its own message.
    """
    ref = (ref or "").strip()
    try:
        return get_image_version(ref)
    except Http404:
        pass
    family = Image.objects.listed().filter(slug=ref[:64]).first()
    if family is None:
        raise ImageRefused(
            gettext_noop(
                "Unknown image %(image)s: give an image version's slug or id, or an image's slug "
                "(GET /api/v1/images/)."
            ),
            image=ref[:120],
        )
    versions = [
        v
        for v in ImageVersion.objects.listed().filter(image=family).select_related("image")
        if v.supports(gpu_model)
    ]
    if not versions:
        raise ImageRefused(
            gettext_noop("The image %(image)s has no version for %(gpu_model)s."),
            image=family.slug,
            gpu_model=gpu_model,
        )
    # Newest by version numbers; among equals, the catalogue's order (the first listed).
    return max(sorted(versions, key=lambda v: v.position), key=_version_key)


# --- licenses -----------------------------------------------------------------------------------
def has_accepted_license(user: Any, license: License | None) -> bool:
    user = user_of(user)  # a licence is accepted by a person, whichever team they act in
    if license is None or not license.requires_acceptance:
        return True
    if not getattr(user, "is_authenticated", False):
        return False
    return LicenseAcceptance.objects.filter(user=user, license=license).exists()


def accepted_license_ids(user: Any) -> set[int]:
    user = user_of(user)
    if not getattr(user, "is_authenticated", False):
        return set()
    return set(LicenseAcceptance.objects.filter(user=user).values_list("license_id", flat=True))


@transaction.atomic
def accept_license(user: Any, license: License) -> tuple[LicenseAcceptance, bool]:
    user = user_of(user)
    """Record that ``user`` accepts ``license``; accepting again is a no-op. Returns (row, created)."""
    existing = LicenseAcceptance.objects.filter(user=user, license=license).first()
    if existing is not None:
        return existing, False
    try:
        # A double click races two requests here; the unique constraint lets one win.
        with transaction.atomic():
            row = LicenseAcceptance.objects.create(
                user=user, license=license, license_name=license.name, license_url=license.url
            )
    except IntegrityError:
        return LicenseAcceptance.objects.get(user=user, license=license), False
    logger.info("user %s accepted license %s", user.pk, license.key)
    return row, True


# --- mounts -------------------------------------------------------------------------------------
def build_mount_specs(user: Any, asset_ids: Iterable[Any]) -> list[MountSpec]:
    """The read-only mounts for the assets a user picked at order time.

    ``asset_ids`` are asset public ids (UUIDs or their strings). Raises :class:`MountRefused` with
    code ``unknown_asset`` (not in the catalogue or unlisted), ``license_not_accepted`` (a gated
    license the user has not accepted; ``assets`` names them) or ``invalid_mount``.
    """
    wanted = list(asset_ids)
    if len(wanted) > mounts.MAX_MOUNTS:
        # Refused before touching the database: a huge id list is a mistake or an attack.
        raise MountRefused(
            INVALID_MOUNT,
            gettext_noop("At most %(max)d assets can be mounted on one instance."),
            field="assets",
            max=mounts.MAX_MOUNTS,
        )
    ids = {parse_uuid(a) for a in wanted}
    if None in ids:
        raise MountRefused(
            UNKNOWN_ASSET,
            gettext_noop("Not an asset id."),
            [str(a) for a in wanted],
            field="assets",
        )
    assets = list(
        Asset.objects.listed()
        .filter(public_id__in=ids)
        .select_related("license")
        .only("public_id", "kind", "hub_id", "slug", "license__requires_acceptance", "license__key")
    )
    missing = ids - {a.public_id for a in assets}
    if missing:
        raise MountRefused(
            UNKNOWN_ASSET,
            gettext_noop("Some assets are not in the catalogue."),
            sorted(map(str, missing)),
            field="assets",
        )
    gated = [a for a in assets if a.gated]
    if gated:
        accepted = accepted_license_ids(user)
        refused = [a for a in gated if a.license_id not in accepted]
        if refused:
            names = ", ".join(sorted({a.license.key for a in refused}))
            raise MountRefused(
                LICENSE_NOT_ACCEPTED,
                gettext_noop("Accept the license first (%(licenses)s)."),
                sorted(a.hub_id for a in refused),
                licenses=names,
            )
    try:
        return mounts.plan_mounts(a.as_ref() for a in assets)
    except mounts.MountError as exc:
        # The pure module's reason is English and carries paths: a parameter, not a template.
        raise MountRefused(INVALID_MOUNT, "%(reason)s", field="assets", reason=str(exc)) from exc


def order_form_url(image: ImageVersion | None = None, assets: Iterable[Asset] = ()) -> str:
    """The order form, preset: ``/instances/new/?image=<version slug>&assets=<id>,<id>``."""
    params: dict[str, str] = {}
    if image is not None:
        params["image"] = image.slug
    asset_ids = [str(a.public_id) for a in assets]
    if asset_ids:
        params["assets"] = ",".join(asset_ids)
    return f"{ORDER_FORM_PATH}?{urlencode(params)}" if params else ORDER_FORM_PATH


# --- search ------------------------------------------------------------------------------------
# The filters both list pages share: they travel when a search moves to the other kind's list.
# Tasks and modalities differ between models and datasets, parameters exist for models only.
SHARED_FILTERS = ("q", "publisher", "license", "size_min", "size_max", "gated")
LIST_URL_NAMES: dict[str, str] = {
    AssetKind.MODEL: "marketplace:model-list",
    AssetKind.DATASET: "marketplace:dataset-list",
}


def other_kind_list_url(kind: str, params: QueryDict) -> str:
    """Where a search belongs when it names the other kind: "中文 对话 数据集" typed on the models
    list is the datasets list with the same query (a kind word filters, it is not text, so on the
    models list it would find nothing). "" when the query names no kind, or this one."""
    named = catalogue.parse_query(str(params.get("q", ""))[:100]).kind
    if not named or named == kind:
        return ""
    kept = QueryDict(mutable=True)
    for key in SHARED_FILTERS:
        if params.get(key):
            kept[key] = str(params.get(key))
    sort = str(params.get("sort", ""))
    if sort and "params" not in sort:
        kept["sort"] = sort
    return f"{reverse(LIST_URL_NAMES[named])}?{kept.urlencode()}"


# --- the order form's asset picker --------------------------------------------------------------
PICKER_LIMIT = 10


@dataclass
class AssetPicker:
    """What ``templates/marketplace/_asset_picker.html`` shows: the assets already picked (kept
    across searches) and up to ``PICKER_LIMIT`` matches of the search, each with its gate."""

    q: str
    selected: list[Asset]
    results: list[Asset]
    accepted_license_ids: set[int]

    def can_mount(self, asset: Asset) -> bool:
        return not asset.gated or asset.license_id in self.accepted_license_ids


def asset_picker(user: Any, selected_ids: Iterable[Any] = (), q: str = "") -> AssetPicker:
    """The picker's state for ``user`` (three queries at most, whatever the number of assets).

    Unknown or malformed selected ids are dropped silently here; ``build_mount_specs`` is the gate
    that refuses them at order time.
    """
    ids = [pk for pk in (parse_uuid(a) for a in list(selected_ids)[: mounts.MAX_MOUNTS]) if pk]
    base = Asset.objects.listed().for_list()
    selected = list(base.filter(public_id__in=ids).order_by("kind", "name")) if ids else []
    results: list[Asset] = []
    if q.strip():
        results = list(base.search(q).exclude(public_id__in=ids).sorted_by("name")[:PICKER_LIMIT])
    accepted = accepted_license_ids(user) if any(a.gated for a in [*selected, *results]) else set()
    return AssetPicker(q=q, selected=selected, results=results, accepted_license_ids=accepted)


# --- images -------------------------------------------------------------------------------------
def list_images(gpu: str = "") -> list[Image]:
    """Listed images with their listed versions (two queries); with ``gpu``, only the versions
    that support that card, and only images that have one."""
    versions = ImageVersion.objects.filter(is_listed=True).order_by("position")
    images = list(Image.objects.listed().prefetch_related(Prefetch("versions", queryset=versions)))
    shown = []
    for image in images:
        image.shown_versions = [v for v in image.versions.all() if not gpu or v.supports(gpu)]
        if not image.shown_versions:
            continue
        image.featured_version = next(
            (v for v in image.shown_versions if v.recommended), image.shown_versions[0]
        )
        shown.append(image)
    return shown


# --- facets (filter choices) --------------------------------------------------------------------
@dataclass
class Facets:
    tasks: list[str] = field(default_factory=list)
    modalities: list[str] = field(default_factory=list)
    publishers: list[str] = field(default_factory=list)
    licenses: list[tuple[str, str]] = field(default_factory=list)  # (key, name)


def _facets_key(kind: str) -> str:
    return f"marketplace:facets:v1:{kind}"


def catalogue_facets(kind: str) -> Facets:
    """The values the filter controls offer, cached (one query on a miss)."""

    def compute() -> Facets:
        tasks: set[str] = set()
        modalities: set[str] = set()
        publishers: set[str] = set()
        licenses: dict[str, str] = {}
        rows = (
            Asset.objects.listed()
            .of_kind(kind)
            .values_list("tasks", "modalities", "publisher", "license__key", "license__name")
        )
        for task_col, modality_col, publisher, key, name in rows:
            tasks.update(t for t in task_col.split(";") if t)
            modalities.update(m for m in modality_col.split(",") if m)
            if publisher:
                publishers.add(publisher)
            if key:
                licenses[key] = Truncator(name or key).chars(48)
        return Facets(
            tasks=sorted(tasks),
            modalities=sorted(modalities),
            publishers=sorted(publishers, key=str.lower),
            licenses=sorted(licenses.items(), key=lambda kv: kv[1].lower()),
        )

    try:
        facets = cast(Facets, cache.get_or_set(_facets_key(kind), compute, FACETS_CACHE_TIMEOUT))
    except TRANSIENT_ERRORS:  # the cache (Redis) is down: one query, not a 503 catalogue
        facets = compute()
    # Cached for every language: the catch-all licences' words are translated on the way out.
    licenses = [
        (key, str(GENERIC_LICENSE_NAMES[key]) if key in GENERIC_LICENSE_NAMES else name)
        for key, name in facets.licenses
    ]
    return dataclasses.replace(facets, licenses=sorted(licenses, key=lambda kv: kv[1].lower()))


def forget_facets() -> None:
    cache.delete_many([_facets_key(k) for k in AssetKind.values])


# --- loading ------------------------------------------------------------------------------------
_ASSET_FIELDS = (
    "slug",
    "name",
    "publisher",
    *FACT_FIELDS,
    "license_id",
    "source",
    "name_zh",
    "description",
    "description_zh",
    "likes",
    "search_document",
)


def _sync_licenses(keys: set[str], report: LoadReport) -> dict[str, License]:
    known = catalogue.read_licenses()
    existing = {lic.key: lic for lic in License.objects.all()}
    for key in sorted(keys | set(known)):
        record = catalogue.license_record(key, known)
        lic = existing.get(key)
        if lic is None:
            existing[key] = License.objects.create(
                key=key,
                name=record.name[:200],
                url=record.url[:500],
                requires_acceptance=record.gated,
                terms=record.terms,
            )
            report.add("licenses", "created")
            continue
        # Fail safe: a license gated in licenses.yaml is gated after every load; one an operator
        # gated in the admin stays gated. Un-gating a shipped gated license means editing the file.
        changes = {
            "name": record.name[:200] if key in known else lic.name,
            "url": record.url[:500] if key in known else lic.url,
            "terms": record.terms if key in known else lic.terms,
            "requires_acceptance": lic.requires_acceptance or record.gated,
        }
        if any(getattr(lic, k) != v for k, v in changes.items()):
            for k, v in changes.items():
                setattr(lic, k, v)
            lic.save()
            report.add("licenses", "updated")
        else:
            report.add("licenses", "unchanged")
    return existing


def _sync_assets(
    kind: str,
    records: list[catalogue.AssetRecord],
    licenses: dict[str, License],
    report: LoadReport,
) -> None:
    now = timezone.now()
    existing = {a.hub_id: a for a in Asset.objects.of_kind(kind)}
    new: list[Asset] = []
    changed: list[Asset] = []
    what = f"{kind}s"
    for rec in records:
        lic = licenses.get(rec.license) if rec.license else None
        candidate = Asset(
            kind=kind,
            hub_id=rec.hub_id,
            slug=rec.slug,
            name=rec.name[:200],
            publisher=rec.publisher[:100],
            tasks=pack(list(rec.tasks), ";"),
            modalities=pack(list(rec.modalities), ","),
            params_billion=rec.params_billion,
            size_gb=rec.size_gb,
            size_estimated=rec.size_estimated,
            license=lic,
            source=rec.source[:400],
            name_zh=rec.name_zh[:200],
            description=rec.description,
            description_zh=rec.description_zh,
            likes=rec.likes,
        )
        candidate.normalize()
        current = existing.get(rec.hub_id)
        if current is None:
            new.append(candidate)
            continue
        if any(getattr(current, f) != getattr(candidate, f) for f in _ASSET_FIELDS):
            for f in _ASSET_FIELDS:
                setattr(current, f, getattr(candidate, f))
            current.updated_at = now
            changed.append(current)
        else:
            report.add(what, "unchanged")
    Asset.objects.bulk_create(new, batch_size=500)
    Asset.objects.bulk_update(changed, [*_ASSET_FIELDS, "updated_at"], batch_size=500)
    report.add(what, "created", len(new))
    report.add(what, "updated", len(changed))


def _sync_images(report: LoadReport) -> None:
    for position, rec in enumerate(catalogue.read_images()):
        image, outcome = upsert(
            Image,
            {"slug": rec.slug},
            {
                "name": rec.name,
                "framework": rec.framework,
                "homepage": rec.homepage,
                "summary": rec.summary,
                "position": position,
            },
        )
        report.add("images", outcome)
        for vpos, v in enumerate(rec.versions):
            _, outcome = upsert(
                ImageVersion,
                {"slug": v.slug},
                {
                    "image": image,
                    "framework_version": v.framework_version,
                    "cuda": v.cuda,
                    "cudnn": v.cudnn,
                    "python": v.python,
                    "container": v.container,
                    "layer": list(v.layer),
                    "size_gb": v.size_gb,
                    "gpu_models": list(v.gpus),
                    "contents": list(v.contents),
                    "launch": v.launch.as_dict(),
                    "recommended": v.recommended,
                    "position": vpos,
                },
            )
            report.add("image versions", outcome)


@transaction.atomic
def load_catalogue() -> LoadReport:
    """Load the shipped catalogue (marketplace/data/) into the database. Idempotent.

    Rows are matched by (kind, hub id) and image/version slug; facts from the files overwrite the
    stored ones; operator choices stay: ``is_listed``, and a license an operator gated stays gated
    (a license licenses.yaml gates is gated again, whatever the admin says).
    Assets an operator added in the admin are left alone.
    """
    report = LoadReport()
    if connection.vendor == "postgresql":
        # Two processes loading at once (two web servers running demo_setup at start) queue here
        # instead of racing on the unique constraints; the second then finds nothing to do.
        # SQLite needs no lock: its IMMEDIATE transactions already serialise writers.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOAD_LOCK_KEY])
    asset_records = {
        kind: catalogue.read_catalogue(kind) for kind in (AssetKind.MODEL, AssetKind.DATASET)
    }
    keys = {r.license for recs in asset_records.values() for r in recs if r.license}
    licenses = _sync_licenses(keys, report)
    for kind, records in asset_records.items():
        _sync_assets(kind, records, licenses, report)
    _sync_images(report)
    if connection.vendor == "postgresql":
        # Fresh statistics after a bulk load, so the planner picks the right indexes at once.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE marketplace_asset")
    transaction.on_commit(forget_facets)
    return report


def catalogue_counts() -> dict[str, int]:
    """Listed models, datasets and images, for summaries (two queries)."""
    counts = Asset.objects.filter(is_listed=True).aggregate(
        models=Count("pk", filter=Q(kind=AssetKind.MODEL)),
        datasets=Count("pk", filter=Q(kind=AssetKind.DATASET)),
    )
    counts["images"] = Image.objects.filter(is_listed=True).count()
    return counts
