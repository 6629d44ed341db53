"""Registry credentials and the `WWW-Authenticate` flows.

Credentials come from a `.dockerconfigjson` pull secret and are matched the way
containers/image matches `auths` keys: the most specific `host/namespace/repo` key first,
down to the bare host; a key may carry a scheme or a trailing path (`https://quay.io/v1/`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass

from .reference import DOCKER_HUB, Reference

_DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "registry-1.docker.io")


class AuthError(Exception):
    """The registry refused the credentials (or there were none): a configuration problem."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    def __repr__(self) -> str:  # never a password in a log line or a traceback
        return f"Credentials(username={self.username!r})"


def _normalise_key(key: str) -> str:
    key = key.strip()
    for scheme in ("https://", "http://"):
        if key.startswith(scheme):
            key = key[len(scheme) :]
            # With a scheme, the reference tools keep only the host (`https://quay.io/v1/`).
            return key.split("/", 1)[0]
    return key.rstrip("/")


def _entry_credentials(entry: object) -> Credentials | None:
    if not isinstance(entry, dict):
        return None
    if isinstance(entry.get("auth"), str) and entry["auth"]:
        try:
            user, sep, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return Credentials(user, password) if sep else None
    if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
        return Credentials(entry["username"], entry["password"])
    return None


def credentials_for(dockerconfigjson: str | None, ref: Reference) -> Credentials | None:
    if not dockerconfigjson:
        return None
    try:
        auths = json.loads(dockerconfigjson).get("auths") or {}
    except (ValueError, AttributeError):
        raise AuthError("the pull secret is not valid .dockerconfigjson") from None
    if not isinstance(auths, dict):
        return None
    entries = {_normalise_key(k): v for k, v in auths.items() if isinstance(k, str)}
    parts = ref.repository.split("/")
    candidates = [f"{ref.host}/{'/'.join(parts[:n])}" for n in range(len(parts), 0, -1)] + [ref.host]
    if ref.host == DOCKER_HUB:
        candidates += [_normalise_key(k) for k in _DOCKER_HUB_KEYS]
    for key in candidates:
        found = _entry_credentials(entries.get(key))
        if found is not None:
            return found
    return None


_PARAM = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "basic" or "bearer"
    params: dict[str, str]


def parse_challenge(header: str) -> Challenge:
    scheme, _, rest = header.strip().partition(" ")
    params = {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3) for m in _PARAM.finditer(rest)}
    return Challenge(scheme.lower(), params)
