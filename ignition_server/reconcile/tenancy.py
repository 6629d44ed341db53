"""The wall between tenants: which namespaces may shape a NodePool's payload.

One server serves every hosted cluster of a management cluster, so it must be as safe as
one server per control-plane namespace (DESIGN §9). A NodePool's inputs (pull secret,
kubeconfig, CA bundles, proxy, IBM and apiserver-proxy settings, bases, service-account
keys) come from its own namespace (its token Secret's) or from a namespace the operator
names as shared (`--shared-namespaces`; by default the server's own). Objects that shape
every NodePool of a release (release catalogs, published generated bases) and mirror sets
count only from shared namespaces. A reference outside is refused before anything is
fetched: the NodePool gets `InvalidConfig` saying why.

Checked where references are resolved (reconcile time), never on the serving path.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.objects import ManifestError
from ..model.token_secret import TokenSecret
from ..sources.events import Change


class OutsideTenancy(ManifestError):
    """A token Secret names an object its namespace may not read; the message says why."""


@dataclass(frozen=True)
class Tenancy:
    shared: frozenset[str] = frozenset()

    def is_shared(self, namespace: str) -> bool:
        return namespace in self.shared

    def may_read(self, cluster_namespace: str, namespace: str) -> bool:
        """Whether a NodePool whose token Secret lives in `cluster_namespace` may read from `namespace`."""
        return namespace == cluster_namespace or namespace in self.shared

    def check(self, cluster_namespace: str, namespace: str, name: str, what: str) -> None:
        """Raise OutsideTenancy unless `namespace/name` may be read for `cluster_namespace`'s NodePools."""
        if not self.may_read(cluster_namespace, namespace):
            raise OutsideTenancy(
                f"{what} names {namespace}/{name}, outside the NodePool's namespace {cluster_namespace} and the "
                f"shared namespaces ({self.describe()}): refused, not read; put the object in {cluster_namespace} "
                f"or have the operator list {namespace} in --shared-namespaces"
            )

    def describe(self) -> str:
        return ", ".join(sorted(self.shared)) or "none"


def oldest_first(changes: list[Change]) -> list[Change]:
    """A batch (a first listing, above all) in creation order: where two objects claim one thing
    (a token, a service-account key), the first one wins, and a new replica listing everything
    at once must agree with one that saw them come one by one (a listing is in name order,
    which a tenant chooses). Objects without a creation time keep their order, after the others."""
    def created(change: Change) -> str:
        stamp = (change.obj.get("metadata") or {}).get("creationTimestamp") if change.obj else None
        return str(stamp) if stamp else "~"  # after any RFC 3339 time
    return sorted(changes, key=created)


def generation_group(secret: TokenSecret) -> tuple[str, str]:
    """The token Secrets that are generations of one NodePool: its annotation *and* the Secret's
    own namespace. The annotation alone is anyone's to write (HyperShift's names the NodePool's
    namespace, not the control plane's), so a Secret elsewhere claiming it outdates nothing here."""
    return (secret.key.namespace, secret.nodepool)
