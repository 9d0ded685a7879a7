from __future__ import annotations

from decimal import Decimal
from typing import Any, TypeVar

from django import forms
from django.db.models import Count, Q, QuerySet
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext, pgettext_lazy

from billing.choices import BillingMode
from slices import lifecycle, topology
from slices.choices import InstanceState, Scheduler, gpu_product_name
from slices.services import ports

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
        cards: list[tuple[int, str]] | None = None,
        unorderable: set[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if cards:
            self.fields["cards"].choices = cards
        self.fields["region"].choices = [("", _("Any region"))] + regions
        # A model without a published price is named so, never as an offer (issue 29).
        closed = unorderable or set()
        self.fields["gpu_model"].choices = [
            (m, _("%(model)s (not yet available)") % {"model": gpu_product_name(m)})
            if m in closed
            else (m, gpu_product_name(m))
            for m in gpu_models
        ]
        self.fields["image"].choices = [("", _("No image (bare CUDA host)"))] + images


class OrderForm(forms.Form):
    """What ordering adds to the preview's choices (posted from the same form)."""

    name = forms.CharField(label=_("Instance name"), max_length=63, required=False)
    ssh_key = forms.ChoiceField(label=_("SSH key"), required=False)
    billing_mode = forms.ChoiceField(label=_("Billing mode"), choices=BillingMode.choices)
    term_days = forms.TypedChoiceField(
        label=_("Term"), coerce=int, required=False, empty_value=None
    )
    auto_release_hours = forms.DecimalField(
        label=_("Release automatically after (hours)"),
        required=False,
        min_value=Decimal("0.1"),
        max_value=Decimal("720"),
        decimal_places=1,
    )
    # 排队 (issue 32): what the order does when no cards are free now.
    when_unavailable = forms.ChoiceField(
        label=_("When unavailable"),
        required=False,
        choices=[
            ("refuse", _("Refuse the order")),
            ("queue", _("Queue (排队): wait for free cards")),
        ],
    )
    queue_max_wait_hours = forms.DecimalField(
        label=_("Maximum wait (hours)"),
        required=False,
        min_value=Decimal("0.1"),
        max_value=Decimal("168"),
        decimal_places=1,
    )
    disks = forms.MultipleChoiceField(
        label=_("Cloud disks to attach"), required=False, widget=forms.CheckboxSelectMultiple
    )
    disks_read_only = forms.BooleanField(label=_("Attach them read-only"), required=False)
    web_ports = forms.CharField(
        label=_("Web ports (up to 10)"),
        required=False,
        max_length=1000,
        help_text=_('Opened through the console beside JupyterLab: e.g. "7860 Gradio, 8000 API".'),
    )
    # A slice's own Slurm and job mode (issue 31): "" = Slurm for a slice, none for a host.
    scheduler = forms.ChoiceField(
        label=_("Scheduler"),
        required=False,
        choices=[("", _("Default (Slurm for a slice)")), *Scheduler.choices],
    )
    job_script = forms.CharField(
        label=_("Run a job (job mode)"),
        required=False,
        max_length=65536,
        strip=False,
        help_text=_(
            "A Slurm batch script: submitted once the slice runs, and the slice is released when it ends."
        ),
    )
    job_nodes = forms.IntegerField(label=_("Job nodes"), required=False, min_value=1, max_value=198)

    def __init__(
        self,
        *args: Any,
        ssh_keys: list[tuple[str, str]],
        terms: list[int],
        disks: list[tuple[str, str]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if disks:
            self.fields["disks"].choices = disks
        else:  # no disks yet: the order form does not mention them
            del self.fields["disks"], self.fields["disks_read_only"]
        self.fields["ssh_key"].choices = [("", _("No SSH key (console access only)"))] + ssh_keys
        self.fields["term_days"].choices = [("", "—")] + [
            (d, ngettext("%(days)d day", "%(days)d days", d) % {"days": d}) for d in terms
        ]

    def clean_web_ports(self) -> list[dict[str, Any]]:
        # "<port> [name]" entries; the order service checks them (a refusal names the field).
        return ports.parse_web_ports_text(self.cleaned_data.get("web_ports") or "")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("billing_mode") == BillingMode.TERM and not data.get("term_days"):
            self.add_error("term_days", _("Choose a term for locked-price billing."))
        return data


class DiskForm(forms.Form):
    """A new cloud disk (sizes are checked again by the service)."""

    name = forms.CharField(label=_("Disk name"), max_length=63)
    size_gb = forms.IntegerField(label=_("Size (GB)"), min_value=1)
    region = forms.ChoiceField(label=_("Region"))

    def __init__(self, *args: Any, regions: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["region"].choices = regions


class InstanceListFilter(forms.Form):
    """The instance list's ``?state=`` filter, read by the page and by ``GET /api/v1/instances/``
    alike, so the two list the same instances for the same URL and default to the same view.

    ``active`` is every instance not yet archived: running, stopped, in transition, and failed.
    A failed instance is not released yet (the state machine moves it to released only when its
    owner releases it, which archives it): it stays in the default view so a failure is read
    before it is archived, as it was before this filter. ``released`` is the archive (state
    released); ``all`` is both, so active + released = all.
    """

    ACTIVE = "active"
    ALL = "all"
    RELEASED = "released"
    DEFAULT = ACTIVE
    CHOICES = (
        (ACTIVE, pgettext_lazy("instance list filter", "Active")),
        (ALL, pgettext_lazy("instance list filter", "All")),
        (RELEASED, pgettext_lazy("instance list filter", "Released")),
    )

    state = forms.ChoiceField(choices=CHOICES, required=False)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(value for value, _label in cls.CHOICES)

    def chosen(self) -> str | None:
        """The filter asked for (the default when none is given); None for an unknown value."""
        if not self.is_valid():
            return None
        return self.cleaned_data["state"] or self.DEFAULT


_Instances = TypeVar("_Instances", bound=QuerySet[Any])


def filter_instances(qs: _Instances, state: str) -> _Instances:
    """``qs`` narrowed to one ``InstanceListFilter`` value."""
    if state == InstanceListFilter.ACTIVE:
        return qs.exclude(state=InstanceState.RELEASED)
    if state == InstanceListFilter.RELEASED:
        return qs.filter(state=InstanceState.RELEASED)
    return qs


def instance_filter_counts(qs: QuerySet[Any]) -> dict[str, int]:
    """How many instances each filter lists, and ``busy`` (how many are in transition, so the
    page keeps polling while a count may still change): one query."""
    released = Q(state=InstanceState.RELEASED)
    row = qs.aggregate(
        active=Count("pk", filter=~released),
        released=Count("pk", filter=released),
        busy=Count("pk", filter=Q(state__in=[s.value for s in lifecycle.TRANSITIONAL])),
    )
    return {
        InstanceListFilter.ACTIVE: row["active"],
        InstanceListFilter.ALL: row["active"] + row["released"],
        InstanceListFilter.RELEASED: row["released"],
        "busy": row["busy"],
    }
