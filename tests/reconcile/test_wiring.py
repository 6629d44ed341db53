"""The server talks to the reconciler through one small facade, wiring's Reconciliation: changes
in, the clock, the JWT directory, what was served or found missing, how many renders are queued
ahead of a NodePool's (its 503's Retry-After), drain. Not through its parts."""

from __future__ import annotations

import ast

from ignition_server.reconcile.wiring import Reconciliation
from testsupport import REPO

SURFACE = {"handle", "ingesting", "run_housekeeping", "directory", "payload_missing", "note_served", "drain",
           "tell_taken_over_hosts", "renders_ahead"}
PARTS = {"reconciler", "housekeeping"}  # Reconciliation's fields, for tests


def test_the_facade_is_what_the_server_uses() -> None:
    public = {name for name in vars(Reconciliation) if not name.startswith("_")} - PARTS
    assert public == SURFACE


def test_the_server_uses_the_reconciler_only_through_the_facade() -> None:
    """server.py reads nothing of a Reconciliation but its surface, and imports no part of the reconciler."""
    tree = ast.parse((REPO / "ignition_server" / "server.py").read_text())
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and (isinstance(node.value, ast.Name) and node.value.id == "reconciliation"
                 or isinstance(node.value, ast.Attribute) and node.value.attr == "reconciliation")}
    assert used and used <= SURFACE, used - SURFACE
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"reconcile.reconciler", "reconcile.housekeeping", "reconcile.token_secrets"}
