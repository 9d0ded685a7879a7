"""Explicit fields only: owner, fingerprint, hashes and timestamps are never writable."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from django.utils.translation import gettext as _
from rest_framework import serializers

from console.models import ApiToken, SshKey


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

    class Meta:
        model = ApiToken
        fields = (
            "id",
            "name",
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
