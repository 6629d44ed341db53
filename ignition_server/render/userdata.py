"""Pointer configs: the small Ignition config a new node boots with (its cloud user-data).

The pointer says "merge the config at <url>, send this token, trust this CA". Two shapes
(DESIGN §2):

- ``hypershift``: ``GET <url>/ignition`` with ``Authorization: Bearer <base64(token)>``
  and, optionally, ``NodePool: <namespace>/<name>`` (the recommended shape: the token never
  appears in a URL, which the Ignition client prints to the console and journal);
- ``mcs``: ``GET <url>/config/<nodepool-name>?token=<token>``, IBM's original design.

Also: the HyperShift ``user-data-<nodepool>-<hash>`` Secret that carries the pointer, and
size checks against cloud user-data limits. Pure functions, no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from urllib.parse import quote

__all__ = [
    "USER_DATA_LIMITS",
    "NODEPOOL_ANNOTATION",
    "ca_data_url",
    "pointer_config",
    "pointer_user_data",
    "fits",
    "looks_like_jwt",
    "user_data_secret",
    "user_data_secret_name",
]

# Cloud user-data limits, in bytes of the (raw, un-base64'd) user-data.
USER_DATA_LIMITS: dict[str, int] = {
    "ibmcloud-vpc": 64 * 1024,
    "aws": 16 * 1024,
}
# The limit pointer_user_data() enforces (the project's target cloud: IBM VPC).
DEFAULT_LIMIT_CLOUD = "ibmcloud-vpc"

NODEPOOL_ANNOTATION = "hypershift.openshift.io/nodePool"
SHAPES = ("hypershift", "mcs")


def ca_data_url(ca_pem: str | bytes) -> str:
    """An RFC 2397 ``data:`` URL holding the CA bundle (base64, no media type)."""
    raw = ca_pem.encode() if isinstance(ca_pem, str) else bytes(ca_pem)
    return "data:;base64," + base64.b64encode(raw).decode("ascii")


_JWT_RE = re.compile(r"^eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")


def looks_like_jwt(token: str) -> bool:
    """A compact JWS: three base64url segments, the header a JSON object (``eyJ``...)."""
    return bool(_JWT_RE.match(token))


def _nodepool_name(nodepool: str) -> str:
    """``<namespace>/<name>`` or ``<name>`` -> ``<name>``."""
    return nodepool.rsplit("/", 1)[-1]


def pointer_config(
    *,
    source_url: str,
    token: str,
    ca_pem: str | bytes,
    shape: str = "hypershift",
    nodepool: str | None = None,
    version: str = "3.2.0",
    target_config_version_hash: str | None = None,
    token_kind: str = "auto",
    proxy: dict | None = None,
) -> dict:
    """The pointer Ignition config (a dict in Ignition 3.x shape).

    ``source_url`` is the server's public base URL, e.g. ``https://host:9090`` (a trailing
    slash is ignored). ``nodepool`` is ``<namespace>/<name>``; it is optional for the
    hypershift shape (sent as the ``NodePool`` header) and required for the mcs shape (the
    path uses its name). ``target_config_version_hash`` adds HyperShift's
    ``TargetConfigVersionHash`` header (hypershift shape only).

    Token encodings (DESIGN §2): the Bearer value is always base64 of the token; in the
    mcs URL an opaque token is sent as it is and a JWT (a node-bootstrapper service-account
    token) as base64 of the JWT, both URL-encoded. ``token_kind`` is ``"opaque"``,
    ``"jwt"`` or ``"auto"`` (a JWT is recognised by its shape).

    ``proxy`` (``httpProxy``, ``httpsProxy``, ``noProxy``) becomes ``ignition.proxy``: the node
    fetches the payload through it (spec 3.1.0 and later).
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown pointer shape {shape!r}; expected one of {', '.join(SHAPES)}")
    if not token:
        raise ValueError("pointer config needs a token")
    if not re.fullmatch(r"3\.\d+\.\d+(-experimental)?", version):
        raise ValueError(f"unsupported Ignition spec version {version!r}; expected 3.x.y")
    base = source_url.rstrip("/")
    if not base.startswith("https://"):
        raise ValueError(f"source_url must be an https:// URL, got {source_url!r}")

    merge: dict
    if shape == "hypershift":
        headers = [
            {
                "name": "Authorization",
                "value": "Bearer " + base64.b64encode(token.encode()).decode("ascii"),
            }
        ]
        if nodepool:
            headers.append({"name": "NodePool", "value": nodepool})
        if target_config_version_hash:
            headers.append({"name": "TargetConfigVersionHash", "value": target_config_version_hash})
        merge = {"source": f"{base}/ignition", "httpHeaders": headers}
    else:
        if not nodepool:
            raise ValueError("the mcs pointer shape needs nodepool (<namespace>/<name>)")
        name = _nodepool_name(nodepool)
        if token_kind not in ("auto", "opaque", "jwt"):
            raise ValueError(f"token_kind must be 'auto', 'opaque' or 'jwt', got {token_kind!r}")
        is_jwt = token_kind == "jwt" or (token_kind == "auto" and looks_like_jwt(token))
        sent = base64.b64encode(token.encode()).decode("ascii") if is_jwt else token
        merge = {
            "source": f"{base}/config/{quote(name, safe='')}?token={quote(sent, safe='')}",
        }

    ignition: dict = {
        "version": version,
        "config": {"merge": [merge]},
        "security": {"tls": {"certificateAuthorities": [{"source": ca_data_url(ca_pem)}]}},
    }
    if proxy:
        if version.startswith("3.0."):
            raise ValueError("ignition.proxy needs Ignition spec 3.1.0 or later")
        ignition["proxy"] = {k: list(v) if k == "noProxy" else v for k, v in proxy.items() if v}
    return {"ignition": ignition}


