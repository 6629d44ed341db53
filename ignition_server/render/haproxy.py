"""The node-local kube-apiserver proxy (DESIGN §4): haproxy.cfg, static pod, listen-address unit.

Every node runs HAProxy as a static pod (``kube-apiserver-proxy``, HyperShift's name) that
listens on the apiserver's advertised address (HyperShift: ``172.20.0.1:6443``; IBM:
``172.20.0.1:2040``) and forwards TCP streams to the control plane's endpoints, private
endpoints as primaries and public ones as ``backup``. A oneshot unit puts the listen
address on ``lo`` before the kubelet starts.

Unlike IBM's prototype (which rendered haproxy.cfg on the node with shell scripts at boot)
the config is rendered and checked here, before any node sees it. Operators may replace the
bundled template (``templates/haproxy.cfg.tmpl``) with their own; it is a
:class:`string.Template` with these placeholders:

``${bind}``              the bind address, ``172.20.0.1:6443`` or ``[fd00::1]:6443``
``${listen_ip}``, ``${listen_port}``
``${health_check}``      ``GET /version`` (method and URI, for ``option httpchk``)
``${health_check_method}``, ``${health_check_uri}``
``${default_server}``    options for ``default-server`` (checks over TLS, ``init-addr``, resolvers)
``${servers}``           the ``server`` lines, indented two spaces, primaries first
``${resolvers_section}`` a ``resolvers`` section when a backend is a DNS name, else empty
``${resolvers_name}``    its name (``node``)

Address syntax (HAProxy 2.6): IPv6 literals are written ``[2001:db8::1]:6443`` (bind and
server lines); DNS names get ``init-addr last,libc,none`` so neither ``haproxy -c`` nor
start-up fails on a name that does not resolve yet, plus a ``resolvers`` section (from the
node's resolv.conf) so addresses are re-resolved at run time, and ``check-sni`` so TLS
health checks reach SNI-routed endpoints.

The entries themselves (files, units) are made by :mod:`.fragments`, like every renderer's.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from string import Template

import yaml

from .fragments import boot_step_unit, file_entry, fragment, load_template, unit_entry
from .inputs import InvalidConfig

__all__ = [
    "Backend",
    "ApiServerAccess",
    "HEALTH_CHECK_VERSION",
    "HEALTH_CHECK_LIVEZ",
    "HAPROXY_CFG_PATH",
    "STATIC_POD_PATH",
    "APISERVER_IP_UNIT",
    "default_haproxy_template",
    "render_haproxy_cfg",
    "render_static_pod",
    "render_setup_script",
    "render_teardown_script",
    "render_apiserver_ip_unit",
    "render_haproxy_fragment",
    "parse_backends",
]

HEALTH_CHECK_VERSION = "GET /version"
HEALTH_CHECK_LIVEZ = "GET /livez?exclude=etcd&exclude=log"  # IBM Cloud's

HAPROXY_CONFIG_DIR = "/etc/kubernetes/apiserver-proxy-config"
HAPROXY_CFG_PATH = f"{HAPROXY_CONFIG_DIR}/haproxy.cfg"
STATIC_POD_PATH = "/etc/kubernetes/manifests/kube-apiserver-proxy.yaml"
SETUP_SCRIPT_PATH = "/usr/local/bin/setup-apiserver-ip.sh"
TEARDOWN_SCRIPT_PATH = "/usr/local/bin/teardown-apiserver-ip.sh"
APISERVER_IP_UNIT = "apiserver-ip.service"
RESOLVERS_NAME = "node"
# Where the container sees the config directory (haproxy -f <dir> reads every *.cfg in it).
CONTAINER_CONFIG_DIR = "/usr/local/etc/haproxy"


# --- inputs -------------------------------------------------------------------------------

_DNS_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_DNS_NAME_RE = re.compile(rf"^(?=.{{1,253}}\.?$){_DNS_LABEL}(?:\.{_DNS_LABEL})*\.?$")
_HEALTH_RE = re.compile(r"^(GET|HEAD|OPTIONS) (/[!-~]*)$")
_UNSAFE_URI_CHARS = set("#\"'\\$")  # HAProxy config comment/quoting/escape characters


def _host_kind(host: str) -> str:
    """'ipv4', 'ipv6' or 'dns'; InvalidConfig for anything else."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if _DNS_NAME_RE.match(host) and not host.replace(".", "").isdigit():
            return "dns"
        raise InvalidConfig(f"not an IP address or DNS name: {host!r}") from None
    return "ipv6" if ip.version == 6 else "ipv4"


