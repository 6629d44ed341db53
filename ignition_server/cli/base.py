"""`ignition-server base import`: an MCO base configuration (a bootstrap's MachineConfigs, or a
machine-config-server's Ignition) as the ConfigMap the server reads (base_import.py)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from ..base_import import base_configmap, from_bootstrap_documents, from_mcs_config
from ..fsio import atomic_write


def run(args: argparse.Namespace) -> int:
    where = Path(args.source)
    if where.is_dir():
        texts = [(str(p), p.read_text(encoding="utf-8")) for p in sorted(where.rglob("*"))
                 if p.is_file() and p.suffix in (".yaml", ".yml", ".json")]
        machineconfigs = from_bootstrap_documents(texts)
    else:
        text = where.read_text(encoding="utf-8")
        machineconfigs = from_mcs_config(text) if text.lstrip().startswith("{") else from_bootstrap_documents([(str(where), text)])
    tail = args.release_version or args.release.rpartition(":")[2][:12]
    name = args.name or "mco-base-" + re.sub(r"[^a-z0-9-]+", "-", tail.lower()).strip("-")
    configmap = base_configmap(machineconfigs, name=name, namespace=args.namespace,
                               release=args.release, version=args.release_version)
    text = yaml.safe_dump(configmap, sort_keys=False)
    if args.output:
        atomic_write(Path(args.output), text.encode(), 0o644)
    else:
        sys.stdout.write(text)
    print(f"{len(machineconfigs)} MachineConfig(s): {', '.join(mc['metadata']['name'] for mc in machineconfigs)}", file=sys.stderr)
    return 0
