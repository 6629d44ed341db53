"""Persistent, encrypted, crash-safe store of Ignition payloads and the token index.

Knows nothing of HTTP or Kubernetes. Sync API: the server calls the disk-touching
methods through ``asyncio.to_thread``. See ``layout`` for the on-disk layout,
``keys`` for the key file format and rotation, ``envelope`` for the encryption.
"""

from .admin import stats_report
from .cache import PayloadCache
from .config import CacheConfig
from .errors import CacheError, CacheFormatError, CacheKeyError
from .keys import add_key, prune_keys
from .records import RenderRecord, TokenRecord, TokenState
from .reports import GcReport, VerifyReport
from .stats import CacheStats

__all__ = [
    "CacheConfig",
    "CacheError",
    "CacheFormatError",
    "CacheKeyError",
    "CacheStats",
    "GcReport",
    "PayloadCache",
    "RenderRecord",
    "TokenRecord",
    "TokenState",
    "VerifyReport",
    "add_key",
    "prune_keys",
    "stats_report",
]
