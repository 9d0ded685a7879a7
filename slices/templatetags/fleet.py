"""Fleet words for templates: ``{{ code|gpu_name }}`` writes a fleet GPU code as people do."""

from __future__ import annotations

from django import template

from slices.choices import gpu_product_name

register = template.Library()


@register.filter
def gpu_name(code: object) -> str:
    """ "RTX4090" → "RTX 4090" (the product name; unknown codes as they are)."""
    return gpu_product_name(str(code))
