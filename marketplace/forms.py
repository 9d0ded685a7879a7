"""The catalogue filters, shared by the browse pages and the API (same names, same meaning)."""

from __future__ import annotations

from django import forms
from django.core.paginator import Page, Paginator
from django.utils.translation import gettext_lazy as _

from marketplace.choices import AssetSort, GatedFilter
from marketplace.querysets import AssetQuerySet

PAGE_SIZE = 24


class AssetFilterForm(forms.Form):
    q = forms.CharField(label=_("Search"), required=False, max_length=100)
    task = forms.CharField(label=_("Task"), required=False, max_length=64)
    modality = forms.CharField(label=_("Modality"), required=False, max_length=32)
    publisher = forms.CharField(label=_("Publisher"), required=False, max_length=100)
    license = forms.CharField(label=_("License"), required=False, max_length=300)
    size_min = forms.FloatField(label=_("Size from (GB)"), required=False, min_value=0)
    size_max = forms.FloatField(label=_("Size to (GB)"), required=False, min_value=0)
    params_min = forms.FloatField(label=_("Parameters from (B)"), required=False, min_value=0)
    params_max = forms.FloatField(label=_("Parameters to (B)"), required=False, min_value=0)
    gated = forms.ChoiceField(
        label=_("License gating"), required=False, choices=GatedFilter.choices
    )
    sort = forms.ChoiceField(label=_("Sort"), required=False, choices=AssetSort.choices)

    def clean(self) -> dict:
        data = super().clean()
        for low, high in (("size_min", "size_max"), ("params_min", "params_max")):
            if data.get(low) is not None and data.get(high) is not None and data[low] > data[high]:
                self.add_error(high, _("The upper bound is below the lower bound."))
        return data

    def filters(self) -> dict:
        """The valid filters only: a bad value is reported and ignored, never half-applied."""
        if not self.is_bound:
            return {}
        self.is_valid()
        return {
            k: v
            for k, v in self.cleaned_data.items()
            if k not in self.errors and v not in (None, "")
        }

    def apply(self, qs: AssetQuerySet) -> AssetQuerySet:
        f = self.filters()
        if f.get("q"):
            qs = qs.search(f["q"])
        if f.get("task"):
            qs = qs.with_task(f["task"])
        if f.get("modality"):
            qs = qs.with_modality(f["modality"])
        if f.get("publisher"):
            qs = qs.filter(publisher__iexact=f["publisher"])
        if f.get("license"):
            qs = qs.filter(license__key=f["license"])
        if "size_min" in f:
            qs = qs.filter(size_gb__gte=f["size_min"])
        if "size_max" in f:
            qs = qs.filter(size_gb__lte=f["size_max"])
        if "params_min" in f:
            qs = qs.filter(params_billion__gte=f["params_min"])
        if "params_max" in f:
            qs = qs.filter(params_billion__lte=f["params_max"])
        if f.get("gated") == GatedFilter.GATED:
            qs = qs.filter(license__requires_acceptance=True)
        elif f.get("gated") == GatedFilter.OPEN:
            qs = qs.exclude(license__requires_acceptance=True)
        # No sort chosen: the best matches first when searching, otherwise the most liked first
        # (where a source gave likes; the others follow by name).
        default = AssetSort.RELEVANCE if f.get("q") else AssetSort.POPULAR
        sort = f.get("sort", default)
        if sort == AssetSort.RELEVANCE:
            return qs.by_relevance(f.get("q", ""))
        return qs.sorted_by(sort)

    @property
    def active(self) -> bool:
        f = self.filters()
        return any(k != "sort" for k in f)


def paginate(qs: AssetQuerySet, page_number: str | None) -> Page:
    return Paginator(qs, PAGE_SIZE).get_page(page_number)


def asset_filter_form(data: dict) -> AssetFilterForm:
    # Unbound when the URL carries no filter at all, so the first visit shows no "errors".
    keys = set(AssetFilterForm.base_fields)
    return AssetFilterForm(data if keys & set(data) else None)
