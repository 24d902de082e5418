"""A CA and a serving certificate for 127.0.0.1 and localhost, from devcluster.certs (its
API server's serving pair is exactly what a webhook on loopback needs)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from devcluster import certs


@dataclass(frozen=True)
class ServingPair:
    ca: Path
    cert: Path
    key: Path

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def serving_pair(folder: Path) -> ServingPair:
    pki = certs.ensure(folder)
    cert, key = pki.serving
    return ServingPair(pki.ca, cert, key)
