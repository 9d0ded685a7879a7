"""Explicit fields only: owner, fingerprint, hashes and timestamps are never writable."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.translation import gettext as _
from rest_framework import serializers

from console.models import ApiToken, SshKey


# For a serializer the API writes out on every poll: its fields copied and bound once per class,
# not once per serializer (DRF deep-copies the declared fields for every serializer it makes, about
# 1 ms for 30 fields). Output only (``.data``; reading input still uses each serializer's own
# fields), and only for fields that read nothing from ``context``: the shared fields belong to a
# serializer of their own, with no request. No docstring: drf-spectacular would print it as the
# description of every serializer that mixes it in.
class FieldsBoundOnce:
    @property
    def _readable_fields(self) -> Iterator[Any]:
        cls = type(self)
        fields = cls.__dict__.get("_fields_bound_once")
        if fields is None:  # two threads may both make it: the same fields either way
            template: Any = cls()
            fields = [f for f in template.fields.values() if not f.write_only]
            cls._fields_bound_once = fields  # type: ignore[attr-defined]
        return iter(fields)


class SshKeySerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)

    class Meta:
        model = SshKey
        fields = (
            "id",
            "name",
            "key_type",
            "public_key",
            "fingerprint",
            "comment",
            "bits",
            "is_default",
            "created_at",
        )
        read_only_fields = fields


class SshKeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    public_key = serializers.CharField(
        max_length=8192, trim_whitespace=True, help_text="One OpenSSH public key line."
    )
    is_default = serializers.BooleanField(required=False, default=False)


class ApiTokenSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    prefix = serializers.CharField(source="display_prefix", read_only=True)
    state = serializers.SerializerMethodField()
    team = serializers.UUIDField(source="team.public_id", read_only=True)

    class Meta:
        model = ApiToken
        fields = (
            "id",
            "name",
            "team",
            "prefix",
            "state",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
        )
        read_only_fields = fields

    def get_state(self, obj: ApiToken) -> str:
        return str(obj.state())


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    team = serializers.UUIDField(
        required=False,
        allow_null=True,
        default=None,
        help_text="The team the token acts in (one of yours; default: your personal team).",
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)

    def validate_expires_at(self, value: datetime | None) -> datetime | None:
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError(_("The expiry must be in the future."))
        return value


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(
        read_only=True, help_text="The secret; shown only in this response."
    )

    class Meta(ApiTokenSerializer.Meta):
        fields = (*ApiTokenSerializer.Meta.fields, "token")
        read_only_fields = fields
