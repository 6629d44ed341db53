"""The taken-over hostnames' certificates as files, for a front proxy that terminates TLS in the
server's place (`proxy/`, a terminate route): the files behind the edge publication's `hosts`.

The serving processes choose a certificate by SNI themselves (tls/sni.py); HAProxy cannot ask
them, it loads PEM files. So the publishing process (the owner, `--edge-dir`) issues one
certificate per name of `sni-hosts.json`, for that one name, signed by the CA of
`ignition-server-ca-cert` (the self-made CA), and writes it with its key as `<dir>/<host>.pem`
(mode 0600, as `edge.pem`: HAProxy reads keys in clear). The CA's key is unsealed in memory
only, never written; a leaf's key is the only key that reaches the directory, and it signs
nothing. A name gone from the list loses its file; a CA rotation (`ca.crt` changed) and a
certificate near its end re-issue.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509

from ..fsio import atomic_write, make_dir
from .certificates import RENEW_BEFORE, SERVING_VALIDITY, PrivateKey, issue_serving, private_key_pem
from .sni import HOSTS_FILE, ca_signer, is_host_name, read_hosts, stamp

log = logging.getLogger("ignition_server.tls")


@dataclass
class HostCertificateFiles:
    tls_dir: Path  # where ca.crt, ca.key (sealed) and sni-hosts.json are
    password: bytes | None
    out: Path  # <edge-dir>/hosts
    clock: type[dt.datetime] = dt.datetime
    _hosts: frozenset[str] = frozenset()
    _issued: dict[str, dt.datetime] = field(default_factory=dict)
    _ca_stamp: tuple[int, int] | None = None
    _hosts_stamp: tuple[int, int] | None = None
    _checked: dt.datetime | None = None
    _signer: tuple[x509.Certificate, PrivateKey] | None = field(default=None, repr=False)

    @classmethod
    def for_dir(cls, tls_dir: Path, password: bytes | None, out: Path) -> "HostCertificateFiles | None":
        """None when the server does not hold the CA's key (then it serves no taken-over names)."""
        return cls(tls_dir, password, out) if (tls_dir / "ca.key").exists() else None

    def due(self) -> bool:
        """Whether `update` has anything to do: the list or the CA changed, or an hour passed (a
        certificate near its end). Two stats: cheap enough to ask every few seconds."""
        now = self.clock.now(dt.timezone.utc)
        return (self._checked is None or now - self._checked > dt.timedelta(hours=1)
                or stamp(self.tls_dir / HOSTS_FILE) != self._hosts_stamp or stamp(self.tls_dir / "ca.crt") != self._ca_stamp)

    def update(self) -> dict[str, Path]:
        """Bring the files in step with the list and the CA; the names served and their files."""
        self._checked = self.clock.now(dt.timezone.utc)
        self._hosts_stamp = stamp(self.tls_dir / HOSTS_FILE)
        try:
            listed = read_hosts(self.tls_dir)
            refused = {h for h in listed if not is_host_name(h)}
            if refused:  # a Route's hostname becomes a file name and a HAProxy SNI filter
                log.warning("%s: not host names, no certificate: %s", HOSTS_FILE, sorted(refused)[:5])
            self._hosts = frozenset(listed - refused)
        except (OSError, ValueError) as exc:
            log.warning("%s not read (keeping the hostnames known): %s", HOSTS_FILE, exc)
        ca_stamp = stamp(self.tls_dir / "ca.crt")
        if ca_stamp != self._ca_stamp:
            self._ca_stamp, self._signer = ca_stamp, None
            self._issued.clear()
        now = self.clock.now(dt.timezone.utc)
        make_dir(self.out)
        for name in sorted(self._hosts):
            issued = self._issued.get(name)
            if issued is not None and now - issued <= SERVING_VALIDITY - RENEW_BEFORE \
                    and (self.out / f"{name}.pem").exists():
                continue
            try:
                if self._signer is None:
                    self._signer = ca_signer(self.tls_dir, self.password)
                chain, key = issue_serving(*self._signer, [name], now)
            except (OSError, ValueError) as exc:
                log.error("no published certificate for %s: %s", name, exc)
                continue
            atomic_write(self.out / f"{name}.pem", chain + private_key_pem(key), 0o600)
            self._issued[name] = now
        for stale in self.out.glob("*.pem"):
            if stale.name[: -len(".pem")] not in self._hosts:
                stale.unlink(missing_ok=True)
                self._issued.pop(stale.name[: -len(".pem")], None)
        return {name: (self.out / f"{name}.pem").resolve() for name in sorted(self._hosts)
                if (self.out / f"{name}.pem").exists()}
