"""Kubernetes mode: the source over a live API server, and the Lease that elects the writer."""

from .client import KubeClient, KubeError
from .lease import LeaderElector
from .source import KubeSource

__all__ = ["KubeClient", "KubeError", "KubeSource", "LeaderElector"]
