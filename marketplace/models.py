"""The marketplace catalogue: public models and datasets (assets), their licenses, one-click images.

Assets and images are shared by all users (the catalogue is public); the only per-user row is the
``LicenseAcceptance`` that unlocks a gated license for mounting.
"""

from __future__ import annotations

import uuid
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.urls import get_script_prefix, reverse
from django.utils.translation import get_language
from django.utils.translation import gettext_lazy as _

from marketplace import catalogue, mounts
from marketplace.choices import AssetKind
from marketplace.querysets import AssetQuerySet, ImageQuerySet, ImageVersionQuerySet


def pack(values: list[str] | tuple[str, ...], sep: str) -> str:
    """``["a", "b"]`` -> ``";a;b;"``: a delimited column where ``contains(";a;")`` is an exact match."""
    cleaned = [v.strip() for v in values if v and v.strip()]
    return f"{sep}{sep.join(cleaned)}{sep}" if cleaned else ""


def unpack(value: str, sep: str) -> list[str]:
    return [v for v in value.split(sep) if v]


_SLUG_MARK = "00slug00"


@lru_cache(maxsize=16)
def _detail_url_template(kind: str, script_prefix: str) -> str:
    name = "marketplace:model-detail" if kind == AssetKind.MODEL else "marketplace:dataset-detail"
    return reverse(name, args=[_SLUG_MARK])


def validate_hub_id(value: str) -> None:
    if not catalogue.is_valid_hub_id(value):
        raise ValidationError(
            _("A hub id is \"name\" or \"publisher/name\": letters, digits, '.', '_', '-'."),
            code="invalid",
        )


def validate_asset_slug(value: str) -> None:
    if not catalogue.is_valid_slug(value):
        raise ValidationError(
            _(
                "A slug is lower-case letters, digits, '.', '_' and '-' (no '..'), starting with a letter or digit."
            ),
            code="invalid",
        )


def validate_container(value: str) -> None:
    if not catalogue.CONTAINER_RE.fullmatch(value):
        raise ValidationError(
            _(
                "A container reference is [registry/]repository:tag, e.g. pytorch/pytorch:2.1.2-cuda12.1-cudnn8-devel."
            ),
            code="invalid",
        )


# Licences whose name is a description, not a proper name (licenses.yaml's English stays the
# stored name, as the sources give it).
GENERIC_LICENSE_NAMES = {
    "other": _("Other (see the model's page on the source hub)"),
    "unknown": _("Unknown (see the model's page on the source hub)"),
}


