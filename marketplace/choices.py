from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class AssetKind(models.TextChoices):
    MODEL = "model", _("Model")
    DATASET = "dataset", _("Dataset")


class AssetSort(models.TextChoices):
    RELEVANCE = "relevance", _("Best match")
    POPULAR = "popular", _("Most liked first")
    NAME = "name", _("Name (A–Z)")
    NAME_DESC = "-name", _("Name (Z–A)")
    SIZE = "size", _("Size (smallest first)")
    SIZE_DESC = "-size", _("Size (largest first)")
    PARAMS = "params", _("Parameters (fewest first)")
    PARAMS_DESC = "-params", _("Parameters (most first)")


class GatedFilter(models.TextChoices):
    ANY = "", _("Any")
    GATED = "yes", _("Gated (license acceptance)")
    OPEN = "no", _("Open")


# Bootstrap badge colours beside the values they decorate.
KIND_BADGES = {AssetKind.MODEL: "primary", AssetKind.DATASET: "success"}
GATED_BADGE = "warning"
