"""The process's telemetry ring, picked from settings: Redis streams in production, memory in the
embedded default.

Both the relay (which writes it) and the telemetry services (which read an instance's history
from it) take it from here, so neither imports the other for it: the relay calls the services
(its finished minutes go to ``write_rollups``), never the other way round (an import-linter
contract in pyproject.toml).
"""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from slices.telemetry.ring import MemoryRing, RedisRing, Ring

# The longest one Redis call (a ring write, a tick's channel-layer sends) may take before the tick
# gives up on it: a hung Redis must not hold the loop.
REDIS_TIMEOUT_SECONDS = 2.0


@lru_cache(maxsize=1)
def get_ring() -> Ring:
    """The process's ring: Redis streams in production, memory in the embedded default."""
    maxlen = max(60, int(settings.TELEMETRY_RING_SECONDS / settings.TELEMETRY_INTERVAL))
    if settings.REDIS_URL:
        import redis  # only production has a Redis to connect to

        return RedisRing(
            redis.Redis.from_url(
                settings.REDIS_URL,
                socket_timeout=REDIS_TIMEOUT_SECONDS,
                socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
            ),
            maxlen=maxlen,
            ttl_seconds=settings.TELEMETRY_RING_SECONDS,
        )
    return MemoryRing(maxlen=maxlen)
