"""Service-account JWT verification: real keys and real signatures, no mocks."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from ignition_server.auth.claims import DEFAULT_CHECKS, LEGACY_ISSUER, JwtRefused, TokenSecretRef
from ignition_server.auth.jwks import PrivateKeyRefused, kube_key_id, load_public_keys, public_key_pem
from ignition_server.auth.jwt import JwtUnknownKey, ServiceAccountVerifier, VerifiedToken
from ignition_server.auth.tokens import decode_transport_token, is_transport_jwt
from testsupport.clock import T0, Clock
from testsupport.service_accounts import secret_ref_for

BOUND_ISSUER = "https://kubernetes.default.svc"
CLUSTER = "clusters-foo"
OTHER = "clusters-bar"


# ------------------------------------------------------------------ keys and tokens
@pytest.fixture(scope="module")
def keys():
    return {
        "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "rsa2": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "ec": ec.generate_private_key(ec.SECP256R1()),
        "ec2": ec.generate_private_key(ec.SECP256R1()),
    }


def alg_of(key) -> str:
    return "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"


def sign(claims: dict, key, *, kid: str | None = "auto", alg: str | None = None) -> str:
    headers = {}
    if kid == "auto":
        headers["kid"] = kube_key_id(key.public_key())
    elif kid is not None:
        headers["kid"] = kid
    return jwt.encode(claims, key, algorithm=alg or alg_of(key), headers=headers)


def legacy(ns="openshift-infra", sa="node-bootstrapper", secret="node-bootstrapper-token-g96rw", **extra) -> dict:
    claims = {
        "iss": LEGACY_ISSUER,
        "sub": f"system:serviceaccount:{ns}:{sa}",
        "kubernetes.io/serviceaccount/namespace": ns,
        "kubernetes.io/serviceaccount/secret.name": secret,
        "kubernetes.io/serviceaccount/service-account.name": sa,
        "kubernetes.io/serviceaccount/service-account.uid": "4fdfc693-f184-4409-a523-6e6c6c886071",
    }
    claims.update(extra)
    return claims


def bound(ns="openshift-machine-config-operator", sa="node-bootstrapper", *, secret=None, **extra) -> dict:
    kube: dict = {"namespace": ns, "serviceaccount": {"name": sa, "uid": "0b8e1b5c-1c43-4c6e-a5b1-2b1f0e9f7c11"}}
    if secret:
        kube["secret"] = {"name": secret, "uid": "9a6c8d0e-3b1d-4b9f-8f43-0e7f5c3a2d10"}
    claims = {
        "aud": ["https://kubernetes.default.svc"],
        "exp": int(T0 + 3600),
        "iat": int(T0 - 60),
        "nbf": int(T0 - 60),
        "iss": BOUND_ISSUER,
        "kubernetes.io": kube,
        "sub": f"system:serviceaccount:{ns}:{sa}",
    }
    claims.update(extra)
    return claims


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwks_of(*private_keys) -> dict:
    out = []
    for k in private_keys:
        pub = k.public_key()
        if isinstance(pub, rsa.RSAPublicKey):
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(pub))
        else:
            jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(pub))
        jwk.update({"kid": kube_key_id(pub), "use": "sig", "alg": alg_of(k)})
        out.append(jwk)
    return {"keys": out}


def pem_of(key) -> bytes:
    return public_key_pem(key.public_key())


def make_verifier(clock=None, **kw) -> ServiceAccountVerifier:
    return ServiceAccountVerifier(clock=clock or Clock(), **kw)


def trusting(keys_, *names, cluster=CLUSTER, clock=None, **kw) -> ServiceAccountVerifier:
    v = make_verifier(clock, **kw)
    v.keys.configure(cluster, issuers=[BOUND_ISSUER])
    v.keys.set_keys(cluster, [keys_[n].public_key() for n in names])
    return v


def verify_for_cluster(v: ServiceAccountVerifier, token: str, cluster: str) -> VerifiedToken:
    """A token presented for one of `cluster`'s NodePools: it must verify, and as that cluster's
    (the server asks the same, auth/tokens.py: its cluster must have the NodePool), else 403."""
    verified = v.verify(token)
    if verified.cluster != cluster:
        raise JwtRefused(403, "token belongs to another cluster")
    return verified


# ------------------------------------------------------------------ good tokens
@pytest.mark.parametrize("keyname", ["rsa", "ec"])
@pytest.mark.parametrize("form", ["legacy", "bound"])
@pytest.mark.parametrize("source", ["object", "pem", "jwks", "jwks_json", "single_jwk"])
def test_good_tokens_verify(keys, keyname, form, source):
    key = keys[keyname]
    src = {
        "object": lambda: key.public_key(),
        "pem": lambda: pem_of(key).decode(),
        "jwks": lambda: jwks_of(keys["rsa2"], key),
        "jwks_json": lambda: json.dumps(jwks_of(key, keys["ec2"])),
        "single_jwk": lambda: jwks_of(key)["keys"][0],
    }[source]()
    v = make_verifier()
    v.keys.configure(CLUSTER, issuers=[BOUND_ISSUER])
    v.keys.set_keys(CLUSTER, src)
    claims = legacy() if form == "legacy" else bound(secret="node-bootstrapper-token-x")
    token = sign(claims, key)
    got = v.verify(token)
    assert got.cluster == CLUSTER
    assert got.service_account == "node-bootstrapper"
    if form == "legacy":
        assert (got.namespace, got.secret_name, got.expires_at, got.bound) == (
            "openshift-infra", "node-bootstrapper-token-g96rw", None, False)
    else:
        assert (got.namespace, got.secret_name, got.expires_at, got.bound) == (
            "openshift-machine-config-operator", "node-bootstrapper-token-x", T0 + 3600, True)
    assert verify_for_cluster(v, token, CLUSTER) == got


def test_pem_kid_matches_kube_apiserver_and_kidless_token_verifies(keys):
    loaded = load_public_keys(pem_of(keys["rsa"]))
    assert loaded[0].kid == kube_key_id(keys["rsa"].public_key())
    assert loaded[0].alg == "RS256"
    v = trusting(keys, "rsa")
    assert v.verify(sign(legacy(), keys["rsa"], kid=None)).cluster == CLUSTER


def test_certificate_pem_yields_its_public_key(keys):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sa-signer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(keys["ec"].public_key()).serial_number(1)
        .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .sign(keys["ec"], hashes.SHA256())
    )
    [k] = load_public_keys(cert.public_bytes(serialization.Encoding.PEM))
    assert k.kid == kube_key_id(keys["ec"].public_key())


@pytest.mark.parametrize("fmt", [serialization.PrivateFormat.PKCS8, serialization.PrivateFormat.TraditionalOpenSSL])
def test_private_key_pem_is_refused(keys, fmt):
    pem = keys["rsa"].private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())
    v = make_verifier()
    with pytest.raises(PrivateKeyRefused, match="private key"):
        v.keys.set_keys(CLUSTER, pem)
    # even next to a public key: nothing is loaded
    with pytest.raises(PrivateKeyRefused):
        v.keys.set_keys(CLUSTER, pem_of(keys["ec"]) + pem)
    assert v.keys.trusted_keys(CLUSTER) == []
    with pytest.raises(PrivateKeyRefused):
        v.keys.set_keys(CLUSTER, keys["ec"])  # a private key object


def test_private_jwk_is_refused(keys):
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(keys["rsa"]))
    assert "d" in jwk
    with pytest.raises(PrivateKeyRefused, match="private"):
        make_verifier().keys.set_keys(CLUSTER, {"keys": [jwk]})


def test_weak_or_wrong_curve_keys_are_refused():
    with pytest.raises(ValueError, match="P-256"):
        load_public_keys(ec.generate_private_key(ec.SECP384R1()).public_key())
    with pytest.raises(ValueError, match="bits"):
        load_public_keys(rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key())


# ------------------------------------------------------------------ forgeries
def _hs256_with_public_pem(keys) -> str:
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kube_key_id(keys["rsa"].public_key())}).encode())
    payload = b64url(json.dumps(legacy()).encode())
    signing_input = f"{header}.{payload}".encode()
    sig = hmac.new(pem_of(keys["rsa"]), signing_input, hashlib.sha256).digest()
    return f"{header}.{payload}.{b64url(sig)}"


def _alg_none(keys) -> str:
    header = b64url(json.dumps({"alg": "none", "typ": "JWT", "kid": kube_key_id(keys["rsa"].public_key())}).encode())
    return f"{header}.{b64url(json.dumps(legacy()).encode())}."


def _tampered(keys) -> str:
    good = sign(legacy(), keys["rsa"])
    h, _, s = good.split(".")
    evil = legacy(ns="kube-system", sa="node-bootstrapper")
    evil["kubernetes.io/serviceaccount/namespace"] = "openshift-infra"
    evil["kubernetes.io/serviceaccount/secret.name"] = "another-secret"
    return f"{h}.{b64url(json.dumps(evil).encode())}.{s}"


def _es256_header_on_rsa_signature(keys) -> str:
    good = sign(legacy(), keys["rsa"])
    _, p, s = good.split(".")
    h = b64url(json.dumps({"alg": "ES256", "kid": kube_key_id(keys["rsa"].public_key())}).encode())
    return f"{h}.{p}.{s}"


FORGERIES = {
    "wrong key, claimed kid": lambda k: sign(legacy(), k["rsa2"], kid=kube_key_id(k["rsa"].public_key())),
    "wrong key, no kid": lambda k: sign(legacy(), k["ec2"], kid=None),
    "alg none": _alg_none,
    "HS256 with public PEM as secret": _hs256_with_public_pem,
    "payload edited after signing": _tampered,
    "alg header swapped": _es256_header_on_rsa_signature,
    "wrong namespace": lambda k: sign(legacy(ns="kube-system"), k["rsa"]),
    "wrong service account": lambda k: sign(legacy(sa="default"), k["rsa"]),
    "wrong service account, bound": lambda k: sign(bound(sa="builder"), k["ec"]),
    "another cluster's token": lambda k: sign(legacy(), k["ec2"]),
    "expired": lambda k: sign(bound(exp=int(T0 - 120)), k["ec"]),
    "not yet valid": lambda k: sign(bound(nbf=int(T0 + 600)), k["ec"]),
    "wrong aud": lambda k: sign(bound(aud=["https://elsewhere"]), k["ec"]),
    "wrong issuer, bound": lambda k: sign(bound(iss="https://evil.example"), k["ec"]),
    "wrong issuer, legacy": lambda k: sign(legacy(iss="https://kubernetes.default.svc"), k["rsa"]),
    "subject contradicts claims": lambda k: sign(legacy(sub="system:serviceaccount:kube-system:admin"), k["rsa"]),
    "not a service-account token": lambda k: sign({"iss": LEGACY_ISSUER, "sub": "x"}, k["rsa"]),
    "garbage": lambda k: "not.a.jwt",
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_tokens_are_refused(keys, name):
    v = make_verifier()
    v.keys.configure(CLUSTER, issuers=[BOUND_ISSUER], audiences=["https://kubernetes.default.svc"])
    v.keys.set_keys(CLUSTER, jwks_of(keys["rsa"], keys["ec"]))
    v.keys.configure(OTHER, issuers=[BOUND_ISSUER])
    v.keys.set_keys(OTHER, pem_of(keys["ec2"]))
    token = FORGERIES[name](keys)
    with pytest.raises(JwtRefused) as err:
        verify_for_cluster(v, token, CLUSTER)
    assert err.value.status in (401, 403)
    assert token not in err.value.reason and token not in str(err.value)
    # the good tokens still pass in the same setup
    assert verify_for_cluster(v, sign(legacy(), keys["rsa"]), CLUSTER).cluster == CLUSTER
    assert verify_for_cluster(v, sign(bound(), keys["ec"]), CLUSTER).cluster == CLUSTER


def test_other_clusters_token_is_refused_403_but_valid_there(keys):
    v = trusting(keys, "rsa")
    v.keys.configure(OTHER, issuers=[BOUND_ISSUER])
    v.keys.set_keys(OTHER, keys["ec2"].public_key())
    token = sign(legacy(), keys["ec2"])
    with pytest.raises(JwtRefused) as err:
        verify_for_cluster(v, token, CLUSTER)
    assert err.value.status == 403
    assert verify_for_cluster(v, token, OTHER).cluster == OTHER


def test_shared_key_makes_tokens_ambiguous(keys):
    v = trusting(keys, "rsa")
    token = sign(legacy(), keys["rsa"])
    assert v.verify(token).cluster == CLUSTER  # cached now
    v.keys.set_keys(OTHER, keys["rsa"].public_key())
    with pytest.raises(JwtRefused, match="more than one cluster") as err:
        v.verify(token)
    assert err.value.status == 403


def test_unknown_kid_with_many_keys_is_unknown_key(keys):
    v = make_verifier(max_untargeted_keys=1)
    v.keys.set_keys(CLUSTER, [keys["rsa"].public_key(), keys["ec"].public_key()])
    with pytest.raises(JwtUnknownKey) as err:
        v.verify(sign(legacy(), keys["rsa2"]))
    assert err.value.status == 511
    assert v.verify(sign(legacy(), keys["rsa"])).cluster == CLUSTER  # kid targets one key


# A token that may succeed later gets a 5xx (Ignition retries it); one that never can, a 4xx.
KEY_NOT_LOADED_YET = {
    "new key, its own kid": lambda k: sign(legacy(), k["rsa2"]),
    "new key, no kid": lambda k: sign(legacy(), k["rsa2"], kid=None),
    "new key, a kid from a JWKS": lambda k: sign(legacy(), k["rsa2"], kid="rotated-2026"),
}


@pytest.mark.parametrize("name", list(KEY_NOT_LOADED_YET))
def test_a_key_not_loaded_yet_is_511_until_it_is_then_accepted(keys, name):
    """The hosted cluster rotated its signing key; this replica has not read the new one."""
    v = trusting(keys, "rsa")
    token = KEY_NOT_LOADED_YET[name](keys)
    with pytest.raises(JwtUnknownKey) as err:
        v.verify(token)
    assert err.value.status == 511 and token not in str(err.value)
    v.keys.set_keys(CLUSTER, [keys["rsa"].public_key(), keys["rsa2"].public_key()])
    assert v.verify(token).cluster == CLUSTER


def test_a_known_kid_whose_signature_fails_is_forged_4xx(keys):
    v = trusting(keys, "rsa")
    claimed = kube_key_id(keys["rsa"].public_key())
    for token in (
        sign(legacy(), keys["rsa2"], kid=claimed),  # another key's signature under a held kid
        _tampered(keys),
        _es256_header_on_rsa_signature(keys),  # a held kid, the wrong alg for its key
    ):
        with pytest.raises(JwtRefused) as err:
            v.verify(token)
        assert 400 <= err.value.status < 500 and not isinstance(err.value, JwtUnknownKey)


def test_unknown_kid_with_many_keys_tries_none(keys):
    """Cheap to refuse: past max_untargeted_keys an unknown kid costs no signature check."""
    v = make_verifier(max_untargeted_keys=1)
    v.keys.set_keys(CLUSTER, [keys["rsa"].public_key(), keys["ec"].public_key()])
    before = v.stats.signature_checks
    for _ in range(50):
        with pytest.raises(JwtUnknownKey):
            v.verify(sign(legacy(), keys["rsa2"]))
    assert v.stats.signature_checks == before


def test_allowed_accounts_are_configurable(keys):
    v = make_verifier(allowed_accounts=[("ibm-system", "ignition-reader")])
    v.keys.set_keys(CLUSTER, keys["rsa"].public_key())
    assert v.verify(sign(legacy(ns="ibm-system", sa="ignition-reader"), keys["rsa"])).namespace == "ibm-system"
    with pytest.raises(JwtRefused):
        v.verify(sign(legacy(), keys["rsa"]))
    # per cluster override
    v.keys.configure(CLUSTER, allowed_accounts=[("openshift-infra", "node-bootstrapper")])
    assert v.verify(sign(legacy(), keys["rsa"])).namespace == "openshift-infra"


# ------------------------------------------------------------------ each check matters
# For each named check: a validly signed token that only this check refuses, and the setup.
def _setup(v: ServiceAccountVerifier, keys) -> None:
    v.keys.configure(CLUSTER, issuers=[BOUND_ISSUER], audiences=["https://kubernetes.default.svc"])
    v.keys.set_keys(CLUSTER, keys["rsa"].public_key())
    v.keys.set_token_secrets(CLUSTER, TokenSecretRef(name="node-bootstrapper-token-g96rw"))


ONLY_THIS_CHECK_REFUSES = {
    "issuer": lambda k: sign(legacy(iss="https://evil.example"), k["rsa"]),
    "namespace": lambda k: sign(legacy(ns="default"), k["rsa"]),
    "service_account": lambda k: sign(legacy(sa="default"), k["rsa"]),
    "subject": lambda k: sign(legacy(sub="system:serviceaccount:kube-system:default"), k["rsa"]),
    "expiry": lambda k: sign(legacy(exp=int(T0 - 3600)), k["rsa"]),
    "not_before": lambda k: sign(legacy(nbf=int(T0 + 3600)), k["rsa"]),
    "audience": lambda k: sign(
        bound(aud=["https://evil.example"], secret="node-bootstrapper-token-g96rw"), k["rsa"]),
    "token_secret": lambda k: sign(legacy(secret="node-bootstrapper-token-stolen"), k["rsa"]),
}


def test_every_check_has_a_forgery():
    assert set(ONLY_THIS_CHECK_REFUSES) == {c.name for c in DEFAULT_CHECKS}


@pytest.mark.parametrize("check", [c.name for c in DEFAULT_CHECKS])
def test_each_check_is_needed(keys, check):
    token = ONLY_THIS_CHECK_REFUSES[check](keys)
    full = make_verifier()
    _setup(full, keys)
    with pytest.raises(JwtRefused) as err:
        full.verify(token)
    assert 400 <= err.value.status < 500
    fewer = [c for c in DEFAULT_CHECKS if c.name != check]
    assert len(fewer) == len(DEFAULT_CHECKS) - 1
    weakened = make_verifier(checks=fewer)
    _setup(weakened, keys)
    assert weakened.verify(token).cluster == CLUSTER  # the forgery passes without that check


# ------------------------------------------------------------------ rotation
def test_token_secret_rotation_overlap(keys):
    clock = Clock()
    v = trusting(keys, "rsa", clock=clock, overlap_seconds=600)
    old = sign(legacy(secret="nb-token-old"), keys["rsa"])
    new = sign(legacy(secret="nb-token-new"), keys["rsa"])
    v.keys.set_token_secrets(CLUSTER, "nb-token-old")
    assert v.verify(old).secret_name == "nb-token-old"
    with pytest.raises(JwtRefused):
        v.verify(new)
    v.keys.set_token_secrets(CLUSTER, "nb-token-new")  # rotation at T0
    clock.now = T0 + 599
    assert v.verify(old).secret_name == "nb-token-old"
    assert v.verify(new).secret_name == "nb-token-new"
    clock.now = T0 + 600
    with pytest.raises(JwtRefused, match="rotated out") as err:
        v.verify(old)
    assert err.value.status == 403
    assert v.verify(new).secret_name == "nb-token-new"


def test_token_secret_by_token_hash(keys):
    clock = Clock()
    v = trusting(keys, "ec", clock=clock, overlap_seconds=60)
    t1 = sign(bound(), keys["ec"])
    t2 = sign(bound(exp=int(T0 + 7200)), keys["ec"])
    v.keys.set_token_secrets(CLUSTER, secret_ref_for(t1))
    assert v.verify(t1).bound
    with pytest.raises(JwtRefused):
        v.verify(t2)
    v.keys.set_token_secrets(CLUSTER, secret_ref_for(t2))
    assert v.verify(t1) and v.verify(t2)
    clock.now = T0 + 61
    with pytest.raises(JwtRefused):
        v.verify(t1)
    assert v.verify(t2).expires_at == T0 + 7200


def test_token_secret_none_keeps_previous_for_the_window_only(keys):
    clock = Clock()
    v = trusting(keys, "rsa", clock=clock, overlap_seconds=100)
    token = sign(legacy(), keys["rsa"])
    v.keys.set_token_secrets(CLUSTER, "node-bootstrapper-token-g96rw")
    v.keys.set_token_secrets(CLUSTER, None)
    assert v.verify(token)
    clock.now = T0 + 100
    with pytest.raises(JwtRefused):
        v.verify(token)


def test_signing_key_rotation_overlap(keys):
    clock = Clock()
    v = make_verifier(clock, overlap_seconds=3600)
    v.keys.set_keys(CLUSTER, jwks_of(keys["rsa"]))
    old = sign(legacy(), keys["rsa"])
    new = sign(legacy(), keys["ec"])
    assert v.verify(old)
    with pytest.raises(JwtRefused):
        v.verify(new)
    clock.now = T0 + 10
    v.keys.set_keys(CLUSTER, jwks_of(keys["ec"]))  # rotation: rsa retired at T0+10
    assert [k.alg for k in v.keys.trusted_keys(CLUSTER)] == ["ES256", "RS256"]
    assert v.keys.next_expiry(CLUSTER) == T0 + 3610
    clock.now = T0 + 3609
    assert v.verify(old).cluster == CLUSTER
    assert v.verify(new).cluster == CLUSTER
    clock.now = T0 + 3610
    with pytest.raises(JwtRefused):
        v.verify(old)
    assert v.verify(new).cluster == CLUSTER
    assert [k.alg for k in v.keys.trusted_keys(CLUSTER)] == ["ES256"]
    # A key that left for good is not one this replica may have yet to read: its tokens stay
    # 4xx, before and after the next key change drops it from the retired keys.
    for _ in range(2):
        with pytest.raises(JwtRefused) as err:
            v.verify(old)
        assert err.value.status == 403 and not isinstance(err.value, JwtUnknownKey)
        v.keys.set_keys(CLUSTER, jwks_of(keys["ec"]))
    v.keys.set_keys(CLUSTER, jwks_of(keys["ec"], keys["rsa"]))  # listed again: accepted again
    assert v.verify(old).cluster == CLUSTER


def test_rotating_back_restores_a_retired_key(keys):
    clock = Clock()
    v = make_verifier(clock, overlap_seconds=10)
    v.keys.set_keys(CLUSTER, keys["rsa"].public_key())
    v.keys.set_keys(CLUSTER, keys["ec"].public_key())
    v.keys.set_keys(CLUSTER, [keys["rsa"].public_key(), keys["ec"].public_key()])
    clock.now = T0 + 1000
    assert v.verify(sign(legacy(), keys["rsa"]))


# ------------------------------------------------------------------ cache
def test_second_verify_is_a_cache_hit(keys):
    v = trusting(keys, "rsa", "ec")
    token = sign(bound(), keys["ec"])
    first = v.verify(token)
    assert (v.stats.cache_hits, v.stats.cache_misses, v.stats.signature_checks) == (0, 1, 1)
    assert v.verify(token) is first
    assert verify_for_cluster(v, token, CLUSTER) is first
    assert (v.stats.cache_hits, v.stats.cache_misses, v.stats.signature_checks) == (2, 1, 1)


def test_cached_token_refused_after_secret_window(keys):
    clock = Clock()
    v = trusting(keys, "rsa", clock=clock, overlap_seconds=300)
    token = sign(legacy(secret="s-old"), keys["rsa"])
    v.keys.set_token_secrets(CLUSTER, "s-old")
    v.verify(token)
    v.keys.set_token_secrets(CLUSTER, "s-new")
    v.verify(token)  # re-verified (generation changed), cached with the window's end
    hits = v.stats.cache_hits
    clock.now = T0 + 200
    v.verify(token)
    assert v.stats.cache_hits == hits + 1
    clock.now = T0 + 300
    with pytest.raises(JwtRefused):
        v.verify(token)


def test_cached_token_refused_after_key_window_and_removal(keys):
    clock = Clock()
    v = make_verifier(clock, overlap_seconds=300)
    v.keys.set_keys(CLUSTER, keys["rsa"].public_key())
    token = sign(legacy(), keys["rsa"])
    v.verify(token)
    v.keys.set_keys(CLUSTER, keys["ec"].public_key())
    v.verify(token)
    v.verify(token)
    assert v.stats.cache_hits >= 1
    clock.now = T0 + 300
    with pytest.raises(JwtRefused):
        v.verify(token)
    # a removal with no overlap takes effect on the next request, cached or not
    w = make_verifier(clock, overlap_seconds=0)
    w.keys.set_keys(CLUSTER, keys["rsa"].public_key())
    w.verify(token)
    w.verify(token)
    assert w.stats.cache_hits == 1
    w.keys.set_keys(CLUSTER, keys["ec"].public_key())
    with pytest.raises(JwtRefused):
        w.verify(token)
    w.keys.set_keys(CLUSTER, keys["rsa"].public_key())
    w.keys.remove_cluster(CLUSTER)
    with pytest.raises(JwtRefused):
        w.verify(token)


def test_cached_token_does_not_outlive_exp(keys):
    clock = Clock()
    v = trusting(keys, "ec", clock=clock, leeway_seconds=0)
    token = sign(bound(exp=int(T0 + 100)), keys["ec"])
    v.verify(token)
    clock.now = T0 + 99
    v.verify(token)
    assert v.stats.cache_hits == 1
    clock.now = T0 + 100
    with pytest.raises(JwtRefused, match="expired"):
        v.verify(token)


def test_cache_is_bounded(keys):
    v = trusting(keys, "ec", cache_size=3)
    tokens = [sign(bound(jti=str(i)), keys["ec"]) for i in range(5)]
    for t in tokens:
        v.verify(t)
    v.verify(tokens[0])
    assert v.stats.cache_hits == 0  # evicted
    v.verify(tokens[4])
    assert v.stats.cache_hits == 1


# ------------------------------------------------------------------ transport encoding
def test_decode_transport_token(keys):
    token = sign(legacy(), keys["rsa"])
    std = base64.b64encode(token.encode()).decode()
    assert is_transport_jwt(std) and not is_transport_jwt(base64.b64encode(b"5f1e8c1a-opaque").decode())
    assert decode_transport_token(std) == token
    assert decode_transport_token(std.rstrip("=")) == token
    assert decode_transport_token(std.replace("+", " ")) == token  # form-decoded '+'
    assert decode_transport_token(base64.urlsafe_b64encode(token.encode()).decode()) == token
    for bad in ["", token, "%%%", base64.b64encode(b"hello").decode(), "A" * 70000]:
        with pytest.raises(JwtRefused) as err:
            decode_transport_token(bad)
        assert err.value.status == 401


def test_seed_example_prefix_is_an_rs256_header():
    # The seed's URL: token=ZXlKaGJHY2lPaUpTVXpJMU5pSXNJb... is base64 of a JWT whose header
    # starts {"alg":"RS256","ki... (the verifier's expected transport shape).
    head = base64.b64decode("ZXlKaGJHY2lPaUpTVXpJMU5pSXNJbXRwWkNJNkls").decode()
    assert base64.urlsafe_b64decode(head[:24] + "=" * (-len(head[:24]) % 4)).startswith(b'{"alg":"RS256","ki')


def test_configure_change_invalidates_cached_acceptance(keys):
    v = trusting(keys, "rsa")
    token = sign(legacy(), keys["rsa"])
    v.verify(token)
    v.verify(token)
    assert v.stats.cache_hits == 1
    v.keys.configure(CLUSTER, issuers=[BOUND_ISSUER], allowed_accounts=[("openshift-machine-config-operator", "node-bootstrapper")])
    with pytest.raises(JwtRefused, match="namespace"):
        v.verify(token)
