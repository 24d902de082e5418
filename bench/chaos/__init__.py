"""Chaos: the whole platform under crashes, restarts and outages, then its promises checked.

    python -m bench.chaos --json out.json
    python -m bench.chaos --jobs 30 --kills 2 --pg-restarts 1 --redis-down-s 5 --json out.json
    python -m bench.chaos --lose-cluster --json out.json

On its own PostgreSQL cluster and Redis server (bench.chaos.env; never the shared ones), it
runs two `run_scheduler` processes (leader and standby) on a simulated cluster shared through
a state file, the web server (gunicorn) and a Celery worker with beat, and submits `--jobs`
jobs through the API from four teams (whole, multi-GPU, fractional, gangs, high-priority
jobs that preempt; bench.chaos.load) over `--window-s` seconds. Meanwhile (bench.chaos.faults):
the leader is SIGKILLed `--kills` times (a new standby started each time); one leader is
frozen between cycles and one inside a write transaction until a standby took over, then
resumed; every scheduler process is restarted once and the jobs running before must survive;
PostgreSQL restarts `--pg-restarts` times; Redis is down `--redis-down-s` seconds while jobs
are submitted and read through the API and the portal (a login, the job form, the pages);
10 % of the nodes fail and heal; some jobs' pods hang in Pending (never_start) and some in
Terminating (a partitioned node). With `--lose-cluster` (bench.chaos.clusters), a second
simulated cluster runs beside the first, and stops answering for longer than its deadline
during the run, then comes back still running its stale pods.

Then the faults stop, the run settles (`--settle-s` at most, until every job is final), and
bench.chaos.checks checks the promises over the whole history. The JSON holds every check's
count, the faults injected, durations and parameters; the exit status is 1, with the broken
promises printed, when any count that must be zero is not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import tempfile
import threading
import time
from pathlib import Path

from bench.chaos import clusters as chaos_clusters
from bench.chaos import faults
from bench.chaos.env import PgCluster, Proc, RedisServer, manage, venv_tool
from bench.chaos.load import TEAMS, Api, job_spec, seed, write_nodes_csv
from bench.chaos.run import Run, checks, settle

# Counts in the JSON that must be zero for the run to pass (besides every check's).
MUST_BE_ZERO = (
    "stale_writes",
    "restart_lost_running",
    "api_errors_redis_down",
    "acknowledged_missing",
    "celery_not_caught_up",
    "processes_died",
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--json", type=Path, default=None, help="write the results here")
    add("--jobs", type=int, default=2000)
    add("--window-s", type=float, default=420.0, help="seconds over which jobs are submitted")
    add("--runtime-s", type=int, nargs=2, default=(2, 8), help="jobs run between these seconds")
    add("--settle-s", type=float, default=240.0, help="longest wait for jobs to finish")
    add("--kills", type=int, default=20)
    add("--pg-restarts", type=int, default=2)
    add("--redis-down-s", type=float, default=60.0, help="0: Redis stays up")
    add("--freezes", action=argparse.BooleanOptionalAction, default=True)
    add("--restart", action=argparse.BooleanOptionalAction, default=True)
    add("--node-faults", action=argparse.BooleanOptionalAction, default=True)
    add("--hold-s", type=float, default=20.0, help="how long failed nodes stay down")
    add("--nodes", type=int, default=20)
    add("--gpus", type=int, default=8)
    add("--lease-ttl", type=float, default=5.0)
    add("--pg-port", type=int, default=5441)
    add("--redis-port", type=int, default=6441)
    add("--web-port", type=int, default=8441)
    add("--seed", type=int, default=21)
    add("--node-lost-grace-s", type=float, default=20.0, help="GANTRY_NODE_LOST_GRACE_S")
    add(
        "--lose-cluster",
        action="store_true",
        help="a second cluster, lost past its deadline and healed during the run",
    )
    add("--lose-at", type=float, default=0.3, help="when, as a share of the window")
    add("--lost-after-s", type=int, default=30, help="the second cluster's deadline")
    add(
        "--lost-down-s",
        type=float,
        default=None,
        help="how long it stays silent (default: deadline + node-lost grace + 30 s)",
    )
    add("--lost-stall-s", type=float, default=2.0, help="each call to it stalls, then fails")
    add("--keep", action="store_true", help="keep the run's directory (logs, database)")
    return parser.parse_args(argv)


def child_env(run: Run, args: argparse.Namespace) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GANTRY_", "DJANGO_"))}
    env.update(
        DATABASE_URL=run.pg.url,
        REDIS_URL=run.redis.url,
        GANTRY_VAR_DIR=str(run.root / "var"),
        GANTRY_CLUSTER_BACKEND="simulated",
        GANTRY_SIM_STATE_FILE=str(run.state_file),
        GANTRY_SCHEDULER_INTERVAL_S="1",
        GANTRY_SCHEDULER_PROFILE=str(run.root / "profile.yaml"),
        # Pods that never start, and stopping pods of unreachable nodes, resolve within the run.
        GANTRY_BINDING_TIMEOUT_S="15",
        GANTRY_NODE_LOST_GRACE_S=f"{args.node_lost_grace_s:g}",
        GANTRY_LOG_LEVEL="WARNING",
        DJANGO_DEBUG="0",
        PGAPPNAME="chaos-harness",
    )
    return env


def start_processes(run: Run, args: argparse.Namespace) -> None:
    env = child_env(run, args)
    logs = run.root / "logs"
    logs.mkdir()

    def scheduler(number: int) -> Proc:
        command = manage("run_scheduler", "--no-demo-load", "--nodes-csv", str(run.nodes_csv),
                         "--lease-ttl", str(args.lease_ttl))  # fmt: skip
        name = f"scheduler-{number}"
        return Proc(name, command, env | {"PGAPPNAME": f"chaos-{name}"}, logs / f"{name}.log")

    run.schedulers = faults.Schedulers(scheduler, run.monitor)
    run.schedulers.start()
    run.schedulers.start()
    # As the deployment runs it (platform/Dockerfile): heartbeat files in shared memory; the
    # control socket its own (the default, under ~/.gunicorn, is shared by every gunicorn).
    web = [venv_tool("gunicorn"), "config.wsgi:application", "--bind", f"127.0.0.1:{args.web_port}",
           "--workers", "2", "--timeout", "60", "--worker-tmp-dir", "/dev/shm",  # noqa: S108
           "--control-socket", str(run.root / "gunicorn.ctl")]  # fmt: skip
    run.others.append(Proc("web", web, env | {"PGAPPNAME": "chaos-web"}, logs / "web.log").start())
    # The worker and beat as the deployment runs them (docker-compose.yml): two processes.
    celery = venv_tool("celery")
    for name, command in (
        ("worker", [celery, "-A", "config", "worker", "--concurrency", "1", "-l", "WARNING"]),
        ("beat", [celery, "-A", "config", "beat", "-s", str(run.root / "beat"), "-l", "WARNING"]),
    ):
        env_of = env | {"PGAPPNAME": f"chaos-{name}"}
        run.others.append(Proc(name, command, env_of, logs / f"{name}.log").start())


def submitter(run: Run, args: argparse.Namespace) -> None:
    """Submits the jobs at an even pace over the window, each with its idempotency key
    (repeated until answered), and reads some back; picks the jobs whose pods never start."""
    rng = random.Random(args.seed)
    hang_every = max(args.jobs // max(1, args.jobs // 100), 1)
    for index in range(args.jobs):
        time.sleep(max(0.0, run.started + index * args.window_s / args.jobs - time.monotonic()))
        team = TEAMS[index % len(TEAMS)]
        token, project = run.teams[team]
        body = {"project": project, "spec": job_spec(index, rng, tuple(args.runtime_s))}
        job_id = run.submit(token, body, key=f"chaos-{args.seed}-{index}")
        if job_id is None:
            continue
        if index % hang_every == hang_every // 2:
            for cluster in run.clusters():
                cluster.never_start(job_id)
            run.faults["pods_pending_forever"] += 1
        if index % 5 == 0:
            run.read(token, job_id)


def timeline(run: Run, args: argparse.Namespace) -> list[tuple[float, str]]:
    """(seconds into the window, fault) in order: the kills at random moments, the others
    spread so that they do not overlap."""
    rng = random.Random(args.seed + 1)
    window = args.window_s
    events = [(rng.uniform(0.02, 0.95) * window, "kill") for _ in range(args.kills)]
    spaced = []
    if args.freezes:
        spaced += ["freeze_idle", "freeze_write"]
    spaced += ["pg_restart"] * args.pg_restarts
    if args.node_faults:
        spaced += ["node_fail", "terminating"]
    if args.restart:
        spaced.append("restart")
    if args.redis_down_s:
        spaced.append("redis_down")
    for position, name in enumerate(spaced):
        events.append(((position + 0.5) / len(spaced) * 0.9 * window, name))
    return sorted(events)


def inject(run: Run, name: str, args: argparse.Namespace) -> None:
    if name == "kill":
        run.faults["kills"] += faults.kill_leader(run.schedulers)
    elif name in ("freeze_idle", "freeze_write"):
        done = faults.freeze_leader(
            run.schedulers,
            in_write=name == "freeze_write",
            wait_s=6 * args.lease_ttl + 30,
            cluster_lock=run.state_file.with_suffix(".state.lock"),
        )
        run.freezes.append({"kind": name, **done})
        run.faults[name] += bool(done.get("done"))
    elif name == "pg_restart":
        run.pg.restart()
        run.faults["pg_restarts"] += 1
    elif name == "restart":
        run.restart = faults.restart_schedulers(run.schedulers, run.monitor, settle_s=args.hold_s)
        run.faults["scheduler_restarts"] += 1
    elif name == "redis_down":
        run.redis_outage(args.redis_down_s)
    elif name == "node_fail":
        run.fail_nodes(share=0.1, down_s=args.hold_s)
    elif name == "terminating":
        run.hang_terminating(down_s=args.hold_s)


def open_lost_cluster(run: Run, args: argparse.Namespace) -> None:
    """site-b's row and its observer, before the schedulers start (they federate then)."""
    chaos_clusters.add_cluster(args.lost_after_s)
    run.other = chaos_clusters.open_other(run.state_file, run.nodes_csv)
    down_s = args.lost_down_s
    if down_s is None:
        down_s = args.lost_after_s + args.node_lost_grace_s + 30.0
    run.loss = chaos_clusters.LostCluster(
        home=run.cluster,
        other=run.other,
        url=run.pg.url,
        lost_after_s=args.lost_after_s,
        grace_s=args.node_lost_grace_s,
        down_s=down_s,
        stall_s=args.lost_stall_s,
    )


