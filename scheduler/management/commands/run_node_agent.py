"""`manage.py run_node_agent`: report this node's GPUs (NVML) to Gantry, every --interval s.

Runs as the node-agent DaemonSet (platform/k8s/30-node-agent.yaml). NODE_NAME comes from the
downward API; the URL from --url or GANTRY_AGENT_URL. The credential, read at every report (so
a rotated one is picked up without a restart):
- on Kubernetes, the pod's projected service-account token, from the file
  --service-account-token-file or GANTRY_AGENT_SA_TOKEN_FILE, sent as `Bearer`: the kubelet
  mints and rotates it for this pod on this node, and the web asks the API server which node
  that is (scheduler/nodes/agent_auth.py);
- elsewhere (the simulated and embedded installs, nodes outside Kubernetes), the token that
  `manage.py node_agent_token NODE` made for this node only, from --token or
  GANTRY_AGENT_TOKEN, or from the file --token-file or GANTRY_AGENT_TOKEN_FILE.
With --metrics-port (or GANTRY_AGENT_METRICS_PORT) it also serves
`/metrics` on that port under dcgm-exporter's names, each device labelled with the pod that
holds it, as Gantry answers each report (scheduler/agent/exporter.py, docs/metrics.md).
Without a GPU or driver it says so once and reports an empty GPU list, so a misconfigured node
shows up in Gantry as a node without GPUs rather than as silence. SIGTERM ends the loop after
the current report.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from scheduler.agent.exporter import DcgmExporter, holders_from, serve
from scheduler.agent.nvml import NvmlSession
from scheduler.agent.report import build_report, post_report

logger = logging.getLogger("scheduler.agent")


class Command(BaseCommand):
    help = "Read NVML on this node and report GPU health and utilization to Gantry."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--once", action="store_true", help="Report once and exit.")
        parser.add_argument("--print", action="store_true", help="Print each report as JSON.")
        parser.add_argument("--url", default=os.environ.get("GANTRY_AGENT_URL", ""))
        parser.add_argument("--token", default=os.environ.get("GANTRY_AGENT_TOKEN", ""))
        parser.add_argument(
            "--token-file",
            default=os.environ.get("GANTRY_AGENT_TOKEN_FILE", ""),
            help="A file holding the token (instead of --token).",
        )
        parser.add_argument(
            "--service-account-token-file",
            default=os.environ.get("GANTRY_AGENT_SA_TOKEN_FILE", ""),
            help="The pod's projected service-account token (Kubernetes; sent as Bearer).",
        )
        parser.add_argument("--interval", type=float, default=30.0, help="Seconds between reports.")
        parser.add_argument("--node", default=os.environ.get("NODE_NAME") or socket.gethostname())
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=int(os.environ.get("GANTRY_AGENT_METRICS_PORT") or 0),
            help="Serve /metrics (dcgm-exporter's names) on this port; 0: do not.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        credentials = ("token", "token_file", "service_account_token_file")
        if options["url"] and not any(options[name] for name in credentials):
            raise CommandError(
                "--url needs --service-account-token-file, --token or --token-file "
                "(or GANTRY_AGENT_SA_TOKEN_FILE, GANTRY_AGENT_TOKEN[_FILE])"
            )
        for path in (options["service_account_token_file"], options["token_file"]):
            if path:
                _read_token(path)  # fail at start, not at the first report
        if options["interval"] <= 0:
            raise CommandError("--interval must be positive")
        if not 0 <= options["metrics_port"] <= 65535:
            raise CommandError("--metrics-port must be 0 (off) or a port number")
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
        session = NvmlSession()
        if not session.available:
            logger.warning("NVML unavailable: %s; reporting no GPUs", session.error)
        exporter = DcgmExporter(options["node"])
        server = serve(exporter, options["metrics_port"]) if options["metrics_port"] else None
        try:
            while True:
                ok = self._report_once(session, exporter, options)
                if options["once"]:
                    if not ok:
                        raise CommandError("the report was not accepted")
                    return
                if stop.wait(options["interval"]):
                    return
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
            session.close()

    def _report_once(
        self, session: NvmlSession, exporter: DcgmExporter, options: dict[str, Any]
    ) -> bool:
        """One reading, exported, printed and/or posted; False when the post failed. The
        answer names the pods holding this node's devices, for the exported labels."""
        reading = session.read()
        exporter.update(reading)
        report = build_report(options["node"], reading)
        if options["print"] or not options["url"]:
            self.stdout.write(json.dumps(report, sort_keys=True))
        if not options["url"]:
            return True
        try:
            scheme, token = _credential(options)
            status, answer = post_report(options["url"], token, report, scheme=scheme)
        except (OSError, ValueError, CommandError) as exc:
            logger.warning("report to %s failed: %s", options["url"], exc)
            return False
        if status >= 300:
            logger.warning("report to %s answered HTTP %d", options["url"], status)
            return False
        exporter.set_holders(holders_from(answer))
        return True


def _credential(options: dict[str, Any]) -> tuple[str, str]:
    """(scheme, token): the service-account token first, then a node_agent_token one."""
    if options.get("service_account_token_file"):
        return "Bearer", _read_token(options["service_account_token_file"])
    if options.get("token_file"):
        return "Token", _read_token(options["token_file"])
    return "Token", str(options.get("token") or "")


def _read_token(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
    except OSError as exc:
        raise CommandError(f"cannot read the token file {path}: {exc.strerror}") from exc
    if not token:
        raise CommandError(f"the token file {path} is empty")
    return token
