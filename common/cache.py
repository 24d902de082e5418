"""Django's Redis cache, made to answer "not cached" while Redis cannot be reached.

What Gantry keeps in its cache is counts that guard against abuse (the login guard's
failures, the API's rate-limit windows) and copies it can make again. None of it is worth a
failed request: with Django's own RedisCache, every API request and every login answered 500
for as long as Redis was down (found by bench/chaos's Redis outage). Here a read that cannot
reach Redis is a miss, a write is dropped, and each outage is logged once when it starts and
once when Redis answers again. The guards open meanwhile, which is the lesser harm for a
minute's outage than refusing every request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from django.core.cache.backends.redis import RedisCache

log = logging.getLogger("gantry.cache")
T = TypeVar("T")
UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class TolerantRedisCache(RedisCache):
    """`RedisCache` whose calls fall back to a miss while Redis is unreachable (see the module
    docstring). `incr` and `decr` raise ValueError then, as for a missing key."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._down = False
        self._state = threading.Lock()

    def _tolerant(self, call: Callable[[], T], fallback: T) -> T:
        try:
            result = call()
        except UNREACHABLE as error:
            with self._state:
                if not self._down:
                    log.warning("cache unreachable, serving without it: %s", error)
                self._down = True
            return fallback
        if self._down:
            with self._state:
                if self._down:
                    log.warning("cache reachable again")
                self._down = False
        return result

    def add(self, key: Any, value: Any, timeout: Any = None, version: Any = None) -> bool:
        return self._tolerant(lambda: RedisCache.add(self, key, value, timeout, version), False)

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        return self._tolerant(lambda: RedisCache.get(self, key, default, version), default)

    def set(self, key: Any, value: Any, timeout: Any = None, version: Any = None) -> None:
        self._tolerant(lambda: RedisCache.set(self, key, value, timeout, version), None)

    def touch(self, key: Any, timeout: Any = None, version: Any = None) -> bool:
        return self._tolerant(lambda: RedisCache.touch(self, key, timeout, version), False)

    def delete(self, key: Any, version: Any = None) -> bool:
        return self._tolerant(lambda: RedisCache.delete(self, key, version), False)

    def get_many(self, keys: Any, version: Any = None) -> dict[Any, Any]:
        return self._tolerant(lambda: RedisCache.get_many(self, keys, version), {})

    def has_key(self, key: Any, version: Any = None) -> bool:
        return self._tolerant(lambda: RedisCache.has_key(self, key, version), False)

    def incr(self, key: Any, delta: int = 1, version: Any = None) -> int:
        missing: Any = object()
        result = self._tolerant(lambda: RedisCache.incr(self, key, delta, version), missing)
        if result is missing:
            raise ValueError(f"Key '{key}' not found (cache unreachable)")
        return int(result)

    def set_many(self, data: Any, timeout: Any = None, version: Any = None) -> list[Any]:
        return self._tolerant(lambda: RedisCache.set_many(self, data, timeout, version), [])

    def delete_many(self, keys: Any, version: Any = None) -> None:
        self._tolerant(lambda: RedisCache.delete_many(self, keys, version), None)

    def clear(self) -> None:
        self._tolerant(lambda: RedisCache.clear(self), None)


def redis_caches(url: str) -> dict[str, dict[str, Any]]:
    """The CACHES setting on Redis at `url`: the default cache (the login guard's counts)
    and the API's rate-limit windows (common/api/throttles.py), shared by every web
    process, both tolerant of an unreachable Redis."""
    backend = f"{__name__}.TolerantRedisCache"
    return {
        "default": {"BACKEND": backend, "LOCATION": url},
        "throttle": {"BACKEND": backend, "LOCATION": url, "KEY_PREFIX": "throttle"},
    }
