"""What of a token Secret's `config` the MCO's bootstrap consumes, not the payload's merge.

HyperShift's NodePool controller puts into `config` MachineConfigs and, beside them, the other
kinds its `defaultAndValidateConfigManifest` lets through (ImageContentSourcePolicy,
ImageDigestMirrorSet, ClusterImagePolicy, KubeletConfig, ContainerRuntimeConfig; an
ImageDigestMirrorSet for every cluster with `spec.imageContentSources`). HyperShift's ignition
server writes the whole `config` as `mcc/custom.yaml`, and `machine-config-controller bootstrap`
turns those kinds into its generated MachineConfigs (registries.conf, policy.json, kubelet.conf,
CRI-O drop-ins): they change the base, they are not items of their own. Here they go into the
generated base (basegen/steps.py), and their digest into its key (reconcile/generated_bases.py).

Finding them must be cheap (a restart looks at every NodePool's config before it knows its base
key): a document whose only top-level `kind:` line says MachineConfig is skipped unparsed, any
other document is parsed. Pure.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable

import yaml

from .. import bounded_yaml

# kind -> the apiVersions machine-config-controller's bootstrap decodes it from
# (pkg/controller/bootstrap/bootstrap.go): the kinds HyperShift's NodePool controller allows in a
# NodePool's config, and ImageTagMirrorSet and ImagePolicy, which the bootstrap reads the same way.
# (A v1alpha1 ClusterImagePolicy is decoded, then skipped as unhandled, as the reference does.)
CONSUMED_KINDS: dict[str, tuple[str, ...]] = {
    "ImageDigestMirrorSet": ("config.openshift.io/v1",),
    "ImageTagMirrorSet": ("config.openshift.io/v1",),
    "ImageContentSourcePolicy": ("operator.openshift.io/v1alpha1",),
    "ClusterImagePolicy": ("config.openshift.io/v1", "config.openshift.io/v1alpha1"),
    "ImagePolicy": ("config.openshift.io/v1", "config.openshift.io/v1alpha1"),
    "KubeletConfig": ("machineconfiguration.openshift.io/v1",),
    "ContainerRuntimeConfig": ("machineconfiguration.openshift.io/v1",),
}

# Each matched after a newline (the text is searched with one put first): a pattern that begins with
# a literal is found by a fast scan, where `^` with re.M tries every position (10x slower on 300 KiB).
_SEPARATOR = re.compile(r"\n(?:---|\.\.\.)[ \t]*(?:#[^\n]*)?(?=\n|\Z)")
_MACHINECONFIG = re.compile(r"""\nkind:[ \t]*(["']?)MachineConfig\1[ \t]*(?:#[^\n]*)?(?=\n|\Z)""")
# A document that is a block mapping at column 0 (its first line that is not blank, a comment or
# a directive): then every other line at column 0 is one of its keys, so its one `kind:` line is
# its kind. Anything else (a flow mapping, a tag, a list) is parsed.
_FIRST = re.compile(r"^(?![ \t]*(?:#|$)|%)(.*)$", re.M)
_BLOCK_KEY = re.compile(r"""^[A-Za-z0-9_"'][^:]*:(?:[ \t]|$)""")


def is_consumed(obj: Any) -> bool:
    """A document the MCO's bootstrap consumes (not a MachineConfig of the payload's merge)."""
    return isinstance(obj, dict) and obj.get("apiVersion") in CONSUMED_KINDS.get(str(obj.get("kind")), ())


@dataclass(frozen=True)
class BootstrapObjects:
    """The consumed documents of one `config`, in its order (the controller reads them so)."""

    documents: tuple[dict[str, Any], ...] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(sorted({str(d["kind"]) for d in self.documents}))

    @property
    def digest(self) -> str:
        """Part of the generated base's key: "" without any, so such a NodePool's key is as before."""
        if not self.documents:
            return ""
        return hashlib.sha256(json.dumps(self.documents, sort_keys=True, default=str).encode()).hexdigest()

    @property
    def text(self) -> str:
        """The documents as the controller's input (`mcc/custom.yaml`)."""
        return yaml.safe_dump_all(list(self.documents), sort_keys=False) if self.documents else ""

    def describe(self) -> str:
        return ", ".join(f"{d['kind']} {((d.get('metadata') or {}).get('name'))!r}" for d in self.documents)


NONE = BootstrapObjects()


def _documents(text: str) -> Iterable[str]:
    """Each document's text, with the newline that begins it (searched as _MACHINECONFIG is)."""
    text = "\n" + text
    start = 0
    for match in _SEPARATOR.finditer(text):
        yield text[start:match.start()]
        start = match.end()
    yield text[start:]


def _plainly_machineconfig(document: str) -> bool:
    first = _FIRST.search(document)
    if first is None or not _BLOCK_KEY.match(first.group(1)):
        return False
    return document.count("\nkind:") == 1 and _MACHINECONFIG.search(document) is not None


def bootstrap_objects(config_yaml: str) -> BootstrapObjects:
    """The consumed documents of a token Secret's `config` (a `kind: List`'s items too).

    A document that does not parse consumes nothing: the render refuses it, and says why, once."""
    parsed: list[Any] = []
    for document in _documents(config_yaml or ""):
        if not document.strip() or _plainly_machineconfig(document):
            continue
        try:
            parsed += bounded_yaml.load_all(document)
        except yaml.YAMLError:
            # Perhaps a `---` line that was not a separator (inside a quoted scalar): the whole, then.
            try:
                parsed = bounded_yaml.load_all(config_yaml)
            except yaml.YAMLError:
                return NONE
            break
    found: list[dict[str, Any]] = []
    for doc in parsed:
        items = doc["items"] if isinstance(doc, dict) and doc.get("kind") == "List" \
            and isinstance(doc.get("items"), list) else [doc]
        found += [item for item in items if is_consumed(item)]
    return BootstrapObjects(tuple(found)) if found else NONE
