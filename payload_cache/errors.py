"""Exceptions raised by the payload cache."""

from __future__ import annotations


class CacheError(Exception):
    """Base class: the cache cannot be used as configured."""


class CacheFormatError(CacheError):
    """The cache directory holds a format this code does not understand."""


class CacheKeyError(CacheError):
    """The key file is missing, malformed, misplaced or does not fit the cache."""
