"""The daemon writing the backend's device readings as utilization samples
(`scheduler.daemon.samples`, issue 20); the simulated cluster's profiles are tested in
tests/backends/simulated/test_cluster.py. Time is the fake clock's."""

from __future__ import annotations

import pytest

from scheduler.daemon.samples import sample_devices
from scheduler.leader import LeaseLost
from scheduler.models import GpuDevice, Job, UtilizationSample
from tests.daemon.conftest import Env, expire_leases


def test_the_daemon_writes_a_sample_per_device_each_interval_attributed(env: Env) -> None:
    job = env.submit(simulation={"duration_s": 10_000})
    daemon = env.daemon(sample_every_s=30)
    env.run(daemon, seconds=2, cycles=3)  # placed, started: 3 cycles within one interval
    devices = GpuDevice.objects.count()
    assert UtilizationSample.objects.count() == devices  # the first cycle's only
    env.run(daemon, seconds=30, cycles=1)
    assert UtilizationSample.objects.count() == 2 * devices
    latest = UtilizationSample.objects.order_by("-at").first()
    assert latest is not None
    held = UtilizationSample.objects.filter(at=latest.at, job=job)
    assert held.count() == 4  # the job's four GPUs
    job = Job.objects.get(pk=job.pk)
    assert {s.tenant_id for s in held} == {job.tenant_id}
    assert all(s.utilization_pct > 0 for s in held)
    free = UtilizationSample.objects.filter(at=latest.at, job__isnull=True)
    assert free.count() == devices - 4


def test_a_stale_leaders_sample_round_is_refused(env: Env) -> None:
    """A leader paused past its lease, then waking up due to sample, writes no samples: the
    new leader writes its own round, and a stale one beside it would double the history."""
    stale = env.daemon("stale", sample_every_s=30)
    env.run(stale)
    written = UtilizationSample.objects.count()
    assert written == GpuDevice.objects.count()  # the leader's round
    expire_leases()
    fresh = env.daemon("fresh")
    assert fresh.lease.acquire()
    env.clock.advance(30)  # a sampling interval has passed for the stale leader
    with pytest.raises(LeaseLost):
        sample_devices(stale.backend, stale.lease, stale.now_dt())
    assert UtilizationSample.objects.count() == written
