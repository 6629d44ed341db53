"""`ignition-server userdata`: a NodePool's pointer config (cloud user-data), printed, with
whether it fits each cloud's user-data limit."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..reconcile.source_view import SourceView
from ..render.userdata import fits, pointer_user_data
from ..sources.files import FileSource
from .settings import node_proxy


def run(args: argparse.Namespace) -> int:
    source = FileSource(Path(args.source))
    secret = SourceView.of(source.read_once(), source.get_full).newest_secret(args.nodepool)
    if not secret.token:
        raise LookupError(f"token Secret {secret.ref} holds no token yet")
    ca_file = Path(args.ca_file) if args.ca_file else Path(args.cache_dir) / "tls" / "ca.crt"
    user_data = pointer_user_data(
        source_url=args.public_url, token=secret.token, ca_pem=ca_file.read_bytes(), shape=args.shape,
        proxy=node_proxy(args) or None,
        nodepool=secret.nodepool,
    )
    sys.stdout.write(user_data.decode() + "\n")
    limits = fits(user_data)
    print(f"note: {len(user_data)} bytes; fits " + ", ".join(f"{cloud}: {'yes' if ok else 'no'}" for cloud, ok in limits.items()), file=sys.stderr)
    return 0
