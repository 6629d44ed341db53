"""Token rotation policy (DESIGN §3), pure: which Secret is due, and what rotating writes.

Rotate when the current token has lived TTL/2 (or carries no generation time); the
rotated-out token stays valid as `old_token` until the next rotation, then retires.
Rotation never re-renders: the payload is the same, only the key to it changes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Callable

from ..model.objects import secret_value, set_annotation, set_secret_value
from ..model.token_secret import ANNOTATION_TOKEN_GENERATION, TokenSecret, format_time


@dataclass(frozen=True)
class RotationPolicy:
    ttl: float

    @property
    def interval(self) -> float:
        return self.ttl / 2

    def due_at(self, secret: TokenSecret) -> float:
        """When `secret` must rotate next (unix time); 0 means now."""
        if secret.token is None or secret.generation_time is None:
            return 0.0
        return secret.generation_time + self.interval

    def is_due(self, secret: TokenSecret, now: float) -> bool:
        return not secret.expired(now) and now >= self.due_at(secret)


def new_token() -> str:
    return str(uuid.uuid4())


def rotation_mutation(expected_token: str | None, token: str, now: float) -> Callable[[dict[str, Any]], bool]:
    """Mutation for a source write-back: current -> old_token, `token` -> current.

    It checks the object still holds `expected_token`, so a rotation done meanwhile by
    another writer (or an edit) is not rotated a second time.
    """

    def mutate(obj: dict[str, Any]) -> bool:
        current = (secret_value(obj, "token") or b"").decode().strip() or None
        if current != expected_token:
            return False
        if current is not None:
            set_secret_value(obj, "old_token", current.encode())
        set_secret_value(obj, "token", token.encode())
        set_annotation(obj, ANNOTATION_TOKEN_GENERATION, format_time(now))
        return True

    return mutate
