from __future__ import annotations

import math

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from slices import services
from slices.api.serializers import AvailabilitySerializer
from slices.models import Cluster
from slices.perf import expected_performance


class AvailabilityView(APIView):
    """What can be ordered now, per region and GPU model (read-only)."""

    @extend_schema(
        summary="Live GPU availability per region and GPU model",
        responses={200: AvailabilitySerializer(many=True)},
        tags=["fleet"],
    )
    def get(self, request: Request) -> Response:
        clusters = {
            (c.region.code, c.gpu_model.code): c
            for c in Cluster.objects.select_related("region", "gpu_model")
            .prefetch_related("sus")
            .order_by("-position")
            if c.slices_allowed
        }
        rows = []
        for a in services.availability():
            perf = None
            c = clusters.get((a.region, a.gpu_model))
            # An SU-less or empty cluster (possible mid-edit in the admin) has no slice estimate.
            su_capacity = max((su.capacity for su in c.sus.all()), default=0) if c else 0
            if c is not None and su_capacity > 0:
                sus = math.ceil(8 / su_capacity)
                perf = expected_performance(
                    8, 8, sus, fabric=c.fabric, rails=c.rails, nvlink_gbps=c.gpu_model.nvlink_gbps
                ).as_dict()
            rows.append(
                {
                    "region": a.region,
                    "region_name": a.region_name,
                    "gpu_model": a.gpu_model,
                    "total_gpus": a.total_gpus,
                    "free_gpus": a.free_gpus,
                    "out_of_service_gpus": a.out_of_service_gpus,
                    "host_sizes": list(a.host_sizes),
                    "slices": a.slices,
                    "largest_slice": a.largest_slice,
                    "slice_performance": perf,
                }
            )
        return Response(AvailabilitySerializer(rows, many=True).data)
