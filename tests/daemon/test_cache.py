"""The snapshot cache (`scheduler.snapshot.cache`): job rows, the engine's views and the
organisation kept by row version, and kept exact by the daemon's own writes."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from scheduler.models import Job
from scheduler.snapshot.build import build_snapshot
from scheduler.snapshot.cache import SnapshotCache
from tests.daemon.conftest import Env


def test_cached_rows_are_read_again_when_the_job_changes(env: Env) -> None:
    """The snapshot cache keys job rows by their PostgreSQL row version: any write to a job,
    by anyone, makes the next snapshot read its row again."""
    job = env.submit(resources={"gpus": 2})
    cache = SnapshotCache()
    first = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot.pending
    assert [(j.id, j.resources.gpu_milli) for j in first] == [(str(job.pk), 2000)]
    Job.objects.filter(pk=job.pk).update(gpu_milli_per_replica=3000)  # no updated_at bump
    again = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot.pending
    assert [(j.id, j.resources.gpu_milli) for j in again] == [(str(job.pk), 3000)]
    Job.objects.filter(pk=job.pk).update(state="cancelled")
    assert build_snapshot(env.clock(), decayed={}, cache=cache).snapshot.pending == ()
    assert cache.rows == {}


@pytest.mark.postgresql("job rows cached by row version (xmin)")
def test_the_engines_view_of_a_job_is_kept_while_what_it_is_made_of_is_unchanged(
    env: Env,
) -> None:
    """A job's row gets a new version at every step (a new reason, admitted, running), none
    of which the engine's view depends on: the same JobRequest is kept, and built again only
    when a field it is made of changes."""
    job = env.submit(resources={"gpus": 2})
    cache = SnapshotCache()
    [first] = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot.pending
    with transaction.atomic():  # a subtransaction: the row gets a version of its own
        Job.objects.filter(pk=job.pk).update(reason="waiting for 2 GPUs")
    [same] = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot.pending
    assert same is first and cache.rows[job.pk][1]["reason"] == "waiting for 2 GPUs"
    with transaction.atomic():
        Job.objects.filter(pk=job.pk).update(attempt=1)
    [again] = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot.pending
    assert again is not first and again.attempt == 1


@pytest.mark.postgresql("the organisation cached by row versions (xmin)")
def test_organisation_is_read_again_only_when_it_changed(env: Env) -> None:
    """Tenants, quotas and priority classes come from the cache while their row versions
    are unchanged; any write to one of them (by anyone) is seen at the next snapshot, and
    the engine's views of the jobs name the new values."""
    from tenants.models import PriorityClass, Quota

    job = env.submit(resources={"gpus": 2})
    cache = SnapshotCache()
    first = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot
    with CaptureQueriesContext(connection) as warm:
        again = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot
    read = " ".join(q["sql"] for q in warm.captured_queries)
    assert 'FROM "tenants_quota"' not in read and 'FROM "tenants_tenant"' not in read
    assert again.tenants == first.tenants
    assert again.pending[0] is first.pending[0]  # the same view, not built again
    quota = Quota.objects.get(tenant=env.org.alpha, flavor__name="H100-80GB")
    # Each write in its own (sub)transaction, as the API makes them: a new row version.
    with transaction.atomic():
        Quota.objects.filter(pk=quota.pk).update(guaranteed_milli=quota.guaranteed_milli - 1000)
    changed = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot
    alpha = {t.name: t for t in changed.tenants}["team-alpha"]
    assert alpha.quotas["H100-80GB"].guaranteed == quota.guaranteed_milli - 1000
    pc = PriorityClass.objects.get(pk=job.priority_class_id)
    with transaction.atomic():
        PriorityClass.objects.filter(pk=pc.pk).update(name="renamed")
    renamed = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot
    assert [j.priority_class for j in renamed.pending] == ["renamed"]


@pytest.mark.postgresql("job rows cached by row version (xmin)")
def test_the_daemons_own_writes_keep_the_row_cache_exact(env: Env) -> None:
    """Claims, binds and waiting reasons written by the daemon hand their new row versions
    to the cache, and new allocations their device shares: the next snapshot reads none of
    them again, and equals a snapshot built from scratch."""
    for _ in range(2):
        env.submit(resources={"gpus": 4}, simulation={"duration_s": 600})
    for _ in range(3):
        env.submit(replicas=4, resources={"gpus": 8})  # 8 + 32 over quota 32: they wait
    daemon = env.daemon(sync_every_s=60)
    env.run(daemon)
    assert Job.objects.filter(state="binding").count() == 2
    assert Job.objects.exclude(reason="").filter(state="queued").count() == 3
    with CaptureQueriesContext(connection) as seen:
        warm = build_snapshot(env.clock(), decayed={}, cache=daemon.cache)
    whole = [q["sql"] for q in seen.captured_queries if '"scheduler_job"."queued_at"' in q["sql"]]
    assert whole == [], "job rows read again"
    shares = [q["sql"] for q in seen.captured_queries if "scheduler_allocationdevice" in q["sql"]]
    assert shares == [], "device shares read back"
    cold = build_snapshot(env.clock(), decayed={})
    assert warm.snapshot == cold.snapshot
    assert warm.jobs == cold.jobs
