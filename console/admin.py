from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from .models import User


@admin.register(User)
class ConsoleUserAdmin(UserAdmin):
    list_display = ("username", "email", "is_staff", "is_active", "date_joined")
    readonly_fields = ("public_id",)
    fieldsets = (*UserAdmin.fieldsets, ("Console", {"fields": ("public_id",)}))
