"""A small HTTP client for Gantry's REST API (standard library only)."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

USER_AGENT = "gantry-cli/1"
# Stands in for time.sleep between retries; tests replace it so that retrying takes no time.
sleep: Callable[[float], None] = time.sleep


class ApiError(Exception):
    """The server answered with an error status; `body` is its JSON error document."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body

    def describe(self) -> str:
        """One readable paragraph: the detail, then each field's messages."""
        if not isinstance(self.body, dict):
            return f"HTTP {self.status}: {str(self.body)[:500]}"
        lines = [f"HTTP {self.status}: {self.body.get('detail', 'error')}"]
        lines += [f"  {path}: {message}" for path, message in _flatten(self.body.get("errors"))]
        return "\n".join(lines)


class ConnectionFailed(Exception):
    """The server could not be reached after the retries."""


def _flatten(errors: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(errors, dict):
        for key, value in errors.items():
            yield from _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(errors, list):
        for item in errors:
            yield from _flatten(item, prefix)
    elif errors is not None:
        yield prefix or "error", str(errors)


@dataclass
class Client:
    url: str
    token: str | None = None
    timeout_s: float = 30.0
    retries: int = 3

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        """Send one request; connection failures are retried with backoff (same headers,
        so an Idempotency-Key makes a retried submission safe)."""
        data = json.dumps(body).encode() if body is not None else None
        all_headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **(headers or {})}
        if data is not None:
            all_headers["Content-Type"] = "application/json"
        if self.token:
            all_headers["Authorization"] = f"Token {self.token}"
        target = urllib.parse.urljoin(self.url.rstrip("/") + "/", path.lstrip("/"))
        if not target.startswith(("http://", "https://")):
            raise ConnectionFailed(f"not an http(s) URL: {target}")
        for attempt in range(self.retries + 1):
            # The scheme was checked above: only http(s) reaches urlopen.
            req = urllib.request.Request(  # noqa: S310
                target, data=data, headers=all_headers, method=method
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as response:  # noqa: S310
                    raw = response.read()
                    return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                raw = exc.read()
                try:
                    parsed: Any = json.loads(raw)
                except ValueError:
                    parsed = raw.decode(errors="replace")
                if exc.code in {502, 503, 504} and attempt < self.retries:
                    sleep(0.5 * 2**attempt)
                    continue
                raise ApiError(exc.code, parsed) from None
            # An answer cut off mid-body (http.client.IncompleteRead, a proxy restarting) is a
            # lost connection like a reset one, not a traceback.
            except (
                urllib.error.URLError,
                TimeoutError,
                ConnectionError,
                http.client.HTTPException,
            ) as exc:
                if attempt >= self.retries:
                    raise ConnectionFailed(f"cannot reach {self.url}: {exc!r}") from None
                sleep(0.5 * 2**attempt)
        raise ConnectionFailed(f"cannot reach {self.url}")

    def get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(
            [(k, v) for k, v in params.items() if v is not None], doseq=True
        )
        return self.request("GET", f"{path}?{query}" if query else path)

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        return self.request("POST", path, body if body is not None else {}, headers)

    def pages(self, path: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every result of a paginated list, page by page."""
        page = 1
        while True:
            data = self.get(path, page=page, page_size=params.pop("page_size", 100), **params)
            yield from data["results"]
            if not data.get("next"):
                return
            page += 1
