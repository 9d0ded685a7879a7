from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from marketplace.models import Asset, Image, ImageVersion, License
from marketplace.querysets import FACT_FIELDS
from marketplace.services import order_form_url


class LicenseBriefSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    gated = serializers.BooleanField(source="requires_acceptance")

    class Meta:
        model = License
        fields = ("id", "key", "name", "gated")


class LicenseSerializer(LicenseBriefSerializer):
    accepted = serializers.SerializerMethodField(
        help_text="Whether you accepted it (always true for licenses that are not gated)."
    )

    class Meta(LicenseBriefSerializer.Meta):
        fields = ("id", "key", "name", "url", "gated", "terms", "accepted")

    def get_accepted(self, obj: License) -> bool:
        return not obj.requires_acceptance or obj.pk in self.context.get("accepted_ids", set())


class MountSerializer(serializers.Serializer):
    source = serializers.CharField(help_text="Path on the parallel file system's public cache.")
    target = serializers.CharField(help_text="Mount point inside every node of the instance.")
    read_only = serializers.BooleanField()


class AssetSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    kind = serializers.CharField(read_only=True, help_text="model or dataset")
    tasks = serializers.ListField(source="task_list", child=serializers.CharField())
    modalities = serializers.ListField(source="modality_list", child=serializers.CharField())
    license = LicenseBriefSerializer(allow_null=True)
    gated = serializers.BooleanField()
    mount = serializers.SerializerMethodField()

    class Meta:
        model = Asset
        fields = (
            "id",
            "kind",
            "hub_id",
            "slug",
            "name",
            "name_zh",
            "publisher",
            *FACT_FIELDS,
            "license",
            "gated",
            "likes",
            "mount",
        )

    @extend_schema_field(MountSerializer)
    def get_mount(self, obj: Asset) -> dict:
        return {"source": obj.source_path, "target": obj.mount_point, "read_only": True}


class AssetDetailSerializer(AssetSerializer):
    class Meta(AssetSerializer.Meta):
        fields = (*AssetSerializer.Meta.fields, "description", "description_zh", "source")


class PortSerializer(serializers.Serializer):
    name = serializers.CharField()
    port = serializers.IntegerField()
    protocol = serializers.CharField()


class LaunchTemplateSerializer(serializers.Serializer):
    command = serializers.CharField()
    workdir = serializers.CharField()
    ports = PortSerializer(many=True)
    env = serializers.DictField(child=serializers.CharField())


class ImageVersionSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    launch = LaunchTemplateSerializer()
    layer = serializers.ListField(child=serializers.CharField())
    gpu_models = serializers.ListField(child=serializers.CharField())
    contents = serializers.ListField(child=serializers.CharField())
    order_url = serializers.SerializerMethodField(help_text="The order form, preset with it.")

    class Meta:
        model = ImageVersion
        fields = (
            "id",
            "slug",
            "framework_version",
            "cuda",
            "cudnn",
            "python",
            "container",
            "layer",
            "size_gb",
            "gpu_models",
            "contents",
            "launch",
            "recommended",
            "order_url",
        )

    def get_order_url(self, obj: ImageVersion) -> str:
        return order_form_url(image=obj)


class ImageSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    versions = ImageVersionSerializer(many=True, source="shown_versions")

    class Meta:
        model = Image
        fields = ("id", "slug", "name", "framework", "homepage", "summary", "versions")


class MountSpecSerializer(serializers.Serializer):
    kind = serializers.CharField()
    hub_id = serializers.CharField()
    slug = serializers.CharField()
    source = serializers.CharField()
    target = serializers.CharField()
    read_only = serializers.BooleanField()


class MountPlanSerializer(serializers.Serializer):
    mounts = MountSpecSerializer(many=True)
