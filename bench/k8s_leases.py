"""One round of node lease renewals on a plane of its own, by each way the simulator could send
them (issue 37): the typed client one lease after the other (what devcluster.kubelets did), and
devcluster.fanout over 2, 8 and 16 keep-alive connections (what it does, at 8).

    PYTHONPATH=. python -m bench.k8s_leases --leases 5000 --json out.json

The plane runs etcd and kube-apiserver only, so a round's time is the server's cost of the
renewals plus this process's; each way runs twice, interleaved, and the JSON has every round
in seconds, in the order run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devcluster import heartbeats
from devcluster.fanout import Fanout
from devcluster.plane import ControlPlane


def typed(api: Any, names: list[str]) -> Callable[[], None]:
    from kubernetes import client

    coordination: Any = client.CoordinationV1Api(api)

    def renew() -> None:
        for name in names:
            request = heartbeats.lease_renewal(name)
            response = coordination.patch_namespaced_lease(
                name, heartbeats.LEASE_NAMESPACE, request.body, _preload_content=False
            )
            response.data  # noqa: B018 - read before the connection goes back
            response.release_conn()

    return renew


def fanned(api: Any, names: list[str], connections: int) -> Callable[[], None]:
    def renew() -> None:
        fanout = Fanout(api.configuration, connections=connections)
        answers = fanout.send([heartbeats.lease_renewal(name) for name in names])
        failed = [a.status for a in answers if not heartbeats.ok(a)]
        if failed:
            raise RuntimeError(f"{len(failed)} renewals failed: {sorted(set(failed))}")

    return renew


def run(folder: Path, leases: int) -> dict[str, Any]:
    from kubernetes import config

    plane = ControlPlane(folder)
    plane.start(controller_manager=False)
    api = config.new_client_from_config(str(plane.kubeconfig))
    try:
        names = [f"sim-{i:05d}" for i in range(leases)]
        heartbeats.renew_leases(Fanout(api.configuration), names)  # created
        ways = {
            "typed": typed(api, names),
            "fanout_2": fanned(api, names, 2),
            "fanout_8": fanned(api, names, 8),
            "fanout_16": fanned(api, names, 16),
        }
        rounds: list[dict[str, Any]] = []
        for _ in range(2):
            for way, renew in ways.items():
                began = time.monotonic()
                renew()
                rounds.append({"way": way, "round_s": round(time.monotonic() - began, 2)})
        return {"leases": leases, "rounds": rounds}
    finally:
        api.close()
        plane.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=5000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.leases < 1:
        parser.error("--leases must be 1 or more")
    folder = Path(tempfile.mkdtemp(prefix="cp-leases-"))
    try:
        out = run(folder, args.leases)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
