"""`ignition-server render`: a NodePool's payload as `serve` would serve it, printed.

The directory is read once and seen as the reconciler sees it (reconcile/source_view.py): the
same release catalog, MCO bases and gathering of inputs, then the same pure renderer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..reconcile.source_view import SourceView
from ..reconcile.tenancy import Tenancy
from ..render.payload import render_payload
from ..render.spec import (
    SUPPORTED_VERSIONS,
    UnsatisfiableVersion,
    accept_for,
    body_version,
    negotiate,
    unsatisfiable_reason,
    with_version,
)
from ..sources.files import FileSource


def run(args: argparse.Namespace) -> int:
    tenancy = Tenancy(frozenset(n.strip() for n in args.shared_namespaces.split(",") if n.strip()))
    source = FileSource(Path(args.source))
    view = SourceView.of(source.read_once(), source.get_full, tenancy)
    secret = view.newest_secret(args.nodepool)
    rendered = render_payload(view.render_inputs(secret))
    body = rendered.body
    if args.spec_version:
        if args.spec_version not in SUPPORTED_VERSIONS:
            print(f"error: --spec-version {args.spec_version} is not one of {', '.join(SUPPORTED_VERSIONS)}", file=sys.stderr)
            return 2
        try:
            body = with_version(body, negotiate(accept_for(args.spec_version), body_version(body)))
        except UnsatisfiableVersion:
            print(f"error: {unsatisfiable_reason(accept_for(args.spec_version), body)}", file=sys.stderr)
            return 2
    sys.stdout.write(body.decode() + "\n")
    for note in rendered.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0
