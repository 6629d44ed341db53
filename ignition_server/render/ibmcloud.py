"""IBM Cloud VPC Gen 2 platform settings for RHCOS nodes (DESIGN §4).

What IBM's prototype did on the node with boot-time scripts, rendered here instead:

- ``/etc/ibm/ibm-cloud.env``: the cluster-wide facts (no secrets) the boot scripts read;
- the kubelet's provider ID ``ibm://<account>///<cluster>/<worker>``: per-node facts arrive
  at boot, not in the payload, so a oneshot unit (``ibm-kubelet-providerid.service``,
  ordered before the kubelet) asks the VPC instance metadata service and writes
  ``/run/ibm/kubelet.env``; a kubelet drop-in requires that unit and reads the file
  (``KUBELET_PROVIDERID``, which the RHCOS kubelet unit passes as ``--provider-id``);
- chrony pointed at IBM Cloud's NTP service, a sysctl file;
- with the private service endpoint on: a registries.conf.d drop-in that pulls the
  regional registry's images through its private endpoint (``private.<host>``);
- optionally, the secondary (instance-storage) disk: LUKS with a throw-away key, or ext4;
- the node-local kube-apiserver proxy settings (:func:`api_server_access`): private
  endpoints as primaries, public ones as ``backup``, ``/livez?exclude=etcd&exclude=log``,
  listening on ``172.20.0.1:2040``.

Pure functions; the boot scripts are bundled templates (``templates/``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from string import Template

from .fragments import boot_step_unit, dropin_entry, file_entry, fragment, load_template, unit_entry
from .haproxy import HEALTH_CHECK_LIVEZ, ApiServerAccess, Backend, parse_backends
from .inputs import InvalidConfig

__all__ = [
    "IBMCloudSettings",
    "IBM_PROXY_IP",
    "IBM_PROXY_PORT",
    "IBM_ENV_PATH",
    "PROVIDERID_UNIT",
    "PROVIDERID_SCRIPT_PATH",
    "KUBELET_ENV_PATH",
    "SECONDARY_STORAGE_UNIT",
    "api_server_access",
    "render_ibm_env",
    "render_chrony_conf",
    "render_sysctl_conf",
    "render_registry_conf",
    "render_ibmcloud_fragment",
]

IBM_PROXY_IP = "172.20.0.1"
IBM_PROXY_PORT = 2040
IBM_NTP_SERVER = "time.adn.networklayer.com"  # IBM Cloud's private NTP service (161.26.0.6)
IBM_METADATA_ENDPOINT = "http://169.254.169.254"

IBM_ENV_PATH = "/etc/ibm/ibm-cloud.env"
PROVIDERID_SCRIPT_PATH = "/usr/local/bin/ibm-kubelet-providerid.sh"
PROVIDERID_UNIT = "ibm-kubelet-providerid.service"
KUBELET_ENV_PATH = "/run/ibm/kubelet.env"
KUBELET_DROPIN = "20-ibm-providerid.conf"
CHRONY_PATH = "/etc/chrony.conf"
SYSCTL_PATH = "/etc/sysctl.d/99-ibm-cloud.conf"
REGISTRY_CONF_PATH = "/etc/containers/registries.conf.d/99-ibm-private-registry.conf"
SECONDARY_STORAGE_SCRIPT_PATH = "/usr/local/bin/ibm-secondary-storage.sh"
SECONDARY_STORAGE_UNIT = "ibm-secondary-storage.service"

# Chosen here, not taken from IBM: keep idle apiserver/watch connections through VPC load
# balancers and NAT alive, and a larger accept backlog. Override with settings.sysctls.
DEFAULT_SYSCTLS: tuple[tuple[str, str], ...] = (
    ("net.ipv4.tcp_keepalive_time", "300"),
    ("net.ipv4.tcp_keepalive_intvl", "30"),
    ("net.ipv4.tcp_keepalive_probes", "5"),
    ("net.core.somaxconn", "4096"),
)

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_REGION_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_DNS_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_SYSCTL_KEY_RE = re.compile(r"^[a-z0-9_]+(?:[./][A-Za-z0-9_-]+)+$")
_SYSCTL_VALUE_RE = re.compile(r"^[A-Za-z0-9 ._:,/-]{1,256}$")
_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]+$")
_URL_RE = re.compile(r"^https?://[A-Za-z0-9.:\[\]-]+$")


def _host_ok(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(_DNS_RE.match(host))


def _backends(value, *, backup: bool, what: str) -> tuple[Backend, ...]:
    if isinstance(value, str):
        return parse_backends(value, backup=backup)
    out = []
    for item in value:
        if isinstance(item, Backend):
            out.append(Backend(item.host, item.port, backup))
        elif isinstance(item, str):
            out.append(Backend.parse(item, backup=backup))
        else:
            raise InvalidConfig(f"{what} entries must be 'host:port' or Backend, got {item!r}")
    return tuple(out)


@dataclass(frozen=True)
class IBMCloudSettings:
    """Cluster-wide IBM Cloud VPC Gen 2 settings (the same for every node of a NodePool).

    Endpoints are ``host:port`` strings (a comma-separated string is accepted too, as in
    IBM's settings) or :class:`Backend` values; they are stored as ``Backend`` tuples.
    """

    cluster_id: str
    account_id: str
    region: str
    zones: tuple[str, ...] = ()
    private_endpoints: tuple[Backend, ...] = ()  # master endpoints on the private network
    public_endpoints: tuple[Backend, ...] = ()
    proxy_ip: str = IBM_PROXY_IP
    proxy_port: int = IBM_PROXY_PORT
    private_service_endpoint: bool = True
    public_service_endpoint: bool = False
    registry_host: str = ""  # regional registry, e.g. "us.icr.io"
    ntp_server: str = IBM_NTP_SERVER
    secondary_storage: str | None = None  # "luks" | "ext4" | None (leave disks alone)
    secondary_storage_mount: str = "/var/data"
    metadata_endpoint: str = IBM_METADATA_ENDPOINT
    worker_id_field: str = "name"  # instance metadata field that is the worker ID ("name" | "id")
    sysctls: tuple[tuple[str, str], ...] = field(default=DEFAULT_SYSCTLS)

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        for name in ("cluster_id", "account_id"):
            if not _ID_RE.match(getattr(self, name) or ""):
                raise InvalidConfig(f"IBM Cloud {name} must match {_ID_RE.pattern}, got {getattr(self, name)!r}")
        if not _REGION_RE.match(self.region or ""):
            raise InvalidConfig(f"IBM Cloud region must match {_REGION_RE.pattern}, got {self.region!r}")
        zones = (self.zones,) if isinstance(self.zones, str) else tuple(self.zones)
        for z in zones:
            if not _REGION_RE.match(z):
                raise InvalidConfig(f"invalid IBM Cloud zone {z!r}")
        set_("zones", zones)
        set_("private_endpoints", _backends(self.private_endpoints, backup=False, what="private_endpoints"))
        set_("public_endpoints", _backends(self.public_endpoints, backup=True, what="public_endpoints"))
        if not self.private_service_endpoint and not self.public_service_endpoint:
            raise InvalidConfig("at least one of the private and public service endpoints must be enabled")
        if self.private_service_endpoint and not self.private_endpoints:
            raise InvalidConfig("the private service endpoint is enabled but no private master endpoints are given")
        if self.public_service_endpoint and not self.public_endpoints:
            raise InvalidConfig("the public service endpoint is enabled but no public master endpoints are given")
        if self.registry_host and not _DNS_RE.match(self.registry_host):
            raise InvalidConfig(f"invalid registry host {self.registry_host!r}")
        if not self.ntp_server or not _host_ok(self.ntp_server):
            raise InvalidConfig(f"invalid NTP server {self.ntp_server!r}")
        if self.secondary_storage not in (None, "luks", "ext4"):
            raise InvalidConfig(f"secondary_storage must be 'luks', 'ext4' or None, got {self.secondary_storage!r}")
        if not _PATH_RE.match(self.secondary_storage_mount) or self.secondary_storage_mount in ("/", "/var", "/etc"):
            raise InvalidConfig(f"invalid secondary storage mount point {self.secondary_storage_mount!r}")
        if not _URL_RE.match(self.metadata_endpoint):
            raise InvalidConfig(f"invalid metadata endpoint {self.metadata_endpoint!r}")
        if self.worker_id_field not in ("name", "id"):
            raise InvalidConfig(f"worker_id_field must be 'name' or 'id', got {self.worker_id_field!r}")
        sysctls = tuple((str(k), str(v)) for k, v in (self.sysctls.items() if isinstance(self.sysctls, dict) else self.sysctls))
        for k, v in sysctls:
            if not _SYSCTL_KEY_RE.match(k) or not _SYSCTL_VALUE_RE.match(v):
                raise InvalidConfig(f"invalid sysctl {k!r} = {v!r}")
        set_("sysctls", sysctls)
        # The listen address/port are validated by ApiServerAccess; fail early here.
        api_server_access(self)


def api_server_access(settings: IBMCloudSettings) -> ApiServerAccess:
    """The kube-apiserver proxy for IBM nodes: private endpoints first, public ones as
    ``backup`` (or as primaries when the private service endpoint is off)."""
    backends: list[Backend] = []
    if settings.private_service_endpoint:
        backends += [Backend(b.host, b.port, False) for b in settings.private_endpoints]
    if settings.public_service_endpoint:
        backup = settings.private_service_endpoint
        backends += [Backend(b.host, b.port, backup) for b in settings.public_endpoints]
    return ApiServerAccess(
        listen_ip=settings.proxy_ip,
        listen_port=settings.proxy_port,
        backends=tuple(backends),
        health_check=HEALTH_CHECK_LIVEZ,
    )


# --- files --------------------------------------------------------------------------------


def render_ibm_env(settings: IBMCloudSettings) -> str:
    """``/etc/ibm/ibm-cloud.env``: cluster-wide facts for the boot scripts (every value is
    validated to a shell-safe alphabet, and quoted anyway)."""
    def endpoints(bs: tuple[Backend, ...]) -> str:
        return ",".join(b.address for b in bs)

    values = [
        ("IBM_CLUSTER_ID", settings.cluster_id),
        ("IBM_ACCOUNT_ID", settings.account_id),
        ("IBM_REGION", settings.region),
        ("IBM_ZONES", ",".join(settings.zones)),
        ("IBM_PRIVATE_SERVICE_ENDPOINT", "true" if settings.private_service_endpoint else "false"),
        ("IBM_PUBLIC_SERVICE_ENDPOINT", "true" if settings.public_service_endpoint else "false"),
        ("IBM_PRIVATE_MASTER_ENDPOINTS", endpoints(settings.private_endpoints)),
        ("IBM_PUBLIC_MASTER_ENDPOINTS", endpoints(settings.public_endpoints)),
        ("IBM_APISERVER_PROXY", f"{settings.proxy_ip}:{settings.proxy_port}"),
        ("IBM_REGISTRY_HOST", settings.registry_host),
        ("IBM_METADATA_ENDPOINT", settings.metadata_endpoint),
        ("IBM_WORKER_ID_FIELD", settings.worker_id_field),
        ("IBM_SECONDARY_STORAGE", settings.secondary_storage or ""),
        ("IBM_SECONDARY_STORAGE_MOUNT", settings.secondary_storage_mount),
    ]
    lines = ["# Rendered by ignition-server: IBM Cloud VPC Gen 2 cluster settings (no secrets)."]
    lines += [f"{k}='{v}'" for k, v in values]
    return "\n".join(lines) + "\n"


def render_chrony_conf(settings: IBMCloudSettings) -> str:
    servers = f"server {settings.ntp_server} iburst"
    return Template(load_template("chrony.conf.tmpl")).substitute(servers=servers)


def render_sysctl_conf(settings: IBMCloudSettings) -> str:
    lines = ["# Rendered by ignition-server (IBM Cloud VPC Gen 2)."]
    lines += [f"{k} = {v}" for k, v in settings.sysctls]
    return "\n".join(lines) + "\n"


def render_registry_conf(settings: IBMCloudSettings) -> str | None:
    """containers-registries.conf(5) drop-in: pull the regional registry through its private
    endpoint. None unless the private service endpoint is on and a registry host is set."""
    if not (settings.private_service_endpoint and settings.registry_host):
        return None
    host = settings.registry_host
    private = host if host.startswith("private.") else f"private.{host}"
    public = host[len("private."):] if host.startswith("private.") else host
    return (
        "# Rendered by ignition-server: the private service endpoint is on, so images of the\n"
        "# regional registry are pulled over IBM Cloud's private network.\n"
        "[[registry]]\n"
        f'prefix = "{public}"\n'
        f'location = "{public}"\n'
        "\n"
        "[[registry.mirror]]\n"
        f'location = "{private}"\n'
    )


def _providerid_unit() -> str:
    return boot_step_unit(
        "Set the kubelet provider ID from IBM Cloud VPC instance metadata",
        PROVIDERID_SCRIPT_PATH,
        extra_service="TimeoutStartSec=300\n",
    )


def _kubelet_dropin() -> str:
    return (
        "# Rendered by ignition-server: the provider ID comes from the node's instance metadata.\n"
        "[Unit]\n"
        f"Requires={PROVIDERID_UNIT}\n"
        f"After={PROVIDERID_UNIT}\n"
        "\n"
        "[Service]\n"
        f"EnvironmentFile={KUBELET_ENV_PATH}\n"
    )


def _secondary_storage_unit() -> str:
    return (
        "[Unit]\n"
        "Description=Prepare and mount the IBM Cloud VPC secondary (instance-storage) disk\n"
        "DefaultDependencies=no\n"
        "After=local-fs.target systemd-udev-settle.service\n"
        "Before=kubelet.service crio.service kubelet-dependencies.target\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"ExecStart={SECONDARY_STORAGE_SCRIPT_PATH}\n"
        "RemainAfterExit=yes\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def render_ibmcloud_fragment(settings: IBMCloudSettings) -> dict:
    """Ignition fragment with the IBM Cloud VPC Gen 2 platform settings (not the kube-apiserver
    proxy: render.haproxy's fragment, which render.payload adds beside it)."""
    files = [
        file_entry(IBM_ENV_PATH, render_ibm_env(settings), 0o644),
        file_entry(PROVIDERID_SCRIPT_PATH, load_template("ibm-kubelet-providerid.sh"), 0o755),
        file_entry(CHRONY_PATH, render_chrony_conf(settings), 0o644),
        file_entry(SYSCTL_PATH, render_sysctl_conf(settings), 0o644),
    ]
    registry = render_registry_conf(settings)
    if registry is not None:
        files.append(file_entry(REGISTRY_CONF_PATH, registry, 0o644))
    units = [
        unit_entry(PROVIDERID_UNIT, _providerid_unit(), enabled=True),
        unit_entry("kubelet.service", enabled=None, dropins=[dropin_entry(KUBELET_DROPIN, _kubelet_dropin())]),
    ]
    if settings.secondary_storage:
        files.append(file_entry(SECONDARY_STORAGE_SCRIPT_PATH, load_template("ibm-secondary-storage.sh"), 0o755))
        units.append(unit_entry(SECONDARY_STORAGE_UNIT, _secondary_storage_unit(), enabled=True))
    return fragment(files, units)