def _check_port(port: int, what: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidConfig(f"{what} port must be an integer in 1..65535, got {port!r}")


@dataclass(frozen=True)
class Backend:
    """A control plane endpoint: IPv4/IPv6 literal or DNS name, and port."""

    host: str
    port: int
    backup: bool = False

    def __post_init__(self) -> None:
        host = self.host
        if host.startswith("[") and host.endswith("]"):
            object.__setattr__(self, "host", host[1:-1])
        _host_kind(self.host)
        _check_port(self.port, f"backend {self.host}")

    @property
    def kind(self) -> str:
        return _host_kind(self.host)

    @property
    def address(self) -> str:
        """``host:port`` in HAProxy syntax (IPv6 in brackets)."""
        host = f"[{self.host}]" if self.kind == "ipv6" else self.host
        return f"{host}:{self.port}"

    @classmethod
    def parse(cls, text: str, *, backup: bool = False) -> "Backend":
        """``host:port``, ``[v6]:port`` (IBM's backend list entries)."""
        text = text.strip()
        m = re.fullmatch(r"\[([^\]]+)\]:(\d+)", text) or re.fullmatch(r"([^:\s]+):(\d+)", text)
        if not m:
            raise InvalidConfig(f"backend must be host:port or [ipv6]:port, got {text!r}")
        return cls(m.group(1), int(m.group(2)), backup)


def parse_backends(text: str, *, backup: bool = False) -> tuple[Backend, ...]:
    """A comma-separated ``host:port`` list (as in IBM's settings) -> backends."""
    return tuple(Backend.parse(part, backup=backup) for part in text.split(",") if part.strip())


@dataclass(frozen=True)
class ApiServerAccess:
    """How a node reaches its kube-apiserver through the local proxy."""

    listen_ip: str = "172.20.0.1"
    listen_port: int = 6443
    backends: tuple[Backend, ...] = field(default_factory=tuple)
    health_check: str = HEALTH_CHECK_VERSION  # "GET /version", or just a path

    def __post_init__(self) -> None:
        object.__setattr__(self, "backends", tuple(self.backends))
        try:
            ipaddress.ip_address(self.listen_ip)
        except ValueError:
            raise InvalidConfig(f"listen_ip must be an IP address, got {self.listen_ip!r}") from None
        _check_port(self.listen_port, "listen")
        if not self.backends:
            raise InvalidConfig("the kube-apiserver proxy needs at least one backend")
        for b in self.backends:
            if not isinstance(b, Backend):
                raise InvalidConfig(f"backends must be Backend values, got {b!r}")
        hc = self.health_check.strip()
        if hc.startswith("/"):
            hc = "GET " + hc
        m = _HEALTH_RE.match(hc)
        if not m or _UNSAFE_URI_CHARS & set(m.group(2)):
            raise InvalidConfig(
                f"health_check must be '<GET|HEAD|OPTIONS> /path' without spaces, quotes, '#', "
                f"'$' or backslashes, got {self.health_check!r}"
            )
        object.__setattr__(self, "health_check", hc)

    @property
    def listen_ipv6(self) -> bool:
        return ipaddress.ip_address(self.listen_ip).version == 6

    @property
    def bind(self) -> str:
        host = f"[{self.listen_ip}]" if self.listen_ipv6 else self.listen_ip
        return f"{host}:{self.listen_port}"

    @property
    def health_check_method(self) -> str:
        return self.health_check.split(" ", 1)[0]

    @property
    def health_check_uri(self) -> str:
        return self.health_check.split(" ", 1)[1]

    @property
    def ordered_backends(self) -> tuple[Backend, ...]:
        """Primaries first, then backups, each group in the given order."""
        return tuple(b for b in self.backends if not b.backup) + tuple(
            b for b in self.backends if b.backup
        )


# --- haproxy.cfg --------------------------------------------------------------------------


def default_haproxy_template() -> str:
    return load_template("haproxy.cfg.tmpl")


def _server_lines(access: ApiServerAccess) -> str:
    lines = []
    n_primary = n_backup = 0
    for b in access.ordered_backends:
        if b.backup:
            n_backup += 1
            name = f"backup-{n_backup}"
        else:
            n_primary += 1
            name = f"controlplane-{n_primary}"
        opts = ""
        if b.kind == "dns":
            opts += f" check-sni {b.host.rstrip('.')}"
        if b.backup:
            opts += " backup"
        lines.append(f"  server {name} {b.address}{opts}")
    return "\n".join(lines)


def _template_vars(access: ApiServerAccess) -> dict[str, str]:
    has_dns = any(b.kind == "dns" for b in access.backends)
    default_server = "inter 10s fall 3 rise 3 check check-ssl verify none"
    resolvers_section = ""
    if has_dns:
        prefer = "ipv6" if access.listen_ipv6 else "ipv4"
        default_server += f" init-addr last,libc,none resolvers {RESOLVERS_NAME} resolve-prefer {prefer}"
        resolvers_section = (
            f"\nresolvers {RESOLVERS_NAME}\n"
            "  parse-resolv-conf\n"
            "  resolve_retries 3\n"
            "  timeout resolve 1s\n"
            "  timeout retry 1s\n"
            "  hold valid 30s\n"
            "  hold obsolete 30s\n"
        )
    return {
        "bind": access.bind,
        "listen_ip": access.listen_ip,
        "listen_port": str(access.listen_port),
        "health_check": access.health_check,
        "health_check_method": access.health_check_method,
        "health_check_uri": access.health_check_uri,
        "default_server": default_server,
        "servers": _server_lines(access),
        "resolvers_section": resolvers_section,
        "resolvers_name": RESOLVERS_NAME,
    }


def render_haproxy_cfg(access: ApiServerAccess, template: str | None = None) -> str:
    """haproxy.cfg for ``access``, from ``template`` (an operator override) or the bundled one.

    Raises :class:`InvalidConfig` when the template names an unknown placeholder or is not a
    valid :class:`string.Template`.
    """
    tmpl = Template(default_haproxy_template() if template is None else template)
    try:
        out = tmpl.substitute(_template_vars(access))
    except KeyError as e:
        raise InvalidConfig(f"haproxy template uses an unknown placeholder ${{{e.args[0]}}}") from None
    except ValueError as e:
        raise InvalidConfig(f"haproxy template is malformed: {e}") from None
    return out if out.endswith("\n") else out + "\n"


# --- static pod and listen-address unit ---------------------------------------------------


def render_static_pod(access: ApiServerAccess, haproxy_image: str) -> str:
    """The ``kube-apiserver-proxy`` static pod manifest the kubelet starts."""
    if not haproxy_image or any(c.isspace() for c in haproxy_image):
        raise InvalidConfig(f"invalid haproxy image pull spec {haproxy_image!r}")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kube-apiserver-proxy",
            "namespace": "kube-system",
            "labels": {"k8s-app": "kube-apiserver-proxy"},
        },
        "spec": {
            "hostNetwork": True,
            "priorityClassName": "system-node-critical",
            "containers": [
                {
                    "name": "haproxy",
                    "image": haproxy_image,
                    "command": ["haproxy", "-W", "-db", "-f", CONTAINER_CONFIG_DIR],
                    "livenessProbe": {
                        "httpGet": {
                            "host": access.listen_ip,
                            "port": access.listen_port,
                            "path": access.health_check_uri,
                            "scheme": "HTTPS",
                        },
                        "initialDelaySeconds": 120,
                        "periodSeconds": 120,
                        "timeoutSeconds": 60,
                        "failureThreshold": 3,
                        "successThreshold": 1,
                    },
                    "ports": [
                        {
                            "name": "apiserver",
                            "containerPort": access.listen_port,
                            "hostPort": access.listen_port,
                            "protocol": "TCP",
                        }
                    ],
                    "resources": {"requests": {"cpu": "13m", "memory": "16Mi"}},
                    "securityContext": {"runAsUser": 1001},
                    "volumeMounts": [{"name": "config", "mountPath": CONTAINER_CONFIG_DIR}],
                }
            ],
            "volumes": [{"name": "config", "hostPath": {"path": HAPROXY_CONFIG_DIR}}],
        },
    }
    return yaml.safe_dump(pod, sort_keys=False, default_flow_style=False)


