"""`manage.py run_webhook --port --cert --key`: serve Gantry's admission webhook over TLS.

Runs as the gantry-webhook Deployment (platform/k8s/24-webhook.yaml); the API server calls
POST /mutate for every workload created in a namespace Gantry manages (docs/kubernetes-native.md,
"Admission"). It touches no database: the answer is a pure function of the review. The
certificate and key are read again when their files are replaced (a renewed Secret is served
without a restart). SIGTERM or SIGINT stops accepting; the process exits once the serving loop
has.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from scheduler.workloads.server import WebhookServer

logger = logging.getLogger("scheduler.workloads")

# Gantry's own daemon creates its pods already placed (nodeName): they are never held.
DAEMON_ACCOUNT = "system:serviceaccount:gantry-system:gantry-scheduler"


class Command(BaseCommand):
    help = "Serve the admission webhook that holds workloads created in Kubernetes for Gantry."

    def add_arguments(self, parser: Any) -> None:
        # The API server calls in from outside the pod: every interface, as a Service needs.
        parser.add_argument("--host", default="0.0.0.0", help="Address to listen on.")  # noqa: S104
        parser.add_argument("--port", type=int, default=9443)
        parser.add_argument("--cert", required=True, help="The serving certificate (PEM).")
        parser.add_argument("--key", required=True, help="Its private key (PEM).")
        parser.add_argument(
            "--exempt-user",
            action="append",
            dest="exempt_users",
            default=None,
            help=f"A username whose creates pass unchanged (repeatable; default {DAEMON_ACCOUNT}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not 0 < options["port"] <= 65535:
            raise CommandError("--port must be a port number (1-65535)")
        cert, key = Path(options["cert"]), Path(options["key"])
        for path in (cert, key):
            if not path.is_file():
                raise CommandError(f"no such file: {path}")
        exempt = options["exempt_users"] or [DAEMON_ACCOUNT]
        try:
            server = WebhookServer(
                (options["host"], options["port"]), cert, key, exempt_users=exempt
            )
        except OSError as error:  # the port taken, a key that does not match, unreadable PEM
            raise CommandError(
                f"cannot serve on {options['host']}:{options['port']}: {error}"
            ) from error

        def stop(signum: int, frame: Any) -> None:
            # shutdown() waits for serve_forever, so not from the thread that runs it.
            threading.Thread(target=server.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(f"webhook: serving https://{options['host']}:{server.port}/mutate")
        self.stdout.flush()
        try:
            server.serve_forever(poll_interval=0.2)
        finally:
            server.stop()  # kept-alive connections too: the API server calls another replica
        logger.info("webhook: stopped")
