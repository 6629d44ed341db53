"""Registry mirrors: `--registry-overrides src=dst,...` and ImageDigestMirrorSet / ImageTagMirrorSet.

A source matches an image when it is the image's `host/repository` or a prefix of it at a
`/` boundary. Mirrors are tried in the order configured, then the origin (unless a mirror
set says `NeverContactSource`). A mirror that failed is tried last for a while (an
availability cache), so the choice is stable rather than re-probed on every reconcile.
The rendered payload names the first configured mirror: that depends on configuration
only, so every replica renders the same bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .allowed import AllowedRegistries
from .reference import Reference, ReferenceError, parse

IDMS, ITMS = "ImageDigestMirrorSet", "ImageTagMirrorSet"
MIRROR_KINDS = (IDMS, ITMS)
UNAVAILABLE_FOR = 300.0


@dataclass(frozen=True)
class MirrorRule:
    source: str
    mirrors: tuple[str, ...]
    digests: bool = True  # applies to images pulled by digest
    tags: bool = True  # applies to images pulled by tag
    never_source: bool = False

    def matches(self, ref: Reference) -> bool:
        name = ref.name
        return (name == self.source or name.startswith(self.source + "/")) and (self.digests if ref.digest else self.tags)

    def mirrored(self, ref: Reference) -> list[Reference]:
        rest = ref.name[len(self.source) :]
        found = []
        for mirror in self.mirrors:
            try:
                moved = parse(mirror + rest + "@" + ref.digest if ref.digest else mirror + rest + ":" + (ref.tag or "latest"))
            except ReferenceError:
                continue
            found.append(moved)
        return found


def parse_overrides(text: str) -> tuple[MirrorRule, ...]:
    """`--registry-overrides`: `src=dst[,src=dst...]`, as HyperShift spells it."""
    rules = []
    for item in (part.strip() for part in (text or "").split(",")):
        if not item:
            continue
        source, sep, mirror = item.partition("=")
        if not sep or not source.strip() or not mirror.strip():
            raise ValueError(f"--registry-overrides: {item!r} is not SOURCE=MIRROR")
        rules.append(MirrorRule(source.strip().rstrip("/"), (mirror.strip().rstrip("/"),)))
    return tuple(rules)


def is_mirror_set(obj: Mapping[str, Any] | None) -> bool:
    if not obj:
        return False
    return obj.get("kind") in MIRROR_KINDS


def parse_mirror_set(obj: Mapping[str, Any]) -> tuple[MirrorRule, ...]:
    kind = obj.get("kind")
    field_name = "imageDigestMirrors" if kind == IDMS else "imageTagMirrors"
    entries = (obj.get("spec") or {}).get(field_name) or []
    if not isinstance(entries, list):
        raise ValueError(f"{kind}.spec.{field_name} must be a list")
    rules = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("source"), str):
            raise ValueError(f"{kind}.spec.{field_name}[{index}] needs a source")
        mirrors = entry.get("mirrors") or []
        if not isinstance(mirrors, list) or not all(isinstance(m, str) and m for m in mirrors):
            raise ValueError(f"{kind}.spec.{field_name}[{index}].mirrors must be a list of names")
        rules.append(MirrorRule(
            entry["source"].rstrip("/"), tuple(m.rstrip("/") for m in mirrors),
            digests=kind == IDMS, tags=kind == ITMS,
            never_source=entry.get("mirrorSourcePolicy") == "NeverContactSource",
        ))
    return tuple(rules)


_REWRITES_KEPT = 4096  # release component images: a few dozen per release


@dataclass
class Mirrors:
    overrides: tuple[MirrorRule, ...] = ()
    clock: Callable[[], float] = time.monotonic
    # --registry-allow: an origin not on it is never contacted (its configured mirrors are);
    # None: every registry (a library default; the CLI always sets one).
    allowed: AllowedRegistries | None = None
    _by_object: dict[Any, tuple[MirrorRule, ...]] = field(default_factory=dict)
    _down_until: dict[str, float] = field(default_factory=dict)  # registry host -> when to prefer it again
    # `rewrite`'s answers until the rules change: every NodePool's reconcile asks it for the
    # same few release images (at 5,280 NodePools a restart spent ~2 s of the owner's CPU
    # parsing and matching them again).
    _rewritten: dict[str, str] = field(default_factory=dict)

    def update(self, key: Any, obj: Mapping[str, Any] | None) -> bool:
        """Apply a mirror set's change (None: deleted); whether the rules changed. Raises ValueError if invalid."""
        before = self._by_object.get(key)
        if obj is None or not is_mirror_set(obj):
            self._by_object.pop(key, None)
        else:
            self._by_object[key] = parse_mirror_set(obj)
        changed = self._by_object.get(key) != before
        if changed:
            self._rewritten.clear()
        return changed

    def _rules(self, ref: Reference) -> list[MirrorRule]:
        rules = [r for r in self.overrides if r.matches(ref)]
        for key in sorted(self._by_object, key=str):
            rules += [r for r in self._by_object[key] if r.matches(ref)]
        return rules

    def configured(self, ref: Reference) -> list[Reference]:
        """Mirrors in configured order, then the origin (when allowed)."""
        rules = self._rules(ref)
        found: list[Reference] = []
        for rule in rules:
            found += [m for m in rule.mirrored(ref) if m not in found]
        if not any(rule.never_source for rule in rules):
            found.append(ref)
        return found

    def candidates(self, ref: Reference) -> list[Reference]:
        """`configured`, with registries that failed lately moved to the end (stable order otherwise)."""
        now = self.clock()
        found = [r for r in self.configured(ref) if r != ref or self.allowed is None or self.allowed.allows(ref)]
        return sorted(found, key=lambda r: self._down_until.get(r.api_host, 0.0) > now)

    def refusal(self, ref: Reference) -> str:
        """Why `ref` has no candidate: its registry is not allowed and nothing mirrors it."""
        allowed = self.allowed.describe() if self.allowed is not None else "*"
        return (f"{ref.name} is not on a registry this server may read from (--registry-allow: {allowed}) and no "
                f"mirror is configured for it: refused, nothing fetched")

    def rewrite(self, image: str) -> str:
        """The image pull spec the payload names: its first configured mirror, or itself."""
        known = self._rewritten.get(image)
        if known is not None:
            return known
        try:
            ref = parse(image)
        except ReferenceError:
            return image
        configured = self.configured(ref)
        named = str(configured[0]) if configured and configured[0] != ref else image
        if len(self._rewritten) >= _REWRITES_KEPT:
            self._rewritten.clear()
        self._rewritten[image] = named
        return named

    def failed(self, host: str) -> None:
        self._down_until[host] = self.clock() + UNAVAILABLE_FOR

    def worked(self, host: str) -> None:
        self._down_until.pop(host, None)