class License(models.Model):
    """A license as the sources name it (SPDX-style id or URL); gated ones need acceptance."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    key = models.CharField(_("license id"), max_length=300, unique=True)
    name = models.CharField(_("name"), max_length=200)
    url = models.URLField(_("license text"), max_length=500, blank=True)
    requires_acceptance = models.BooleanField(
        _("gated"),
        default=False,
        db_index=True,
        help_text=_("Users must accept this license once before mounting assets under it."),
    )
    terms = models.TextField(_("summary of terms"), blank=True)

    class Meta:
        verbose_name = _("license")
        verbose_name_plural = _("licenses")
        ordering = ("key",)

    def __str__(self) -> str:
        return self.display_name

    def get_absolute_url(self) -> str:
        return reverse("marketplace:license-detail", args=[self.public_id])

    @property
    def display_name(self) -> str:
        """The name in the current language: licences are proper names ("Apache License 2.0"),
        except the catch-all ones, which are words and are translated."""
        generic = GENERIC_LICENSE_NAMES.get(self.key)
        return str(generic) if generic is not None else self.name or self.key


class Asset(models.Model):
    """A public model or dataset, cached once on the parallel file system and mountable read-only."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    kind = models.CharField(_("kind"), max_length=16, choices=AssetKind.choices)
    hub_id = models.CharField(_("hub id"), max_length=200, validators=[validate_hub_id])
    slug = models.CharField(
        _("slug"),
        max_length=160,
        validators=[validate_asset_slug],
        help_text=_("Mounted at /models/<slug> or /datasets/<slug>."),
    )
    name = models.CharField(_("name"), max_length=200)
    publisher = models.CharField(_("publisher"), max_length=100, blank=True)
    task = models.CharField(_("task"), max_length=64, blank=True, help_text=_("Primary task."))
    tasks = models.CharField(
        _("tasks"), max_length=400, blank=True, help_text=_("All tasks, as ;task-a;task-b;")
    )
    modalities = models.CharField(
        _("modalities"), max_length=100, blank=True, help_text=_("As ,text,image,")
    )
    params_billion = models.FloatField(_("parameters (billions)"), null=True, blank=True)
    size_gb = models.FloatField(_("size on disk (GB)"), null=True, blank=True)
    size_estimated = models.BooleanField(
        _("size is an estimate"),
        default=False,
        help_text=_("Estimated as parameters × 2 bytes (bf16) where the source gives no size."),
    )
    license = models.ForeignKey(
        License,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="assets",
        verbose_name=_("license"),
    )
    source = models.CharField(_("source of the facts"), max_length=400)
    name_zh = models.CharField(_("Chinese name"), max_length=200, blank=True)
    description = models.TextField(_("description (English)"), blank=True)
    description_zh = models.TextField(_("description (Chinese)"), blank=True)
    likes = models.PositiveIntegerField(
        _("likes on the hub"),
        null=True,
        blank=True,
        help_text=_("As the source recorded them; the list is ordered by them when not searching."),
    )
    is_listed = models.BooleanField(
        _("listed"), default=True, help_text=_("Unlisted assets are hidden and cannot be mounted.")
    )
    search_document = models.TextField(editable=False, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = AssetQuerySet.as_manager()

    class Meta:
        verbose_name = _("asset")
        verbose_name_plural = _("assets")
        ordering = ("kind", "name")
        constraints = (
            models.UniqueConstraint(fields=("kind", "hub_id"), name="marketplace_asset_hub_id"),
            models.UniqueConstraint(fields=("kind", "slug"), name="marketplace_asset_slug"),
        )
        indexes = (
            models.Index(fields=("kind", "is_listed", "name"), name="mkt_asset_name"),
            models.Index(fields=("kind", "is_listed", "size_gb"), name="mkt_asset_size"),
            models.Index(fields=("kind", "is_listed", "params_billion"), name="mkt_asset_params"),
            models.Index(fields=("kind", "publisher"), name="mkt_asset_publisher"),
            models.Index(fields=("kind", "task"), name="mkt_asset_task"),
        )

    def __str__(self) -> str:
        return self.hub_id

    def save(self, *args: object, **kwargs: object) -> None:
        self.normalize()
        if kwargs.get("update_fields") is not None:
            fields = {*kwargs["update_fields"], "search_document", "tasks", "modalities", "task"}  # type: ignore[misc]
            kwargs["update_fields"] = fields
        super().save(*args, **kwargs)

    def get_absolute_url(self) -> str:
        # A list page links 24 assets; one reverse() per kind and script prefix is enough.
        return _detail_url_template(self.kind, get_script_prefix()).replace(_SLUG_MARK, self.slug)

    def normalize(self) -> None:
        """Keep the delimited columns and the search document consistent (the admin edits them
        as plain text: ``a;b`` or ``text,image`` are accepted)."""
        tasks = unpack(self.tasks.replace(",", ";"), ";") or ([self.task] if self.task else [])
        self.tasks = pack(tasks, ";")
        self.task = tasks[0] if tasks else ""
        self.modalities = pack(unpack(self.modalities.replace(";", ","), ","), ",")
        self.search_document = self.build_search_document()

    def build_search_document(self) -> str:
        """The search terms of every field a person may search by, in both languages
        (``catalogue.asset_search_document``: the query is cut the same way, and each of its
        clauses must be a substring of this document), with the task, modality and language marks."""
        return catalogue.asset_search_document(
            hub_id=self.hub_id,
            name=self.name,
            name_zh=self.name_zh,
            publisher=self.publisher,
            tasks=unpack(self.tasks, ";") or ([self.task] if self.task else []),
            modalities=unpack(self.modalities, ","),
            description=self.description,
            description_zh=self.description_zh,
        )

    @property
    def chinese_ui(self) -> bool:
        return (get_language() or "").lower().startswith("zh")

    @property
    def display_name(self) -> str:
        """The Chinese name in the Chinese UI where there is one, else the source's name."""
        return self.name_zh if self.name_zh and self.chinese_ui else self.name

    @property
    def display_description(self) -> str:
        """The description in the reader's language; none rather than the other language."""
        return self.description_zh if self.chinese_ui else self.description

    @property
    def is_model(self) -> bool:
        return self.kind == AssetKind.MODEL

    @property
    def gated(self) -> bool:
        return bool(self.license_id and self.license.requires_acceptance)

    @property
    def task_list(self) -> list[str]:
        return unpack(self.tasks, ";") or ([self.task] if self.task else [])

    @property
    def modality_list(self) -> list[str]:
        return unpack(self.modalities, ",")

    def as_ref(self) -> mounts.AssetRef:
        return mounts.AssetRef(kind=self.kind, hub_id=self.hub_id, slug=self.slug)

    @property
    def source_path(self) -> str:
        return mounts.source_path(self.kind, self.hub_id)

    @property
    def mount_point(self) -> str:
        return mounts.mount_point(self.kind, self.slug)


class LicenseAcceptance(models.Model):
    """A user accepted a gated license (once); required before mounting assets under it."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="license_acceptances"
    )
    license = models.ForeignKey(License, on_delete=models.PROTECT, related_name="acceptances")
    accepted_at = models.DateTimeField(auto_now_add=True)
    # What the user saw when accepting, kept even if an operator edits the license later.
    license_name = models.CharField(max_length=200)
    license_url = models.URLField(max_length=500, blank=True)

    class Meta:
        verbose_name = _("license acceptance")
        verbose_name_plural = _("license acceptances")
        ordering = ("-accepted_at",)
        constraints = (
            models.UniqueConstraint(fields=("user", "license"), name="marketplace_acceptance_once"),
        )

    def __str__(self) -> str:
        return f"{self.user} accepted {self.license_name}"


class Image(models.Model):
    """A one-click image family (PyTorch, DeepSpeed, Megatron-LM, Colossal-AI)."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    slug = models.SlugField(_("slug"), max_length=64, unique=True)
    name = models.CharField(_("name"), max_length=100)
    framework = models.CharField(_("framework"), max_length=100)
    homepage = models.URLField(_("homepage"), blank=True)
    summary = models.TextField(_("summary"), blank=True)
    position = models.PositiveSmallIntegerField(_("position"), default=0)
    is_listed = models.BooleanField(_("listed"), default=True)

    objects = ImageQuerySet.as_manager()

    class Meta:
        verbose_name = _("image")
        verbose_name_plural = _("images")
        ordering = ("position", "name")

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("marketplace:image-detail", args=[self.slug])


class ImageVersion(models.Model):
    """One launchable build: framework, CUDA and Python versions, container and launch template."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    image = models.ForeignKey(Image, on_delete=models.CASCADE, related_name="versions")
    slug = models.CharField(_("slug"), max_length=100, unique=True)
    framework_version = models.CharField(_("framework version"), max_length=50)
    cuda = models.CharField(_("CUDA"), max_length=20)
    cudnn = models.CharField(_("cuDNN"), max_length=20, blank=True)
    python = models.CharField(_("Python"), max_length=20)
    container = models.CharField(
        _("container image"), max_length=300, validators=[validate_container]
    )
    layer = models.JSONField(
        _("installed on top"),
        default=list,
        blank=True,
        help_text=_("What the console's mirror installs on the public image."),
    )
    size_gb = models.FloatField(_("size (GB, approximate)"))
    gpu_models = models.JSONField(_("supported GPU models"), default=list)
    contents = models.JSONField(_("contents"), default=list, blank=True)
    launch = models.JSONField(
        _("launch template"), default=dict, help_text=_("command, workdir, ports, env")
    )
    recommended = models.BooleanField(_("recommended"), default=False)
    position = models.PositiveSmallIntegerField(_("position"), default=0)
    is_listed = models.BooleanField(_("listed"), default=True)

    objects = ImageVersionQuerySet.as_manager()

    class Meta:
        verbose_name = _("image version")
        verbose_name_plural = _("image versions")
        ordering = ("image", "position")

    def __str__(self) -> str:
        return (
            f"{self.image.name} {self.framework_version} (CUDA {self.cuda}, Python {self.python})"
        )

    def clean(self) -> None:
        models_ok = isinstance(self.gpu_models, list) and bool(self.gpu_models)
        if not models_ok or set(self.gpu_models) - set(catalogue.GPU_MODELS):
            raise ValidationError(
                {
                    "gpu_models": _("A list of GPU models among: %(models)s.")
                    % {"models": ", ".join(catalogue.GPU_MODELS)}
                }
            )

    def supports(self, gpu_model: str) -> bool:
        """Whether this build runs on a card, by fleet code (``RTX4090``) or name (``RTX 4090``)."""
        code = catalogue.gpu_code(gpu_model)
        return bool(code) and code in self.gpu_models

    @property
    def ports(self) -> list[dict]:
        return list(self.launch.get("ports", []))

    @property
    def env(self) -> dict[str, str]:
        return dict(self.launch.get("env", {}))
