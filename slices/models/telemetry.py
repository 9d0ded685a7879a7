"""GPU telemetry kept in the database: 1-minute rollups per GPU, and each instance's idle watch.

The last hour at 1 s lives in a bounded ring (Redis streams in production, memory in the embedded
default), never here: a fleet of 6,000 GPUs at 1 Hz writes 100 rollup rows a second, not 6,000.
Rows are written only by ``slices.services.telemetry``.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from slices.models.instances import Instance


class GpuRollup(models.Model):
    """One GPU of one instance over one minute: min / mean / max of what was sampled."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="gpu_rollups")
    hostname = models.CharField(_("hostname"), max_length=63)
    gpu = models.PositiveSmallIntegerField(_("GPU index"))
    minute = models.DateTimeField(_("minute"))
    samples = models.PositiveSmallIntegerField(_("samples"))
    util_min = models.FloatField()
    util_mean = models.FloatField()
    util_max = models.FloatField()
    mem_used_min = models.FloatField()  # MiB
    mem_used_mean = models.FloatField()
    mem_used_max = models.FloatField()
    mem_total = models.FloatField()  # MiB
    temp_min = models.FloatField()  # °C
    temp_mean = models.FloatField()
    temp_max = models.FloatField()
    power_min = models.FloatField()  # W
    power_mean = models.FloatField()
    power_max = models.FloatField()
    xid_events = models.PositiveIntegerField(default=0)
    simulated = models.BooleanField(default=False)

    class Meta:
        verbose_name = _("GPU minute")
        verbose_name_plural = _("GPU minutes")
        ordering = ("instance", "minute", "hostname", "gpu")
        constraints = (
            models.UniqueConstraint(
                fields=("instance", "hostname", "gpu", "minute"), name="slices_rollup_unique"
            ),
        )
        indexes = (models.Index(fields=("minute",), name="slices_rollup_minute"),)

    def __str__(self) -> str:
        return f"{self.instance_id} {self.hostname}/{self.gpu} {self.minute:%H:%M}"


class IdleWatch(models.Model):
    """Whether an instance's GPUs look idle, since when, why, and what was done about it."""

    instance = models.OneToOneField(Instance, on_delete=models.CASCADE, related_name="idle_watch")
    idle_since = models.DateTimeField(null=True, blank=True)
    warned_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    # Why it was judged idle (shown to the owner): threshold, window, per-GPU peak utilisation.
    evidence = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("idle watch")
        verbose_name_plural = _("idle watches")

    def __str__(self) -> str:
        return f"{self.instance_id} idle since {self.idle_since}"
