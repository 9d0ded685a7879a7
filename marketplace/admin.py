from __future__ import annotations

from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from marketplace.models import Asset, Image, ImageVersion, License, LicenseAcceptance
from marketplace.querysets import FACT_FIELDS
from marketplace.services import forget_facets


class _FacetsChangeMixin:
    """The filter choices are cached; an operator's edit shows up at once."""

    def save_model(self, request: HttpRequest, obj: object, form: object, change: bool) -> None:
        super().save_model(request, obj, form, change)  # type: ignore[misc]
        transaction.on_commit(forget_facets)

    def delete_model(self, request: HttpRequest, obj: object) -> None:
        super().delete_model(request, obj)  # type: ignore[misc]
        transaction.on_commit(forget_facets)


@admin.register(License)
class LicenseAdmin(_FacetsChangeMixin, admin.ModelAdmin):
    list_display = ("key", "name", "requires_acceptance")
    list_filter = ("requires_acceptance",)
    search_fields = ("key", "name")


@admin.register(Asset)
class AssetAdmin(_FacetsChangeMixin, admin.ModelAdmin):
    list_display = (
        "hub_id",
        "kind",
        "publisher",
        "task",
        "params_billion",
        "size_gb",
        "size_estimated",
        "license",
        "is_listed",
    )
    list_filter = ("kind", "is_listed", "license__requires_acceptance", "task")
    search_fields = ("hub_id", "name", "publisher")
    list_select_related = ("license",)
    readonly_fields = ("public_id", "created_at", "updated_at")
    autocomplete_fields = ("license",)
    actions = ("unlist", "relist")
    fieldsets = (
        (None, {"fields": ("kind", "hub_id", "slug", "name", "publisher", "is_listed")}),
        (
            _("Facts"),
            {"fields": (*FACT_FIELDS, "license", "source")},
        ),
        (_("Record"), {"fields": ("public_id", "created_at", "updated_at")}),
    )

    @admin.action(description=_("Hide from the marketplace"))
    def unlist(self, request: HttpRequest, queryset: QuerySet) -> None:
        queryset.update(is_listed=False)
        transaction.on_commit(forget_facets)

    @admin.action(description=_("Show in the marketplace"))
    def relist(self, request: HttpRequest, queryset: QuerySet) -> None:
        queryset.update(is_listed=True)
        transaction.on_commit(forget_facets)


class ImageVersionInline(admin.StackedInline):
    model = ImageVersion
    extra = 0
    fields = (
        ("slug", "framework_version", "recommended", "is_listed", "position"),
        ("cuda", "cudnn", "python", "size_gb"),
        "container",
        "layer",
        "gpu_models",
        "contents",
        "launch",
    )


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ("name", "framework", "position", "is_listed")
    search_fields = ("name", "framework")
    prepopulated_fields = {"slug": ("name",)}
    inlines = (ImageVersionInline,)


@admin.register(LicenseAcceptance)
class LicenseAcceptanceAdmin(admin.ModelAdmin):
    list_display = ("user", "license_name", "accepted_at")
    search_fields = ("user__username", "user__email", "license__key")
    list_select_related = ("user", "license")
    readonly_fields = ("user", "license", "accepted_at", "license_name", "license_url")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # acceptances are the users' own act, recorded by the service
