"""The admission webhook served over TLS: POST /mutate, GET /healthz (issue 37).

A threaded HTTPS server of the standard library: one thread per connection, the TLS handshake
done in that thread (a client that stalls its handshake holds its own thread, never the
accepting one). The API server calls with `timeoutSeconds: 5`; every read here has a deadline
well inside that (`READ_TIMEOUT_S`), so a stalled or trickling client is dropped rather than
holding a thread, and the answer itself is a pure function of the body (mutate.py): no
database, no call out.

What a caller gets:
- POST /mutate with a JSON body: 200 and the AdmissionReview response, allowed, with a patch or
  not (a body that is not JSON, or not a review, gets an allowed response without a patch);
- a body over `MAX_BODY_BYTES`, or without Content-Length: 413 or 411 (the API server never
  sends either: an object is at most 3 MiB);
- GET /healthz: 200 "ok"; anything else: 404 or 405.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from scheduler.workloads.mutate import review_response

logger = logging.getLogger("scheduler.workloads")

# The API server refuses a request body over 3 MiB; its review adds the request's envelope.
MAX_BODY_BYTES = 4 * 1024 * 1024
# Per read on a connection, and over a whole body: inside the API server's timeoutSeconds (5),
# so that a stalled connection is closed before the API server has given up on it anyway. An
# idle kept-alive connection is closed after as long; the API server opens another.
READ_TIMEOUT_S = 3.0
CHUNK = 64 * 1024
# Connections served at once (a thread each). The webhook's port is open to every source (the
# API server calls from outside the pod network): one past this is closed at once, so that
# idle connections cannot take every thread. The API server holds a few per replica.
MAX_CONNECTIONS = 256


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # the API server keeps its connections alive
    # The headers and the body go out as two writes: with Nagle's algorithm the second waited
    # for the peer's delayed ACK, 40 ms on Linux, on every answer of a kept-alive connection.
    disable_nagle_algorithm = True
    server: WebhookServer

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._send(200, b"ok", "text/plain")
        else:
            self._send(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != "/mutate":
            self._send(404, b"not found", "text/plain")
            return
        body = self._body()
        if body is None:
            return
        try:
            review = json.loads(body)
        except ValueError:
            review = None
        try:
            answer = json.dumps(self.server.decide(review)).encode()
        except Exception:
            # A fault of ours, never of the review: answered as one, so that the API server
            # applies the failure policy (Fail: the create is refused, nothing runs unheld).
            logger.exception("webhook: no answer for a review")
            self._send(500, b"internal error", "text/plain")
            return
        self._send(200, answer, "application/json")

    def _body(self) -> bytes | None:
        """The request body, or None once an error has been sent (the connection then closes)."""
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            self._send(411, b"Content-Length required", "text/plain")
            return None
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            self._send(413, f"body over {MAX_BODY_BYTES} bytes".encode(), "text/plain")
            return None
        return self._read(int(length))

    def _read(self, length: int) -> bytes | None:
        """`length` bytes within READ_TIMEOUT_S in all: a client trickling bytes one at a time
        cannot keep each read under the socket's timeout and the thread forever."""
        deadline = time.monotonic() + READ_TIMEOUT_S
        parts: list[bytes] = []
        left = length
        while left:
            if time.monotonic() > deadline:
                self.close_connection = True
                return None
            part = self.rfile.read1(min(left, CHUNK))
            if not part:
                self.close_connection = True
                return None
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)


class TlsPair:
    """The serving certificate and key, read again when either file is replaced.

    cert-manager renews the certificate long before it expires, and the kubelet swaps the
    mounted Secret's files in place; a webhook that kept the pair it started with would, on
    expiry, fail every handshake, and failurePolicy Fail would then refuse every create in a
    managed namespace. Each new connection checks the files (two stats); a pair that does not
    load (a key of the old certificate, mid-swap) keeps the previous one, logged.
    """

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self._lock = threading.Lock()
        self._seen = self._version()
        self._context = self._load()  # at start, a pair that does not load is an error

    def _version(self) -> tuple[tuple[int, int, int], ...]:
        stats = [path.stat() for path in (self.cert, self.key)]
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        return context

    def context(self) -> ssl.SSLContext:
        with self._lock:
            try:
                version = self._version()
            except OSError:  # mid-swap: a file briefly absent
                return self._context
            if version != self._seen:
                try:
                    self._context = self._load()
                    self._seen = version
                    logger.info("webhook: serving certificate reloaded from %s", self.cert)
                except (OSError, ssl.SSLError) as error:
                    logger.warning("webhook: new serving pair not loaded, old kept: %s", error)
            return self._context


class WebhookServer(ThreadingHTTPServer):
    """The webhook on (host, port) with the serving certificate and key (PEM files)."""

    daemon_threads = True  # a connection's thread never holds the process at exit
    block_on_close = False

    def __init__(
        self,
        address: tuple[str, int],
        cert: Path,
        key: Path,
        *,
        exempt_users: Iterable[str] = (),
        decide: Callable[[Any], dict[str, Any]] | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._pair = TlsPair(cert, key)
        exempt = frozenset(exempt_users)
        self.decide = decide or (lambda review: review_response(review, exempt_users=exempt))
        # The open connections: the API server keeps its own alive, so closing the listening
        # socket alone would leave the webhook answering on them after `stop()`.
        self._connections: set[ssl.SSLSocket] = set()
        self._lock = threading.Lock()
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        """In the accepting thread: a slot, or the connection closed unanswered."""
        if not self._slots.acquire(blocking=False):
            logger.warning(
                "webhook: %s connections open, %s refused", MAX_CONNECTIONS, client_address
            )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # no thread started: nobody else gives the slot back
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        """In the connection's own thread: the handshake, then HTTP."""
        request.settimeout(READ_TIMEOUT_S)
        try:
            tls = self._pair.context().wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as error:  # a probe, a plain-HTTP caller, a stall
            logger.debug("TLS handshake with %s failed: %s", client_address, error)
            return
        with self._lock:
            self._connections.add(tls)
        try:
            _Handler(tls, client_address, self)
        except (OSError, ssl.SSLError) as error:  # the peer went away or stalled
            logger.debug("connection from %s ended: %s", client_address, error)
        finally:
            with self._lock:
                self._connections.discard(tls)
            tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.exception("webhook: error serving %s", client_address)

    def start(self) -> threading.Thread:
        """Serve in a background thread (the tests); `serve_forever` in the foreground."""
        thread = threading.Thread(
            target=self.serve_forever, args=(0.05,), name="gantry-webhook", daemon=True
        )
        thread.start()
        return thread

    def stop(self) -> None:
        """Stop accepting and close every connection, kept-alive ones included, as the end of
        the process would: the API server then finds nothing to call."""
        self.shutdown()
        self.server_close()
        with self._lock:
            open_now = list(self._connections)
        for connection in open_now:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
