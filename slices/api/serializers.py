from __future__ import annotations

from rest_framework import serializers


class AvailabilitySerializer(serializers.Serializer):
    region = serializers.CharField()
    region_name = serializers.CharField()
    gpu_model = serializers.CharField()
    total_gpus = serializers.IntegerField()
    free_gpus = serializers.IntegerField()
    out_of_service_gpus = serializers.IntegerField(
        help_text="Unleased GPUs on drained, failed or maintenance nodes."
    )
    host_sizes = serializers.ListField(
        child=serializers.IntegerField(), help_text="Host sizes (GPUs) that can be placed now."
    )
    slices = serializers.BooleanField(
        help_text="The region has an InfiniBand cluster of this model."
    )
    largest_slice = serializers.IntegerField(help_text="Largest slice (GPUs) that can start now.")
    slice_performance = serializers.DictField(
        help_text="Expected NCCL all-reduce busbw (GB/s) and small-message latency (µs) of a "
        "64-GPU slice on the fewest SUs possible (α–β model).",
        allow_null=True,
    )
