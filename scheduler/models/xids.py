"""The XID history of each GPU (scheduler/nodes/services.py writes it from the agent's reports)."""

from __future__ import annotations

from django.db import models


class XidEvent(models.Model):
    """One XID one device reported, `count` times. XIDs are one-off events the agent drains from
    NVML's event set between two reports, so each report's XIDs are new events; a repeat of
    the device's code within GANTRY_XID_COALESCE_S of its row adds to the row's `count`, and a
    node writes at most GANTRY_XID_ROWS_PER_MINUTE rows a minute (scheduler/nodes/xids.py).
    `seen_at` is when the first report arrived: NVML's event set does not time its events.
    `uuid` is the device's as reported then (a replaced board keeps its index). Kept
    GANTRY_XID_RETENTION_DAYS (scheduler/telemetry/rollups.py)."""

    node = models.ForeignKey("scheduler.Node", on_delete=models.CASCADE, related_name="xid_events")
    device = models.ForeignKey(
        "scheduler.GpuDevice", on_delete=models.CASCADE, related_name="xid_events"
    )
    uuid = models.CharField(max_length=64, blank=True, default="")
    code = models.PositiveIntegerField()
    fatal = models.BooleanField()
    seen_at = models.DateTimeField()
    count = models.PositiveIntegerField(
        default=1, help_text="Reports of this code on this device coalesced into the row."
    )

    class Meta:
        ordering = ["-seen_at", "-id"]
        indexes = [
            # The node page's latest XIDs and the inventory's count of the last day.
            models.Index(fields=["node", "-seen_at"], name="xid_event_node_recent"),
            # The retention sweep.
            models.Index(fields=["seen_at"], name="xid_event_seen_at"),
        ]

    def __str__(self) -> str:
        return f"XID {self.code} on device {self.device_id} at {self.seen_at:%Y-%m-%d %H:%M:%S}"
