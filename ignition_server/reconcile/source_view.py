"""A source read once, seen as the reconciler sees it: for one-shot commands
(`ignition-server render`, `ignition-server userdata`), which print what `serve` would serve
without running it.

From one listing: the release catalog and the MCO bases in the reconciler's own indexes
(releases.py, bases.py; a catalog counts only from a shared namespace, as tenancy.py rules),
a NodePool's newest live token Secret, and its render inputs gathered as a render gathers
them (gather.py's `gather_for_render`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

from ..model.objects import ObjectKey
from ..model.token_secret import TokenSecret, is_token_secret, newest_live, parse_token_secret
from ..render.inputs import NodePoolInputs
from .bases import BaseIndex, is_base
from .gather import gather_for_render
from .inputs import Lookup
from .releases import ReleaseCatalog, Releases, is_catalog
from .tenancy import Tenancy


@dataclass(frozen=True)
class SourceView:
    objects: Mapping[ObjectKey, dict[str, Any]]  # as the source keeps them (large values as digests)
    get_full: Lookup  # an object whole
    catalog: ReleaseCatalog
    bases: BaseIndex
    tenancy: Tenancy | None  # None: catalogs from any namespace

    @classmethod
    def of(cls, objects: Mapping[ObjectKey, dict[str, Any]], get_full: Lookup,
           tenancy: Tenancy | None = None) -> SourceView:
        """The view of one listing (`FileSource.read_once()` and its `get_full`)."""
        catalog = ReleaseCatalog()
        bases = BaseIndex()
        tenancy = tenancy.reading(objects.get) if tenancy is not None else None  # the shareable mark
        for key, obj in objects.items():
            if is_catalog(obj) and (tenancy is None or tenancy.is_shared(key.namespace)):
                catalog.update(key, get_full(key))
            if is_base(obj):
                bases.update(key, obj)
        return cls(objects, get_full, catalog, bases, tenancy)

    def newest_secret(self, nodepool: str, now: float | None = None) -> TokenSecret:
        """The NodePool's newest token Secret not expired; LookupError (naming those known) when none."""
        now = time.time() if now is None else now
        secrets = [parse_token_secret(o) for o in self.objects.values() if is_token_secret(o)]
        newest = newest_live((s for s in secrets if s.nodepool == nodepool), now)
        if newest is None:
            known = sorted({s.nodepool for s in secrets})
            raise LookupError(f"no token Secret for NodePool {nodepool}; known: {', '.join(known) or 'none'}")
        return newest

    def render_inputs(self, secret: TokenSecret) -> NodePoolInputs:
        """What a render of the NodePool reads, gathered as the reconciler gathers it."""
        obj = self.get_full(secret.key)
        if obj is None:
            raise LookupError(f"{secret.ref} is no longer in the source")
        return gather_for_render(secret, obj, self.get_full, Releases(self.catalog), self.bases, tenancy=self.tenancy)
