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

from ..sources.manifests import ManifestError


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

