"""The scheduler daemon, one module per idea. Start at `loop` (the cycle's phases in order).

- loop: `Daemon`: lead or stand by, run a cycle, wait for the next.
- state, lease, cluster, fair_share, phases: what the loop keeps and passes on (the clock,
  timers, node memory, limits; the lease's renewals and fences; the fenced cluster; decayed
  usage; a cycle's record and reports).
- snapshot, cache, rows, queue, translate: the reads: the engine's snapshot, cached by row
  version, of the queue window, translated into the engine's types (and back: `decisions`).
- apply, bind, store: the writes of a cycle's decisions: claim and allocate, create and bind
  pods, commit; the bulk writes. Job states change through `scheduler.jobs.transitions`.
- reconcile, judge: what the cluster reports wins: orphans, stopping allocations, each job's
  verdict.
- nodes, autoscaling, upkeep, samples, wakeup: node sync and health, inference scaling,
  ANALYZE, utilization samples, the wake-up between cycles.
"""
