"""Utilization ingest rate: samples per second through `samples_ingest` on PostgreSQL.

    python -m bench.utilization_ingest --json out.json [--gpus 2000] [--rounds 30]

A fresh database with `--gpus` devices on nodes of 8, half of them held by running jobs (so
that every sample is attributed through the live shares, as in production). Each round is
one sampling interval of the whole cluster, ingested two ways:

- per node: one call per node of 8 readings, as the node agents' reports arrive;
- whole cluster: one call for every device, as the daemon writes the simulated cluster's.

Reports samples per second for each, and what the cluster needs: `--gpus` samples every
GANTRY_UTILIZATION_SAMPLE_S seconds (2,000 GPUs every 30 s: 66.7 samples/s).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.daemon_setup import fresh_database, organisation

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench_utilization"
FLAVOR = "H100-80GB"


def cluster(gpus: int) -> list[list[int]]:
    """Nodes of 8 devices, every other device held by a running job. Returns the device ids
    per node."""
    from django.utils import timezone

    from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, Node
    from tenants.models import PriorityClass

    team = organisation([("team", None, {FLAVOR: (gpus * 1000, gpus * 1000, None)})])["team"]
    tenant, user, project = team
    klass = PriorityClass.objects.create(name="bench", value=100)
    nodes = Node.objects.bulk_create(
        Node(name=f"n-{i:04d}", flavor=FLAVOR) for i in range(gpus // 8)
    )
    devices = GpuDevice.objects.bulk_create(
        GpuDevice(node=node, index=index, model=FLAVOR, memory_mib=81920)
        for node in nodes
        for index in range(8)
    )
    now = timezone.now()
    jobs = Job.objects.bulk_create(
        Job(
            project=project,
            tenant=tenant,
            submitted_by=user,
            name=f"job-{n.pk}",
            job_type="training",
            state="running",
            priority_class=klass,
            spec={},
            gpus_per_replica=4,
            gpu_milli_per_replica=4000,
        )
        for n in nodes
    )
    allocations = Allocation.objects.bulk_create(
        Allocation(
            job=job,
            node=node,
            attempt=0,
            replica=0,
            pod_name=f"pod-{job.pk}",
            namespace="team",
            flavor=FLAVOR,
            gpu_milli=4000,
            started_at=now,
        )
        for job, node in zip(jobs, nodes, strict=True)
    )
    by_node: dict[int, list[Any]] = {}
    for device in devices:
        by_node.setdefault(device.node_id, []).append(device)
    AllocationDevice.objects.bulk_create(
        AllocationDevice(allocation=allocation, device=device, milli=1000)
        for allocation in allocations
        for device in by_node[allocation.node_id][::2]
    )
    return [[d.pk for d in by_node[n.pk]] for n in nodes]


def readings(ids: list[int], round_no: int) -> list[Any]:
    from scheduler.telemetry.samples import DeviceReading

    return [DeviceReading(i, float((i + round_no) % 100), 40000, 350.0, 61.0, None) for i in ids]


def measure(nodes: list[list[int]], rounds: int, per_node: bool, start: datetime) -> float:
    """Samples per second over `rounds` sampling rounds of the cluster."""
    from scheduler.telemetry.samples import samples_ingest

    samples, elapsed = 0, 0.0
    for r in range(rounds):
        at = start + timedelta(seconds=30 * r)
        batches = nodes if per_node else [[i for ids in nodes for i in ids]]
        prepared = [readings(ids, r) for ids in batches]
        began = time.perf_counter()
        for batch in prepared:  # the callers know their devices' models (no read for them)
            samples += samples_ingest(batch, at=at, flavors={r.device_id: FLAVOR for r in batch})
        elapsed += time.perf_counter() - began
    return samples / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--gpus", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    fresh_database(args.url)
    from django.conf import settings

    nodes = cluster(args.gpus)
    start = datetime(2031, 1, 1, tzinfo=UTC)
    result = {
        "gpus": args.gpus,
        "rounds": args.rounds,
        "per_node_samples_per_s": round(measure(nodes, args.rounds, True, start), 1),
        "whole_cluster_samples_per_s": round(
            measure(nodes, args.rounds, False, start + timedelta(days=1)), 1
        ),
        "needed_samples_per_s": round(args.gpus / settings.GANTRY_UTILIZATION_SAMPLE_S, 1),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
