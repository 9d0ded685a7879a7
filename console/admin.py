from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin
from django.http import HttpRequest

from .models import ApiToken, Membership, SshKey, Team, TrialCreditClaim, User


@admin.register(User)
class ConsoleUserAdmin(UserAdmin):
    list_display = ("username", "email", "is_staff", "is_active", "date_joined")
    readonly_fields = ("public_id",)
    fieldsets = (*UserAdmin.fieldsets, ("Console", {"fields": ("public_id",)}))


@admin.register(SshKey)
class SshKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "key_type", "bits", "fingerprint", "is_default", "created_at")
    list_filter = ("key_type", "is_default")
    search_fields = ("name", "fingerprint", "owner__email", "owner__username")
    list_select_related = ("owner",)
    # Keys are added by their owners (validated on the way in); operators may only remove them.
    readonly_fields = tuple(f.name for f in SshKey._meta.fields)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "owner",
        "prefix",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix", "owner__email", "owner__username")
    list_select_related = ("owner",)
    # The secret is never shown (only its hash is stored); operators can see and revoke via the owner.
    readonly_fields = tuple(f.name for f in ApiToken._meta.fields)
    exclude = ("secret_hash",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(TrialCreditClaim)
class TrialCreditClaimAdmin(admin.ModelAdmin):
    list_display = ("mailbox", "user", "created_at")
    search_fields = ("mailbox", "user__email")
    list_select_related = ("user",)
    readonly_fields = ("mailbox", "user", "created_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    fields = ("user", "role", "budget_monthly", "gpu_quota", "stop_on_budget", "created_at")
    readonly_fields = ("created_at",)
    raw_id_fields = ("user",)


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "public_id", "personal_of", "created_at")
    search_fields = ("name", "public_id", "memberships__user__email", "memberships__user__username")
    readonly_fields = ("public_id", "pfs_key", "personal_of", "created_at")
    inlines = (MembershipInline,)
