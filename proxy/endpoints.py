"""Backends from Kubernetes: the ready endpoints of an ignition-server Service's EndpointSlices.

A route with `endpoints: {namespace, service, port}` instead of (or besides) `backends`
takes its servers from the Service's EndpointSlices (`kubernetes.io/service-name` label),
read on every sync; the addresses go into the route's slots through the runtime API, so pods
coming and going never reload HAProxy.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ignition_server.sources.kube.client import KubeClient

from .table import Backend, Endpoints


def backends_from_slices(slices: list[dict[str, Any]], port: int | str) -> tuple[Backend, ...]:
    """Ready endpoint addresses with the Service's target port (a number, or a port name
    looked up in each slice). Pure."""
    out: set[Backend] = set()
    for item in slices:
        if isinstance(port, int):
            number: int | None = port
        else:
            number = next((p.get("port") for p in item.get("ports") or () if p.get("name") == port), None)
        if not isinstance(number, int):
            continue
        for endpoint in item.get("endpoints") or ():
            if (endpoint.get("conditions") or {}).get("ready") is False:  # absent means ready
                continue
            for address in endpoint.get("addresses") or ():
                try:
                    out.add(Backend(str(ipaddress.ip_address(address)), number))
                except ValueError:
                    continue
    return tuple(sorted(out, key=lambda b: (ipaddress.ip_address(b.host).version, b.host, b.port)))


async def list_backends(kube: KubeClient, endpoints: Endpoints) -> tuple[Backend, ...]:
    body = await kube.request(
        "list", "GET", f"/apis/discovery.k8s.io/v1/namespaces/{endpoints.namespace}/endpointslices",
        query={"labelSelector": f"kubernetes.io/service-name={endpoints.service}"})
    return backends_from_slices(list((body or {}).get("items") or []), endpoints.port)
