"""`python -m devcluster build|up|down|status`: the development control plane.

python -m devcluster up          # build or reuse the binaries, start, print KUBECONFIG
export KUBECONFIG=var/control-plane/kubeconfig
python -m devcluster down
python -m devcluster crds --install JobSet RayJob   # the workload kinds' CRDs, pinned
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kubernetes import config

from devcluster import build, crds
from devcluster.plane import ControlPlane
from devcluster.versions import ETCD, KUBERNETES, ROOT, cache_dir


def default_folder() -> Path:
    var = Path(os.environ.get("GANTRY_VAR_DIR") or ROOT / "var")
    return var / "control-plane"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster", description=__doc__)
    parser.add_argument("--dir", type=Path, default=default_folder(), help="data folder")
    commands = parser.add_subparsers(dest="command", required=True)
    build_command = commands.add_parser("build", help="build the binaries (or find them cached)")
    build_command.add_argument(
        "--peers", action="store_true", help="also build the peers the benchmarks run (Kueue)"
    )
    crds_command = commands.add_parser(
        "crds", help="fetch the workload kinds' CRDs at their pinned releases (cached)"
    )
    crds_command.add_argument("kinds", nargs="*", metavar="KIND", help=", ".join(crds.KINDS))
    crds_command.add_argument(
        "--install", action="store_true", help="and install them into the running plane"
    )
    up = commands.add_parser("up", help="build if needed, start, wait until ready")
    up.add_argument("--scheduler", action="store_true", help="also start kube-scheduler")
    up.add_argument(
        "--no-controller-manager", action="store_true", help="leave kube-controller-manager out"
    )
    commands.add_parser("down", help="stop what `up` started")
    commands.add_parser("status", help="say what runs")
    args = parser.parse_args(argv)

    plane = ControlPlane(args.dir)
    if args.command == "build":
        build.build_all(peers=args.peers)
        crds.fetch_all()  # seconds, and a plane's tests install them
    elif args.command == "crds":
        return _crds(plane, args.kinds or list(crds.KINDS), install=args.install)
    elif args.command == "up":
        build.build_all()
        if plane.running():
            print(f"control-plane: already running at {plane.url}", file=sys.stderr)
        else:
            plane.start(controller_manager=not args.no_controller_manager, scheduler=args.scheduler)
            print(f"control-plane: ready at {plane.url}", file=sys.stderr)
        print(f"export KUBECONFIG={plane.kubeconfig}")
    elif args.command == "down":
        plane.stop()
        print("control-plane: stopped", file=sys.stderr)
    else:
        print(f"kubernetes {KUBERNETES}, etcd {ETCD}; binaries in {cache_dir()}")
        print(f"missing builds: {', '.join(build.missing(peers=True)) or 'none'}")
        if plane.running() and plane.state is not None:
            print(f"running at {plane.url}: {', '.join(plane.state.pids)}")
        else:
            print("not running")
    return 0


def _crds(plane: ControlPlane, kinds: list[str], *, install: bool) -> int:
    unknown = [kind for kind in kinds if kind not in crds.KINDS]
    if unknown:
        known = ", ".join(crds.KINDS)
        print(f"control-plane: unknown kind {', '.join(unknown)}: one of {known}", file=sys.stderr)
        return 2
    for kind in kinds:
        wanted = crds.cached(kind)
        print(f"{kind}: {wanted.module} {wanted.release} -> {wanted.folder}")
    if install:
        if not plane.running():
            print(f"control-plane: not running in {plane.folder} (`up` first)", file=sys.stderr)
            return 1
        with config.new_client_from_config(str(plane.kubeconfig)) as api:
            crds.install(api, kinds)
        print(f"control-plane: installed and established at {plane.url}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
