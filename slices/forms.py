from __future__ import annotations

from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from slices import topology

# What customers can order: hosts of one node, slices in whole 64-card units up to a cluster.
CARD_CHOICES = [(n, str(n)) for n in topology.HOST_SIZES] + [
    (n, str(n)) for n in range(topology.SLICE_UNIT_GPUS, 2048 + 1, topology.SLICE_UNIT_GPUS)
]


class OrderPreviewForm(forms.Form):
    """The order form's choices, read from the query string so a configuration is a shareable URL."""

    region = forms.ChoiceField(label=_("Region"), required=False)
    gpu_model = forms.ChoiceField(label=_("GPU model"))
    cards = forms.TypedChoiceField(label=_("Cards"), choices=CARD_CHOICES, coerce=int, initial=8)
    image = forms.ChoiceField(label=_("Image"), required=False)
    disk_gb = forms.IntegerField(
        label=_("Persistent disk (GB)"), min_value=0, max_value=65536, required=False, initial=0
    )

    def __init__(
        self,
        *args: Any,
        regions: list[tuple[str, str]],
        gpu_models: list[str],
        images: list[tuple[str, str]],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["region"].choices = [("", _("Any region"))] + regions
        self.fields["gpu_model"].choices = [(m, m) for m in gpu_models]
        self.fields["image"].choices = [("", _("No image (bare CUDA host)"))] + images
