"""Authenticated Ignition payload server for Red Hat CoreOS nodes."""

__version__ = "0.1.0"
