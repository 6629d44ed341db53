"""The cluster-wide proxy on the node, as MCO writes it. Pure.

`cluster-proxy` ConfigMap data (the `status` of the cluster's `proxy.config.openshift.io`,
as the HostedCluster's `spec.configuration.proxy` resolves it):

    httpProxy: http://proxy.example:3128
    httpsProxy: http://proxy.example:3128
    noProxy: .cluster.local,.svc,10.0.0.0/16,172.30.0.0/16

MCO's templates (templates/common/_base/files/etc-mco-proxy.yaml and the `*-proxy.yaml`
units): `/etc/mco/proxy.env` (0644) holds HTTP_PROXY/HTTPS_PROXY/NO_PROXY, and the drop-in
`10-mco-default-env.conf` of `crio.service` and `kubelet.service` (and `rpm-ostreed.service`,
which the first boot's rebase pulls with) reads it with `EnvironmentFile=`.

The same settings become the pointer config's `ignition.proxy` when the node needs the
proxy to reach this server (userdata.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlsplit

from .fragments import dropin_entry, file_entry, fragment, unit_entry
from .inputs import InvalidConfig

PROXY_ENV_PATH = "/etc/mco/proxy.env"
DROPIN_NAME = "10-mco-default-env.conf"
PROXIED_UNITS = ("crio.service", "kubelet.service", "rpm-ostreed.service")
_HEADER = (
    "# Proxy environment variables will be populated in this file. Properly\n"
    "# url encoded passwords with special characters will use '%<HEX><HEX>'.\n"
    "# Systemd requires that any % used in a password be represented as\n"
    "# %% in a unit file since % is a prefix for macros; this restriction does not\n"
    "# apply for environment files. Templates that need the proxy set should use\n"
    "# 'EnvironmentFile=/etc/mco/proxy.env'.\n"
)


@dataclass(frozen=True)
class ProxySettings:
    http_proxy: str = ""
    https_proxy: str = ""
    no_proxy: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.http_proxy or self.https_proxy)

    def ignition(self) -> dict:
        """Ignition's `ignition.proxy` (spec 3.1+)."""
        out: dict = {}
        if self.http_proxy:
            out["httpProxy"] = self.http_proxy
        if self.https_proxy:
            out["httpsProxy"] = self.https_proxy
        if self.no_proxy:
            out["noProxy"] = list(self.no_proxy)
        return out


def _proxy_url(key: str, value: str) -> str:
    value = value.strip()
    if not value:
        return ""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c in value for c in " \n\r\t\"'"):
        raise InvalidConfig(f"cluster-proxy {key} {value!r} is not an http(s):// URL")
    return value


def proxy_settings(data: Mapping[str, str]) -> ProxySettings:
    """ConfigMap data → ProxySettings; raises InvalidConfig naming the key at fault."""
    unknown = set(data) - {"httpProxy", "httpsProxy", "noProxy"}
    if unknown:
        raise InvalidConfig(f"cluster-proxy: unknown key(s) {', '.join(sorted(unknown))} (httpProxy, httpsProxy, noProxy)")
    no_proxy = tuple(p.strip() for p in str(data.get("noProxy", "")).split(",") if p.strip())
    if any(c in p for p in no_proxy for c in " \n\r\t\"'"):
        raise InvalidConfig("cluster-proxy noProxy must be a comma-separated list of hosts, domains and CIDRs")
    return ProxySettings(
        _proxy_url("httpProxy", str(data.get("httpProxy", ""))),
        _proxy_url("httpsProxy", str(data.get("httpsProxy", ""))),
        no_proxy,
    )


def render_proxy_fragment(proxy: ProxySettings) -> dict:
    """`/etc/mco/proxy.env` and the drop-ins that read it; {} without a proxy."""
    if not proxy:
        return {}
    env = _HEADER
    if proxy.http_proxy:
        env += f"HTTP_PROXY={proxy.http_proxy}\n"
    if proxy.https_proxy:
        env += f"HTTPS_PROXY={proxy.https_proxy}\n"
    if proxy.no_proxy:
        env += f"NO_PROXY={','.join(proxy.no_proxy)}\n"
    dropin = f"[Service]\nEnvironmentFile={PROXY_ENV_PATH}\n"
    units = [unit_entry(name, enabled=None, dropins=[dropin_entry(DROPIN_NAME, dropin)]) for name in PROXIED_UNITS]
    return fragment([file_entry(PROXY_ENV_PATH, env, 0o644)], units)
