"""Posting to a tenant's webhook without letting it reach inside, stall a worker, or be forged.

A webhook URL is chosen by a tenant's admin, and the worker that posts to it sits inside the
platform's network: next to the cloud's metadata address, the cluster's API, PostgreSQL,
Redis. So (docs/notifications.md "The webhook"):

1. The host is refused by name when it can only be local (`localhost`, a name without a dot,
   `*.local`, `*.svc`, `*.cluster.local`, `*.internal`, `*.arpa`), then resolved as an absolute
   name (a trailing dot: the pod's search domains never turn `db.gantry-system` into a
   service), and refused unless every address is public (`ipaddress`'s `is_global`, not
   multicast; an IPv4 address carried in IPv6, mapped, 6to4, Teredo or NAT64, is judged as
   that IPv4 address). `GANTRY_WEBHOOK_ALLOW_PRIVATE` lifts the address rules (on-premises
   receivers, the tests' local servers).
2. The connection goes to the address checked, not to a second lookup of the name (a name
   that answers a public address to the check and 127.0.0.1 to the connection, DNS
   rebinding, gains nothing): the request's URL holds the address, its Host header the name,
   and TLS sends the name (SNI) and verifies the certificate against it (httpx's
   `sni_hostname` extension). No proxy from the environment is used.
3. No redirect is followed: a 3xx is a failed delivery like any answer but 2xx.
4. One deadline for the whole delivery, lookup included (`GANTRY_NOTIFY_TIMEOUT_S`), not a
   timeout per socket read that a receiver trickling one byte at a time keeps resetting; at
   most `READ_LIMIT` bytes of the answer are read.
5. Every body is signed: `X-Gantry-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
   "<t>.<body>" under the tenant's webhook secret>`, so a receiver can tell Gantry's posts
   from forged ones and refuse old ones replayed.

What went wrong is raised as `DeliveryFailed` with the detail, for the worker's log only: the
tenant's admins see one generic reason (tenants/outbox.py), whatever it was, so that the
webhook cannot be used to tell open, closed and TLS ports apart.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from urllib.parse import SplitResult, urlsplit, urlunsplit

import httpx
from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# (host, port) -> the addresses it resolves to, as text. Tests replace it.
Resolver = Callable[[str, int], list[str]]

READ_LIMIT = 64 * 1024  # bytes of the receiver's answer read at most; nothing needs more
SIGNATURE_HEADER = "X-Gantry-Signature"
# Names that only ever mean something inside: the host itself, the cluster's services, mDNS,
# private-use top-level names (RFC 6762, 8375, and ICANN's .internal), reverse-lookup names.
LOCAL_SUFFIXES = (".localhost", ".local", ".svc", ".internal", ".arpa")
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class WebhookRefused(ValueError):
    """The URL may not be posted to; the message says why, in words fit for its admin."""


class DeliveryFailed(Exception):
    """The post did not get a 2xx in time; the message is the detail, for the log only."""


# --- where it may go ------------------------------------------------------------------------


def _system_resolve(host: str, port: int) -> list[str]:
    # The trailing dot makes the name absolute: no search domain of the pod is appended.
    infos = socket.getaddrinfo(host.rstrip(".") + ".", port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


resolver: Resolver = _system_resolve
# Lookups run here so that one that hangs is given up at the deadline (the thread finishes
# on its own, bounded by the system resolver's timeouts).
_lookups = ThreadPoolExecutor(max_workers=4, thread_name_prefix="webhook-dns")


def allow_private() -> bool:
    return bool(settings.GANTRY_WEBHOOK_ALLOW_PRIVATE)


def _embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo's client, NAT64), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_is_public(address: Address) -> bool:
    """Whether posting to `address` leaves the platform: globally routable and unicast, an
    IPv4 address carried in IPv6 judged as itself."""
    inner = _embedded_ipv4(address)
    if inner is not None:
        return address_is_public(inner)
    return address.is_global and not address.is_multicast


def host_refused(host: str) -> bool:
    """Whether the name can only mean something inside (checked before any lookup)."""
    name = host.lower().rstrip(".")
    try:
        ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        return False  # an address literal: judged as an address
    # A last label of digits (127.1, 2130706433) or hex (0x7f.1) is no DNS name: the
    # system's resolver reads it as an address in a form ipaddress does not take.
    last = name.rsplit(".", 1)[-1]
    numeric = last.isdigit() or last.startswith("0x")
    return "." not in name or numeric or name == "localhost" or name.endswith(LOCAL_SUFFIXES)


def _parts(url: str) -> tuple[SplitResult, str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise WebhookRefused(f"not a valid URL: {error}") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise WebhookRefused("not an http(s) URL with a host")
    return parts, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _refused_host_message(host: str) -> str:
    return f"{host!r} names a host inside the network; the webhook must be a public address."


def _checked(host: str, addresses: list[str]) -> str:
    """The address to connect to: the first, once every one is allowed."""
    if not addresses:
        raise DeliveryFailed(f"{host} resolved to no address")
    if not allow_private():
        for text in addresses:
            if not address_is_public(ipaddress.ip_address(text.split("%")[0])):
                raise WebhookRefused(
                    f"{host!r} resolves to {text}, which is not a public address; the "
                    "webhook must be reachable on the internet."
                )
    return addresses[0]


def _resolve(host: str, port: int, timeout_s: float) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    future = _lookups.submit(resolver, host, port)
    try:
        return future.result(timeout=max(timeout_s, 0.0))
    except FutureTimeout:
        raise DeliveryFailed(f"looking up {host} took longer than the deadline") from None
    except OSError as error:
        raise DeliveryFailed(f"looking up {host} failed: {error}") from None


def url_check(url: str, *, lookup_s: float = 2.0) -> None:
    """Refuse (WebhookRefused) a URL that is not to a public host, as its admin saves it. A
    name that does not resolve now is let through (its DNS may come later): every delivery
    checks again, and connects only to an address it checked."""
    _, host, port = _parts(url)
    if allow_private():
        return
    if host_refused(host):
        raise WebhookRefused(_refused_host_message(host))
    try:
        addresses = _resolve(host, port, lookup_s)
    except DeliveryFailed:
        return
    _checked(host, addresses)


# --- the signature --------------------------------------------------------------------------


def secret_new() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The X-Gantry-Signature value: t=<timestamp>,v1=<hex HMAC-SHA256 of "<t>." + body>."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


# --- the post -------------------------------------------------------------------------------


def _default_transport() -> httpx.AsyncBaseTransport:
    return httpx.AsyncHTTPTransport(retries=0)


# Makes the transport of each delivery; tests hand in httpx.MockTransport to see the request.
transport_factory: Callable[[], httpx.AsyncBaseTransport] = _default_transport


def _pinned_request(
    parts: SplitResult, host: str, address: str, body: bytes, headers: Mapping[str, str]
) -> httpx.Request:
    literal = f"[{address}]" if ":" in address else address
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    target = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
    shown_host = f"[{host}]" if ":" in host else host
    sent = {
        **headers,
        "Host": shown_host if parts.port is None else f"{shown_host}:{parts.port}",
        "Content-Type": "application/json",
        "User-Agent": "Gantry-Webhook/1",
    }
    extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
    request = httpx.Request("POST", target, content=body, headers=sent, extensions=extensions)
    if parts.username:
        auth = httpx.BasicAuth(parts.username, parts.password or "")
        request = next(auth.auth_flow(request))
    return request


async def _exchange(request: httpx.Request, deadline_s: float) -> int:
    """Send, read at most READ_LIMIT bytes of the answer, all within `deadline_s`; the status."""
    async with asyncio.timeout(deadline_s):
        transport = transport_factory()
        client = httpx.AsyncClient(
            transport=transport, trust_env=False, timeout=httpx.Timeout(deadline_s)
        )
        async with client:
            response = await client.send(request, stream=True, follow_redirects=False)
            try:
                read = 0
                async for chunk in response.aiter_raw():
                    read += len(chunk)
                    if read >= READ_LIMIT:
                        break
            finally:
                await response.aclose()
            return response.status_code


def post(url: str, body: bytes, headers: Mapping[str, str]) -> None:
    """POST `body` to `url` as above. Raises WebhookRefused for an address that is not
    allowed, DeliveryFailed for anything else but a 2xx within the deadline."""
    deadline = time.monotonic() + settings.GANTRY_NOTIFY_TIMEOUT_S
    parts, host, port = _parts(url)
    if host_refused(host) and not allow_private():
        raise WebhookRefused(_refused_host_message(host))
    address = _checked(host, _resolve(host, port, deadline - time.monotonic()))
    request = _pinned_request(parts, host, address, body, headers)
    try:
        status = asyncio.run(_exchange(request, deadline - time.monotonic()))
    except TimeoutError:
        raise DeliveryFailed(f"no answer from {address} within the deadline") from None
    except (httpx.HTTPError, OSError) as error:
        raise DeliveryFailed(f"{type(error).__name__} from {address}: {error}") from None
    if not 200 <= status < 300:
        raise DeliveryFailed(f"HTTP {status} from {address} (redirects are not followed)")
