"""The wall between tenants: which namespaces may shape a NodePool's payload.

One server serves every hosted cluster of a management cluster, so it must be as safe as
one server per control-plane namespace (DESIGN §9). A NodePool's inputs (pull secret,
kubeconfig, CA bundles, proxy, IBM and apiserver-proxy settings, bases, service-account
keys) come from its own namespace (its token Secret's) or, named by an `input-*` annotation,
from a namespace the operator names as shared (`--shared-namespaces`; by default the
server's own) and then only an object the operator marked for it
(`ignition-server.openshift.io/shareable: "true"`): a shared namespace, the server's own
above all, also holds what is not for tenants (the server's image pull secret, a management
kubeconfig). Objects that shape every NodePool of a release (release catalogs, published
generated bases) and mirror sets count only from shared namespaces (they are the server's
own, never read through `input-*`). A reference outside is refused before anything is
fetched (judged on what the source keeps: the Kubernetes source keeps an object of a shared
namespace only if it is marked, or if the server reads it for itself): the NodePool gets
`InvalidConfig` saying why.

Checked where references are resolved (reconcile time), never on the serving path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from ..model.objects import ManifestError, ObjectKey, annotations_of
from ..model.token_secret import TokenSecret
from ..sources.events import Change

ANNOTATION_SHAREABLE = "ignition-server.openshift.io/shareable"


class OutsideTenancy(ManifestError):
    """A token Secret names an object its namespace may not read; the message says why.
    `key`: the object, when it is in a shared namespace and only its mark is missing (the
    NodePool is judged again when that object changes: the operator may mark it)."""

    def __init__(self, message: str, key: ObjectKey | None = None) -> None:
        super().__init__(message)
        self.key = key


def is_shareable(obj: Mapping[str, Any] | None) -> bool:
    """The operator marked the object as one that other namespaces' NodePools may name."""
    return obj is not None and str(annotations_of(obj).get(ANNOTATION_SHAREABLE, "")).strip().lower() == "true"


@dataclass(frozen=True)
class Tenancy:
    shared: frozenset[str] = frozenset()
    # The objects as the source keeps them (metadata is enough), to see the shareable mark.
    # None: nothing in another namespace is known to be marked, so no such reference is taken.
    lookup: Callable[[ObjectKey], Mapping[str, Any] | None] | None = None

    def reading(self, lookup: Callable[[ObjectKey], Mapping[str, Any] | None]) -> Tenancy:
        """This tenancy judging marks on `lookup`'s objects (unless it has a lookup already)."""
        return self if self.lookup is not None else replace(self, lookup=lookup)

    def is_shared(self, namespace: str) -> bool:
        return namespace in self.shared

    def offers(self, obj: Mapping[str, Any]) -> bool:
        """An object other namespaces may name: marked shareable, in a shared namespace. (The
        Kubernetes source keeps these whole; other objects of a shared namespace it reads only
        if the server itself does.)"""
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        return self.is_shared(namespace) and is_shareable(obj)

    def may_read(self, cluster_namespace: str, namespace: str) -> bool:
        """Whether a NodePool whose token Secret lives in `cluster_namespace` may read from `namespace`."""
        return namespace == cluster_namespace or namespace in self.shared

    def check(self, cluster_namespace: str, kind: str, namespace: str, name: str, what: str) -> None:
        """Raise OutsideTenancy unless `namespace/name` may be read for `cluster_namespace`'s
        NodePools: its own namespace, or a shared one's `kind` object marked shareable."""
        if not self.may_read(cluster_namespace, namespace):
            raise OutsideTenancy(
                f"{what} names {namespace}/{name}, outside the NodePool's namespace {cluster_namespace} and the "
                f"shared namespaces ({self.describe()}): refused, not read; put the object in {cluster_namespace} "
                f"or have the operator list {namespace} in --shared-namespaces"
            )
        if namespace == cluster_namespace:
            return
        key = ObjectKey(kind, namespace, name)
        if self.lookup is None or not is_shareable(self.lookup(key)):
            raise OutsideTenancy(
                f"{what} names {kind} {namespace}/{name}, in the shared namespace {namespace} but not marked "
                f"shareable (or not there): refused, not read; only an object the operator annotates "
                f'{ANNOTATION_SHAREABLE}: "true" may be named from another namespace', key)

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
