"""Loading the public keys that sign a hosted cluster's service-account tokens.

Sources accepted, all public-only:

* a JWKS document as the API server publishes it at ``/openid/v1/jwks``
  (``{"keys": [{"kty": "RSA", "kid": ..., "n": ..., "e": ...}, ...]}``), as a dict or JSON text;
* a single JWK (dict);
* PEM text/bytes holding one or more ``PUBLIC KEY`` / ``RSA PUBLIC KEY`` blocks or
  certificates (the key is taken from the certificate);
* an already loaded ``cryptography`` RSA or EC (P-256) public key object.

A PEM holding a private key, or a JWK carrying private members (``d``, ``p``, ...), is
refused with :class:`PrivateKeyRefused`: this server must never hold the cluster's signing key.

The key id of a PEM key is computed the way kube-apiserver computes it
(``base64url(sha256(DER SubjectPublicKeyInfo))``, no padding), so tokens' ``kid`` headers
match keys loaded from ``sa.pub`` as well as from the JWKS.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

__all__ = [
    "KeySource",
    "PrivateKeyRefused",
    "PublicKey",
    "TrustedKey",
    "kube_key_id",
    "load_public_keys",
    "public_key_pem",
]

PublicKey = Union[rsa.RSAPublicKey, ec.EllipticCurvePublicKey]
KeySource = Union[PublicKey, str, bytes, Mapping[str, Any]]

_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----.*?-----END \1-----", re.S)
_JWK_PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})
MIN_RSA_BITS = 2048


class PrivateKeyRefused(ValueError):
    """A key source held private key material; only public keys may be given."""


@dataclass(frozen=True)
class TrustedKey:
    """One public signing key: the key object, the JWS alg it verifies, its kid and fingerprint."""

    key: PublicKey
    alg: str  # "RS256" or "ES256"
    kid: str  # from the JWKS, else computed as kube-apiserver does
    fingerprint: str  # sha256 hex of the DER SubjectPublicKeyInfo (identity of the key)

    def pem(self) -> bytes:
        return public_key_pem(self.key)


def _spki_der(key: PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def public_key_pem(key: PublicKey) -> bytes:
    """SubjectPublicKeyInfo PEM (``-----BEGIN PUBLIC KEY-----``), what HAProxy's jwt_verify reads."""
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def kube_key_id(key: PublicKey) -> str:
    """The ``kid`` kube-apiserver puts in tokens signed by ``key``."""
    return base64.urlsafe_b64encode(hashlib.sha256(_spki_der(key)).digest()).rstrip(b"=").decode()


def _alg_for(key: Any) -> str:
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise ValueError(f"RSA key of {key.key_size} bits refused (minimum {MIN_RSA_BITS})")
        return "RS256"
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise ValueError(f"EC key on curve {key.curve.name} refused (ES256 needs P-256)")
        return "ES256"
    if isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
        raise PrivateKeyRefused("a private key was given; give the public key only")
    raise ValueError(f"unsupported key type {type(key).__name__} (RSA or EC P-256 public keys only)")


def _trusted(key: Any, kid: str | None = None) -> TrustedKey:
    alg = _alg_for(key)
    return TrustedKey(
        key=key,
        alg=alg,
        kid=kid or kube_key_id(key),
        fingerprint=hashlib.sha256(_spki_der(key)).hexdigest(),
    )


def _b64url_int(value: Any, member: str) -> int:
    if not isinstance(value, str) or not value:
        raise ValueError(f"JWK member {member!r} missing or not a string")
    raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    return int.from_bytes(raw, "big")


def _from_jwk(jwk: Mapping[str, Any]) -> TrustedKey | None:
    private = _JWK_PRIVATE_MEMBERS.intersection(jwk)
    if private:
        raise PrivateKeyRefused(
            f"JWK carries private members {sorted(private)}; give the public JWKS (/openid/v1/jwks)"
        )
    use = jwk.get("use")
    if use not in (None, "sig"):
        return None  # an encryption key is not a token signing key
    kty = jwk.get("kty")
    kid = jwk.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise ValueError("JWK kid must be a string")
    if kty == "RSA":
        key: PublicKey = rsa.RSAPublicNumbers(_b64url_int(jwk.get("e"), "e"), _b64url_int(jwk.get("n"), "n")).public_key()
    elif kty == "EC":
        if jwk.get("crv") != "P-256":
            raise ValueError(f"EC JWK on curve {jwk.get('crv')!r} refused (ES256 needs P-256)")
        key = ec.EllipticCurvePublicNumbers(
            _b64url_int(jwk.get("x"), "x"), _b64url_int(jwk.get("y"), "y"), ec.SECP256R1()
        ).public_key()
    else:
        raise ValueError(f"unsupported JWK kty {kty!r} (RSA or EC only)")
    trusted = _trusted(key, kid)
    alg = jwk.get("alg")
    if alg is not None and alg != trusted.alg:
        raise ValueError(f"JWK alg {alg!r} does not fit its key (expected {trusted.alg})")
    return trusted


def _from_pem(data: bytes) -> list[TrustedKey]:
    blocks = list(_PEM_BLOCK.finditer(data))
    if not blocks:
        raise ValueError("no PEM block found (expected -----BEGIN PUBLIC KEY-----)")
    out: list[TrustedKey] = []
    for m in blocks:
        label = m.group(1).decode()
        block = m.group(0)
        if "PRIVATE" in label:
            raise PrivateKeyRefused(
                f"PEM holds a private key ({label}); give the public key only "
                "(e.g. `openssl pkey -pubout`)"
            )
        if label == "CERTIFICATE":
            key: Any = x509.load_pem_x509_certificate(block).public_key()
        elif label in ("PUBLIC KEY", "RSA PUBLIC KEY"):
            key = serialization.load_pem_public_key(block)
        else:
            continue  # e.g. EC PARAMETERS: not a key
        out.append(_trusted(key))
    if not out:
        raise ValueError("PEM holds no public key")
    return out


def _from_text(data: bytes) -> list[TrustedKey]:
    stripped = data.strip()
    if stripped.startswith(b"{"):
        return _from_mapping(json.loads(stripped))
    return _from_pem(data)


def _from_mapping(doc: Mapping[str, Any]) -> list[TrustedKey]:
    if "keys" in doc:
        keys = doc["keys"]
        if not isinstance(keys, list):
            raise ValueError("JWKS 'keys' must be a list")
        out = [k for k in (_from_jwk(j) for j in keys) if k is not None]
        return out
    one = _from_jwk(doc)
    return [one] if one is not None else []


def load_public_keys(source: TrustedKey | KeySource | Iterable[TrustedKey | KeySource]) -> list[TrustedKey]:
    """Load public signing keys from one source or an iterable of sources (see module doc)."""
    if isinstance(source, (rsa.RSAPublicKey, ec.EllipticCurvePublicKey, rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
        return [_trusted(source)]
    if isinstance(source, str):
        return _from_text(source.encode())
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _from_text(bytes(source))
    if isinstance(source, TrustedKey):
        return [source]
    if isinstance(source, Mapping):
        return _from_mapping(source)
    if isinstance(source, Iterable):
        out: list[TrustedKey] = []
        for item in source:
            out.extend(load_public_keys(item))
        return out
    raise TypeError(f"unsupported key source {type(source).__name__}")
