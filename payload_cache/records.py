"""Records kept in the token index."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class TokenState(str, enum.Enum):
    CURRENT = "current"
    PREVIOUS = "previous"
    RETIRED = "retired"


@dataclass(frozen=True, slots=True)
class TokenRecord:
    nodepool: str  # "<ns>/<name>"
    secret: str  # "<ns>/<name>" of the token Secret
    state: TokenState
    # Unix time. RETIRED: when to forget the token; otherwise the Secret's
    # expiration (None = never expires).
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class RenderRecord:
    """Per token Secret: which inputs made which blob."""

    secret: str
    nodepool: str
    inputs_digest: str
    blob_id: str
    min_version: str  # e.g. "3.2.0"
    rendered_at: float
