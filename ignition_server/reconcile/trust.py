"""Which service-account JWTs each hosted cluster accepts, kept up to date from the source.

A hosted cluster (identified by its control plane namespace, where its token Secrets live)
publishes its service-account *public* keys in a ConfigMap (or Secret) annotated
`ignition-server.openshift.io/service-account-keys: "true"`:

    data:
      jwks.json: <the JWKS the hosted API server serves at /openid/v1/jwks>   # and/or
      sa.pub:    <PEM public key(s)>                                          # any *.pub / *.pem key
      issuer:    <the cluster's --service-account-issuer, for bound tokens>   # optional
      token-secret-name: node-bootstrapper-token-abcde                        # optional: the current token Secret

A Secret that holds a private key is refused as a whole: this server never holds a
cluster's signing key (HyperShift's `sa-signing-key` Secret must not be pointed at).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from ..auth.claims import TokenSecretRef
from ..auth.cluster_keys import ClusterKeys
from ..auth.jwks import load_public_keys
from ..model.objects import ManifestError, ObjectKey, annotations_of, data_text
from ..sources.events import Change
from .claims import Claims, key_claim

log = logging.getLogger("ignition_server.reconcile.trust")

ANNOTATION_SERVICE_ACCOUNT_KEYS = "ignition-server.openshift.io/service-account-keys"
_KEY_SUFFIXES = (".pub", ".pem")


def is_trust_object(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") in ("ConfigMap", "Secret") and str(
        annotations_of(obj).get(ANNOTATION_SERVICE_ACCOUNT_KEYS, "")
    ).lower() == "true"


class TrustWatcher:
    def __init__(self, keys: ClusterKeys, on_keys_changed: Callable[[], None] = lambda: None,
                 on_refused: Callable[[], None] = lambda: None, claims: Claims | None = None) -> None:
        self.keys = keys
        self.claims = claims  # contests decided before (this process, an earlier one, another replica)
        self._on_keys_changed = on_keys_changed
        self._on_refused = on_refused  # counts a key set refused for being another cluster's
        self._providers: dict[str, ObjectKey] = {}  # cluster -> the object its keys came from

    def handle(self, change: Change) -> None:
        cluster = change.key.namespace
        if change.type == "DELETED" or not is_trust_object(change.obj):
            if self._providers.get(cluster) == change.key:
                del self._providers[cluster]
                self.keys.remove_cluster(cluster)
                if self.claims is not None:
                    self.claims.release(cluster)  # its keys are no one's now
                log.info("no service-account keys for %s any more: its JWTs are refused", cluster)
                self._on_keys_changed()
            return
        provider = self._providers.setdefault(cluster, change.key)
        if provider != change.key:
            log.error("%s: %s already publishes the service-account keys of %s; ignored", change.key, provider, cluster)
            return
        try:
            values = data_text(change.obj)
        except ManifestError as exc:
            log.error("%s: cannot read service-account keys, keeping the last good ones: %s", change.key, exc)
            return
        if any("PRIVATE KEY" in value for value in values.values()):
            log.error("%s holds a private key: refused; publish only public keys", change.key)
            return
        sources: list[str] = [values["jwks.json"]] if values.get("jwks.json", "").strip() else []
        sources += [v for k, v in sorted(values.items()) if k.endswith(_KEY_SUFFIXES) and v.strip()]
        if not sources:
            log.error("%s has no jwks.json and no *.pub/*.pem key: keeping the last good keys", change.key)
            return
        try:
            if self._held_by_another(change.key, cluster, sources):
                return
            issuer = values.get("issuer", "").strip()
            self.keys.configure(cluster, issuers=[issuer] if issuer else [])
            keys = self.keys.set_keys(cluster, sources)
        except ValueError as exc:
            log.error("%s: unusable service-account keys, keeping the last good ones: %s", change.key, exc)
            return
        self._on_keys_changed()
        secret_name = values.get("token-secret-name", "").strip()
        if secret_name:
            self.keys.set_token_secrets(cluster, TokenSecretRef(name=secret_name))
        log.info("service-account keys for %s: %d key(s)%s", cluster, len(keys), f", token Secret {secret_name}" if secret_name else "")

    def _held_by_another(self, key: ObjectKey, cluster: str, sources: list[str]) -> bool:
        """A key another cluster already trusts, or was found to hold in an earlier contest
        (`claims`: across restarts and replicas), is that cluster's: refused here (the newcomer),
        so a copy of a cluster's public key published elsewhere never makes its tokens ambiguous
        (they would verify under two clusters, and be refused), whatever the copy's age."""
        holders: dict[str, str] = {}
        for fingerprint in {k.fingerprint for k in load_public_keys(sources)}:
            holder = self.claims.holder(key_claim(fingerprint)) if self.claims is not None else None
            if holder is None:  # no contest decided before: whoever trusts it now holds it
                trusting = self.keys.clusters_holding([fingerprint], besides=cluster)
                holder = min(trusting) if trusting else None
            if holder is not None and holder != cluster:
                holders[fingerprint] = holder
        if not holders:
            return False
        if self.claims is not None:
            for fingerprint, holder in holders.items():
                self.claims.record(key_claim(fingerprint), holder)
        log.error("%s publishes a service-account key that %s already trusts: refused for %s, keeping its last good keys",
                  key, ", ".join(sorted(set(holders.values()))), cluster)
        self._on_refused()
        return True
