"""Node-bootstrapper service-account tokens as IBM's clusters carry them: the ConfigMap with the
cluster's public key, JWTs signed as kube-apiserver signs them, and the token as a URL carries it."""

from __future__ import annotations

import base64
import hashlib
from typing import Any
from urllib.parse import quote

import jwt as pyjwt
from cryptography.hazmat.primitives import serialization

from ignition_server.auth.claims import TokenSecretRef
from ignition_server.auth.jwks import kube_key_id
from ignition_server.reconcile.trust import ANNOTATION_SERVICE_ACCOUNT_KEYS


def public_pem(key: Any) -> str:
    """A private key's public half, PEM (SubjectPublicKeyInfo), as `sa.pub` holds it."""
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def keys_configmap(namespace: str, key: Any, token_secret: str | None = None, *, created: str | None = None) -> dict[str, Any]:
    """ConfigMap node-bootstrapper-keys: the key the cluster's tokens are signed with, and the
    name of the token Secret they open, when given."""
    data = {"sa.pub": public_pem(key)}
    if token_secret is not None:
        data["token-secret-name"] = token_secret
    meta: dict[str, Any] = {"name": "node-bootstrapper-keys", "namespace": namespace,
                            "annotations": {ANNOTATION_SERVICE_ACCOUNT_KEYS: "true"}}
    if created:
        meta["creationTimestamp"] = created
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def legacy_jwt(key: Any, secret_name: str, *, namespace: str = "openshift-infra", alg: str = "RS256",
               kid: str | None = None) -> str:
    """Signed as kube-apiserver signs: the kid is its key's (or `kid`, to claim another's)."""
    claims = {
        "iss": "kubernetes/serviceaccount",
        "kubernetes.io/serviceaccount/namespace": namespace,
        "kubernetes.io/serviceaccount/secret.name": secret_name,
        "kubernetes.io/serviceaccount/service-account.name": "node-bootstrapper",
        "kubernetes.io/serviceaccount/service-account.uid": "2f3c6a51-0000-4000-8000-000000000001",
        "sub": f"system:serviceaccount:{namespace}:node-bootstrapper",
    }
    return pyjwt.encode(claims, key, algorithm=alg, headers={"kid": kid or kube_key_id(key.public_key())})


def url_token(token: str) -> str:
    """The token as a pointer config's URL carries it: base64, then URL-quoted."""
    return quote(base64.b64encode(token.encode()).decode(), safe="")


def secret_ref_for(token: str, name: str | None = None) -> TokenSecretRef:
    """The token Secret a JWT opens, named by the SHA-256 of the token (and by `name`, if given)."""
    return TokenSecretRef(name=name, token_sha256=hashlib.sha256(token.encode()).hexdigest())