def _prefix(access: ApiServerAccess) -> str:
    return f"{access.listen_ip}/{128 if access.listen_ipv6 else 32}"


def render_setup_script(access: ApiServerAccess) -> str:
    """Adds the listen address to ``lo`` (idempotent: ``replace``, so a restart is harmless)."""
    ip, prefix = access.listen_ip, _prefix(access)
    if access.listen_ipv6:
        addr = f"ip -6 addr replace {prefix} dev lo scope host nodad"
        route = f"ip -6 route replace {prefix} dev lo scope link src {ip}"
    else:
        addr = f"ip addr replace {prefix} brd {ip} scope host dev lo"
        route = f"ip route replace {prefix} dev lo scope link src {ip}"
    return f"#!/usr/bin/env bash\nset -euxo pipefail\n{addr}\n{route}\n"


def render_teardown_script(access: ApiServerAccess) -> str:
    fam = "-6 " if access.listen_ipv6 else ""
    prefix = _prefix(access)
    return (
        "#!/usr/bin/env bash\nset -x\n"
        f"ip {fam}route del {prefix} dev lo scope link src {access.listen_ip} || true\n"
        f"ip {fam}addr del {prefix} dev lo || true\n"
    )


def render_apiserver_ip_unit() -> str:
    """Oneshot unit that puts the listen address on the node before the kubelet starts."""
    return boot_step_unit(
        "Sets up local IP to proxy API server requests", SETUP_SCRIPT_PATH, exec_stop=TEARDOWN_SCRIPT_PATH
    )


def render_haproxy_fragment(access: ApiServerAccess, haproxy_image: str, template: str | None = None) -> dict:
    """Ignition fragment: haproxy.cfg, the static pod, the listen-address scripts and unit."""
    files = [
        file_entry(SETUP_SCRIPT_PATH, render_setup_script(access), 0o755),
        file_entry(TEARDOWN_SCRIPT_PATH, render_teardown_script(access), 0o755),
        file_entry(HAPROXY_CFG_PATH, render_haproxy_cfg(access, template), 0o644),
        file_entry(STATIC_POD_PATH, render_static_pod(access, haproxy_image), 0o644),
    ]
    units = [unit_entry(APISERVER_IP_UNIT, render_apiserver_ip_unit(), enabled=True)]
    return fragment(files, units)
