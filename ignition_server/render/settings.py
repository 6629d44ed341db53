"""ConfigMap data → typed renderer settings, with errors that name the key at fault. Pure.

`apiserver-proxy` (the node-local kube-apiserver HAProxy):
    listenIP: 172.20.0.1            listenPort: "6443"
    backends: "c100-1.example.com:32167,c100-2.example.com:32167"   # primaries
    backupBackends: "pub-1.example.com:32167"                         # optional, `backup` servers
    healthCheck: "GET /version"                                       # optional
    haproxy.cfg.tmpl: <an operator's template>                        # optional, see render/haproxy.py

`ibmcloud-vpc` (IBM Cloud VPC Gen 2):
    clusterID, accountID, region, zones ("us-south-1,us-south-2"), privateEndpoints,
    publicEndpoints ("host:port,..."), proxyIP ("172.20.0.1"), proxyPort ("2040"),
    privateServiceEndpoint / publicServiceEndpoint ("true"/"false"), registryHost, ntpServer,
    secondaryStorage ("luks"|"ext4"), workerIDField ("name"|"id")
"""

from __future__ import annotations

from typing import Any, Mapping

from .haproxy import HEALTH_CHECK_VERSION, ApiServerAccess, parse_backends
from .ibmcloud import IBMCloudSettings
from .inputs import InvalidConfig

HAPROXY_TEMPLATE_KEY = "haproxy.cfg.tmpl"

_IBM_KEYS = {
    "clusterID": "cluster_id",
    "accountID": "account_id",
    "region": "region",
    "zones": "zones",
    "privateEndpoints": "private_endpoints",
    "publicEndpoints": "public_endpoints",
    "proxyIP": "proxy_ip",
    "proxyPort": "proxy_port",
    "privateServiceEndpoint": "private_service_endpoint",
    "publicServiceEndpoint": "public_service_endpoint",
    "registryHost": "registry_host",
    "ntpServer": "ntp_server",
    "secondaryStorage": "secondary_storage",
    "workerIDField": "worker_id_field",
}
_BOOLEANS = {"true": True, "false": False}


def _port(value: str, key: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InvalidConfig(f"{key} must be a port number, got {value!r}") from None


def apiserver_access(data: Mapping[str, str]) -> ApiServerAccess:
    unknown = set(data) - {"listenIP", "listenPort", "backends", "backupBackends", "healthCheck", HAPROXY_TEMPLATE_KEY}
    if unknown:
        raise InvalidConfig(f"apiserver-proxy: unknown key(s) {', '.join(sorted(unknown))}")
    if not data.get("backends", "").strip():
        raise InvalidConfig("apiserver-proxy: backends is required (host:port,host:port,...)")
    backends = parse_backends(data["backends"]) + (
        parse_backends(data["backupBackends"], backup=True) if data.get("backupBackends", "").strip() else ()
    )
    return ApiServerAccess(
        listen_ip=data.get("listenIP", "172.20.0.1").strip(),
        listen_port=_port(data.get("listenPort", "6443").strip(), "apiserver-proxy listenPort"),
        backends=backends,
        health_check=data.get("healthCheck", HEALTH_CHECK_VERSION).strip(),
    )


def ibmcloud_settings(data: Mapping[str, str]) -> IBMCloudSettings:
    unknown = set(data) - set(_IBM_KEYS)
    if unknown:
        raise InvalidConfig(f"ibmcloud-vpc: unknown key(s) {', '.join(sorted(unknown))}")
    for required in ("clusterID", "accountID", "region"):
        if not data.get(required, "").strip():
            raise InvalidConfig(f"ibmcloud-vpc: {required} is required")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        field, text = _IBM_KEYS[key], value.strip()
        if key in ("privateServiceEndpoint", "publicServiceEndpoint"):
            if text.lower() not in _BOOLEANS:
                raise InvalidConfig(f"ibmcloud-vpc: {key} must be true or false, got {value!r}")
            kwargs[field] = _BOOLEANS[text.lower()]
        elif key == "proxyPort":
            kwargs[field] = _port(text, "ibmcloud-vpc proxyPort")
        elif key == "zones":
            kwargs[field] = tuple(z.strip() for z in text.split(",") if z.strip())
        elif key == "secondaryStorage":
            kwargs[field] = text or None
        else:
            kwargs[field] = text
    return IBMCloudSettings(**kwargs)
