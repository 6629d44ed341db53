"""The hosted cluster's config.openshift.io objects, as the control-plane-operator derives them
from a HostedControlPlane for the machine-config-server (HyperShift's support/globalconfig:
ReconcileDNSConfig, ReconcileInfrastructure, ReconcileNetworkConfig, ReconcileProxyConfigWithStatus,
ReconcileImageConfig, ReconcileAPIServerConfiguration, NewInstallConfig).

Each function returns the object as plain data before Go's encoding (`go_json` adds the empty
fields Go prints); the HCP is a dict as the API server returns it.
"""

from __future__ import annotations

import ipaddress
from typing import Any

CONFIG_V1 = "config.openshift.io/v1"
_PRIVATE_ACCESS = ("PublicAndPrivate", "Private")
# The CPO's MANAGED_SERVICE for Azure Red Hat OpenShift's hosted control planes (hyperv1.AroHCP),
# and the annotation that marked Swift pod networking before `spec.platform.azure.private` existed.
ARO_HCP = "ARO-HCP"
SWIFT_ANNOTATION = "hypershift.openshift.io/swift-pod-network-instance"


def _spec(hcp: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = hcp.get("spec") or {}
    return spec


def _platform(hcp: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The platform type and its own block (`spec.platform.aws` for AWS, ...)."""
    platform = _spec(hcp).get("platform") or {}
    kind = platform.get("type") or ""
    key = {"IBMCloud": "ibmcloud", "PowerVS": "powervs", "OpenStack": "openstack", "KubeVirt": "kubevirt"}.get(kind, kind.lower())
    return kind, platform.get(key) or {}


def _configuration(hcp: dict[str, Any], key: str) -> Any:
    return (_spec(hcp).get("configuration") or {}).get(key)


def _object(kind: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": CONFIG_V1, "kind": kind, "metadata": {"name": "cluster"}, **fields}


def _parse_cidr(text: str) -> tuple[str, bool]:
    """A CIDR as HyperShift's ipnet.IPNet prints it (the address as written, not masked, in Go's
    form), and whether Go takes it for IPv4: an IPv4-mapped IPv6 address is, its mask cut to the
    last 32 bits (`::ffff:10.0.0.0/104` prints `10.0.0.0/8`)."""
    interface = ipaddress.ip_interface(text)
    prefix = interface.network.prefixlen
    if isinstance(interface, ipaddress.IPv6Interface) and interface.ip.ipv4_mapped is not None:
        return f"{interface.ip.ipv4_mapped}/{max(prefix - 96, 0)}", True
    return f"{interface.ip}/{prefix}", interface.version == 4


def cidr(text: str) -> str:
    return _parse_cidr(text)[0]


def _cidrs(hcp: dict[str, Any], which: str) -> list[str]:
    return [cidr(entry["cidr"]) for entry in (_spec(hcp).get("networking") or {}).get(which) or []]


def base_domain(hcp: dict[str, Any]) -> str:
    dns = _spec(hcp).get("dns") or {}
    prefix = dns["baseDomainPrefix"] if dns.get("baseDomainPrefix") is not None else hcp["metadata"]["name"]
    return f"{prefix}.{dns.get('baseDomain', '')}" if prefix else dns.get("baseDomain", "")


def is_private(hcp: dict[str, Any], managed_service: str = "") -> bool:
    """netutil.IsPrivateHCP. `managed_service` is what the CPO reads from its environment
    (MANAGED_SERVICE; `serve --managed-service`): on ARO-HCP, an Azure HCP without a topology or
    `private.type` is private when it carries the Swift annotation (UseSwiftNetworkingHCP's
    fallback for clusters made before the API field)."""
    kind, platform = _platform(hcp)
    if kind in ("AWS", "GCP"):
        return platform.get("endpointAccess") in _PRIVATE_ACCESS
    if kind == "Azure":
        if platform.get("topology"):
            return platform["topology"] in _PRIVATE_ACCESS
        if (platform.get("private") or {}).get("type") == "Swift":
            return True
        annotations = (hcp.get("metadata") or {}).get("annotations") or {}
        return managed_service == ARO_HCP and bool(annotations.get(SWIFT_ANNOTATION))
    return False


def dns(hcp: dict[str, Any]) -> dict[str, Any]:
    spec_dns = _spec(hcp).get("dns") or {}
    kind, platform = _platform(hcp)
    spec: dict[str, Any] = {"baseDomain": spec_dns.get("baseDomain", "") if kind == "IBMCloud" else base_domain(hcp)}
    if spec_dns.get("publicZoneID"):
        spec["publicZone"] = {"id": spec_dns["publicZoneID"]}
    if spec_dns.get("privateZoneID"):
        spec["privateZone"] = {"id": spec_dns["privateZoneID"]}
    if kind == "AWS" and platform.get("sharedVPC") is not None:
        role = ((platform["sharedVPC"].get("rolesRef") or {}).get("ingressARN")) or ""
        spec["platform"] = {"type": "AWS", "aws": {"privateZoneIAMRole": role}}
    return _object("DNS", spec=spec)


def _https(host: str, port: int) -> str:
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def infrastructure(hcp: dict[str, Any], managed_service: str = "") -> dict[str, Any]:
    kind, platform = _platform(hcp)
    spec_ = _spec(hcp)
    endpoint = (hcp.get("status") or {}).get("controlPlaneEndpoint") or {}
    host, port = endpoint.get("host", ""), int(endpoint.get("port") or 0)
    spec: dict[str, Any] = {"platformSpec": {"type": kind}, "cloudConfig": {}}
    status: dict[str, Any] = {
        "apiServerInternalURI": _https(f"api.{hcp['metadata']['name']}.hypershift.local" if is_private(hcp, managed_service) else host, port),
        "apiServerURL": _https(spec_.get("kubeAPIServerDNSName") or host, port),
        "etcdDiscoveryDomain": base_domain(hcp), "infrastructureName": spec_.get("infraID", ""),
        "controlPlaneTopology": "External", "platform": kind, "platformStatus": {"type": kind},
        "infrastructureTopology": "HighlyAvailable" if spec_.get("infrastructureAvailabilityPolicy") == "HighlyAvailable"
        else "SingleReplica",
    }
    platform_status = status["platformStatus"]
    if kind == "AWS":
        spec["platformSpec"]["aws"] = {}
        tags = [{"key": t.get("key", ""), "value": t.get("value", "")} for t in platform.get("resourceTags") or []
                if not t.get("key", "").startswith("kubernetes.io")]
        platform_status["aws"] = {"region": platform.get("region", ""), "resourceTags": tags}
    elif kind == "Azure":
        spec["cloudConfig"]["name"] = "cloud.conf"
        platform_status["azure"] = {"cloudName": platform.get("cloud") or "AzurePublicCloud",
                                    "resourceGroupName": platform.get("resourceGroup", "")}
    elif kind == "PowerVS":
        platform_status["powervs"] = {"region": platform.get("region", ""), "zone": platform.get("zone", ""),
                                      "cisInstanceCRN": platform.get("cisInstanceCRN", ""),
                                      "resourceGroup": platform.get("resourceGroup", "")}
    elif kind == "OpenStack":
        spec["platformSpec"]["openstack"] = {}
        spec["cloudConfig"] = {"name": "cloud-provider-config", "key": "cloud.conf"}
        platform_status["openstack"] = {"cloudName": "openstack", "loadBalancer": {"type": "UserManaged"},
                                        "apiServerInternalIPs": [], "ingressIPs": []}
    elif kind == "GCP":
        labels = [{"key": label.get("key", ""), "value": label.get("value") or ""}
                  for label in platform.get("resourceLabels") or [] if not label.get("key", "").startswith("kubernetes-io")]
        platform_status["gcp"] = {"projectID": platform.get("project", ""), "region": platform.get("region", ""),
                                  "resourceLabels": labels or None}
    return _object("Infrastructure", spec=spec, status=status)


def network(hcp: dict[str, Any]) -> dict[str, Any]:
    entries = []
    for entry in (_spec(hcp).get("networking") or {}).get("clusterNetwork") or []:
        prefix = int(entry.get("hostPrefix") or 0)
        if prefix == 0:
            prefix = 23 if _parse_cidr(entry["cidr"])[1] else 64
        entries.append({"cidr": cidr(entry["cidr"]), "hostPrefix": prefix})
    spec: dict[str, Any] = {"clusterNetwork": entries or None,
                            "networkType": (_spec(hcp).get("networking") or {}).get("networkType", ""),
                            "serviceNetwork": _cidrs(hcp, "serviceNetwork") or None}
    configured = _configuration(hcp, "network")
    if configured is not None:
        spec["externalIP"] = configured.get("externalIP")
        spec["serviceNodePortRange"] = configured.get("serviceNodePortRange", "")
    status: dict[str, Any] = {}
    if _configuration(hcp, "proxy") is not None:
        status = {"clusterNetwork": spec["clusterNetwork"], "serviceNetwork": spec["serviceNetwork"]}
    return _object("Network", spec=spec, status=status)


def no_proxy(hcp: dict[str, Any], user_value: str) -> str:
    """The Proxy status's noProxy (HyperShift's defaultProxyStatus, after CNO's rules)."""
    entries = {"127.0.0.1", "localhost", ".svc", ".cluster.local", ".local"}
    for which in ("machineNetwork", "clusterNetwork", "serviceNetwork"):
        entries.update(_cidrs(hcp, which))
    kind, platform = _platform(hcp)
    if kind in ("AWS", "Azure"):
        entries.add("169.254.169.254")
    if kind == "AWS":
        region = platform.get("region", "")
        entries.add(".ec2.internal" if region == "us-east-1" else f".{region}.compute.internal")
    entries.update(value for value in user_value.split(",") if value)
    return ",".join(sorted(entries, key=lambda e: e.encode()))


def proxy(hcp: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = dict(_configuration(hcp, "proxy") or {})
    status = {"httpProxy": spec.get("httpProxy", ""), "httpsProxy": spec.get("httpsProxy", "")}
    if status["httpProxy"] or status["httpsProxy"]:
        status["noProxy"] = no_proxy(hcp, spec.get("noProxy") or "")
    return _object("Proxy", spec=spec, status=status)


def image(hcp: dict[str, Any]) -> dict[str, Any]:
    return _object("Image", spec=_configuration(hcp, "image") or {})


def apiserver(hcp: dict[str, Any]) -> dict[str, Any]:
    return _object("APIServer", spec=_configuration(hcp, "apiServer") or {})


def install_config(hcp: dict[str, Any]) -> str:
    """install-config.yaml, HyperShift's text template filled in (not YAML-serialized)."""
    kind, platform = _platform(hcp)
    lines = ["apiVersion: v1", "controlPlane:", "  replicas: 1", "networking:", "  machineNetwork:"]
    lines += [f"  - cidr: {c}" for c in _cidrs(hcp, "machineNetwork")]
    lines.append("platform:")
    if kind == "AWS":
        lines += ["  aws:", f"    region: {platform.get('region', '')}"]
    elif kind == "GCP":
        lines += ["  gcp:", f"    projectID: {platform.get('project', '')}", f"    region: {platform.get('region', '')}"]
    else:
        lines.append("  none: {}")
    return "\n".join(lines) + "\n"
