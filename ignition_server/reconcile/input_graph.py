"""Which objects each token Secret reads, and which token Secrets read each object.

A change to one object re-renders exactly the NodePools that read it: `gather` says what a
render read, `track` records it, and `readers_of` answers the handler. Release and generated
base waits ask it which releases are read at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.objects import ObjectKey


@dataclass
class InputGraph:
    _reads: dict[ObjectKey, frozenset[ObjectKey]] = field(default_factory=dict)  # token Secret -> what it reads
    _readers: dict[ObjectKey, set[ObjectKey]] = field(default_factory=dict)  # object -> token Secrets reading it
    _canonical: dict[ObjectKey, ObjectKey] = field(default_factory=dict)  # the one key object of each dependency
    # The one set of each distinct dependency set: a cluster's NodePools mostly read the same
    # objects (its pull secret, kubeconfig, base, the catalog, the release): at the seeds' fleet
    # 5,280 sets of ~14 keys (~1 KB each) were ~440 distinct ones. A set no NodePool
    # reads any more goes with its last reader (the count).
    _sets: dict[frozenset[ObjectKey], tuple[frozenset[ObjectKey], int]] = field(default_factory=dict)

    def track(self, key: ObjectKey, deps: frozenset[ObjectKey]) -> None:
        """The token Secret `key` reads `deps` now (and nothing else)."""
        previous = self._reads.get(key, frozenset())
        if previous == deps:
            return
        # One key object per dependency, shared by every NodePool that reads it: at the seeds'
        # scale ~74,000 keys were ~6,000 distinct ones (12 NodePools read each namespace's).
        deps = frozenset(self._canonical.setdefault(dep, dep) for dep in deps)
        deps = self._share(deps, previous)
        for dep in previous - deps:
            readers = self._readers.get(dep)
            if readers is not None:
                readers.discard(key)
                if not readers:
                    del self._readers[dep]
                    self._canonical.pop(dep, None)
        for dep in deps - previous:
            self._readers.setdefault(dep, set()).add(key)
        if deps:
            self._reads[key] = deps
        else:
            self._reads.pop(key, None)

    def _share(self, deps: frozenset[ObjectKey], previous: frozenset[ObjectKey]) -> frozenset[ObjectKey]:
        """The one set equal to `deps`, counted once more; `previous` counted once less."""
        if previous:
            shared, count = self._sets[previous]
            if count > 1:
                self._sets[previous] = (shared, count - 1)
            else:
                del self._sets[previous]
        if not deps:
            return deps
        shared, count = self._sets.get(deps, (deps, 0))
        self._sets[shared] = (shared, count + 1)
        return shared

    def forget(self, key: ObjectKey) -> None:
        """The token Secret `key` is gone: it reads nothing any more."""
        self.track(key, frozenset())

    def reads(self, key: ObjectKey, dependency: ObjectKey) -> bool:
        return dependency in self._reads.get(key, ())

    def is_read(self, dependency: ObjectKey) -> bool:
        return dependency in self._readers

    def readers_of(self, dependency: ObjectKey) -> list[ObjectKey]:
        """The token Secrets that read `dependency` (a copy: rendering them may change the graph)."""
        return list(self._readers.get(dependency, ()))

    def objects_read(self) -> list[ObjectKey]:
        return list(self._readers)

    def releases_read(self) -> list[ObjectKey]:
        """The releases (kind "Release", named by pull spec) some NodePool reads."""
        return [dep for dep in self._readers if dep.kind == "Release"]