def fits(user_data: bytes) -> dict[str, bool]:
    """Which clouds' user-data limits ``user_data`` fits in (``{"ibmcloud-vpc": True, ...}``)."""
    size = len(user_data)
    return {cloud: size <= limit for cloud, limit in USER_DATA_LIMITS.items()}


def pointer_user_data(*, limit_cloud: str = DEFAULT_LIMIT_CLOUD, **kwargs) -> bytes:
    """The pointer config as compact JSON bytes, ready to be a machine's user-data.

    Takes the same keyword arguments as :func:`pointer_config`. Raises ``ValueError`` when
    the result exceeds the user-data limit of ``limit_cloud`` (IBM VPC's 64 KiB by default).
    """
    if limit_cloud not in USER_DATA_LIMITS:
        raise ValueError(f"unknown cloud {limit_cloud!r}; known: {', '.join(USER_DATA_LIMITS)}")
    config = pointer_config(**kwargs)
    data = json.dumps(config, separators=(",", ":")).encode()
    limit = USER_DATA_LIMITS[limit_cloud]
    if len(data) > limit:
        others = ", ".join(
            f"{cloud} {'fits' if ok else 'does not fit'} ({USER_DATA_LIMITS[cloud]} B)"
            for cloud, ok in fits(data).items()
        )
        raise ValueError(
            f"pointer user-data is {len(data)} bytes, over the {limit_cloud} limit of {limit} bytes "
            f"(most of it is usually the CA bundle: {len(ca_data_url(kwargs.get('ca_pem', b'')))} bytes "
            f"as a data URL); {others}"
        )
    return data


_TOKEN_SECRET_RE = re.compile(r"^token-(?P<nodepool>.+)-(?P<hash>[0-9a-z]+)$")


def user_data_secret_name(*, nodepool_name: str, token_secret_name: str, user_data: bytes) -> str:
    """``user-data-<nodepool>-<hash>``: hash from ``token-<nodepool>-<hash>`` when the token
    Secret has that form (as HyperShift pairs them), else a short sha256 of the token Secret's
    name, so the name stays the same across rotations (the user data changes with each)."""
    m = _TOKEN_SECRET_RE.match(token_secret_name)
    if m and m.group("nodepool") == nodepool_name:
        suffix = m.group("hash")
    else:
        suffix = hashlib.sha256(token_secret_name.encode()).hexdigest()[:8]
    return f"user-data-{nodepool_name}-{suffix}"


def user_data_secret(
    *,
    nodepool_name: str,
    namespace: str,
    token_secret_name: str,
    user_data: bytes,
    nodepool_namespace: str | None = None,
) -> dict:
    """HyperShift's user-data Secret (a Kubernetes object as a dict).

    ``namespace`` is where the Secret lives (the hosted control plane namespace in
    HyperShift); ``nodepool_namespace`` is the NodePool object's namespace for the
    ``hypershift.openshift.io/nodePool`` annotation (defaults to ``namespace``).
    """
    name = user_data_secret_name(
        nodepool_name=nodepool_name, token_secret_name=token_secret_name, user_data=user_data
    )
    np_ns = nodepool_namespace or namespace

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode("ascii")

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            # HyperShift sets only this annotation on its user-data Secrets.
            "annotations": {NODEPOOL_ANNOTATION: f"{np_ns}/{nodepool_name}"},
        },
        "data": {
            "disableTemplating": b64(b"true"),
            "value": b64(bytes(user_data)),
        },
    }