def start_loss(run: Run, args: argparse.Namespace) -> threading.Thread | None:
    """The sampler from now on, and the loss at `--lose-at` of the window, in threads."""
    if run.loss is None:
        return None
    threading.Thread(target=run.loss.sampler, args=(run.pg.url,), daemon=True).start()

    def lose() -> None:
        time.sleep(max(0.0, run.started + args.lose_at * args.window_s - time.monotonic()))
        run.loss.run(run)

    thread = threading.Thread(target=lose, daemon=True)
    thread.start()
    return thread


def stop_on_signal(signum: int, _frame: object) -> None:
    """SIGTERM or SIGINT (ignored by default in a background job) ends the run through its
    `finally`, which stops every process and server it started."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, stop_on_signal)
    signal.signal(signal.SIGINT, stop_on_signal)
    root = Path(tempfile.mkdtemp(prefix="gantry-chaos-"))
    os.chmod(root, 0o755)  # noqa: S103 - the PostgreSQL server below runs as its own OS user
    run = Run(
        root, PgCluster(root / "pg", args.pg_port), RedisServer(args.redis_port, root / "redis.log")
    )
    began = time.monotonic()
    try:
        run.pg.start()
        run.redis.start()
        run.nodes = write_nodes_csv(run.nodes_csv, args.nodes, args.gpus)
        (root / "profile.yaml").write_text(
            "apiVersion: gantry.io/v1\nkind: SchedulingProfile\nname: chaos\n"
            "preemption: {min_runtime_s: 0, ping_pong_guard_s: 0}\n"
            "backfill: {unknown_runtime_s: 60}\n"
        )
        run.setup_django(child_env(run, args))
        clusters = 2 if args.lose_cluster else 1
        run.teams = seed(total_milli=clusters * args.nodes * args.gpus * 1000)
        run.monitor.execute(faults.STALE_WRITE_SQL)
        run.open_cluster()
        if args.lose_cluster:
            open_lost_cluster(run, args)
        start_processes(run, args)
        run.api = Api(f"http://127.0.0.1:{args.web_port}")
        run.wait_ready(clusters * args.nodes)
        ready = time.monotonic()
        run.started = ready
        thread = threading.Thread(target=submitter, args=(run, args), daemon=True)
        thread.start()
        loss = start_loss(run, args)
        for at, name in timeline(run, args):
            time.sleep(max(0.0, ready + at - time.monotonic()))
            inject(run, name, args)
        thread.join()
        if loss is not None:
            loss.join()
        faulted = time.monotonic()
        settled = settle(run, args.settle_s)
        results = checks(run)
        results["durations_s"] = {
            "setup": round(ready - began, 1),
            "submit_and_faults": round(faulted - ready, 1),
            "settle": round(time.monotonic() - faulted, 1),
            "settled": settled,
        }
    finally:
        run.shutdown(keep=args.keep)
    results["params"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    results["load_average"] = Path("/proc/loadavg").read_text().split()[:3]
    results["run_dir"] = str(root) if args.keep else None
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(
        json.dumps({k: v for k, v in results.items() if not isinstance(v, dict | list)}, indent=2)
    )
    from bench.chaos.checks import PROMISES

    broken = {k: results[k] for k in (*PROMISES, *MUST_BE_ZERO) if results.get(k)}
    lost = results.get("lose_cluster") or {}
    broken |= {f"lose_cluster.{k}": lost[k] for k in chaos_clusters.MUST_BE_ZERO if lost.get(k)}
    if broken:
        print("\n!!! CHAOS: PROMISES BROKEN !!!")
        for name, count in sorted(broken.items()):
            print(f"!!!   {name}: {count}")
        return 1
    return 0
