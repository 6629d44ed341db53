"""Pieces of an Ignition config the renderers share: files, units, drop-ins, fragments.

Each renderer (the node's kube-apiserver proxy, IBM Cloud, the join files, the cluster
proxy, the MCO's appended files) builds its part of the payload as a fragment of
``storage.files`` and ``systemd.units``; these helpers make the entries in one shape, so
every renderer writes files as root-owned ``data:`` URLs and units the same way. Also
where the bundled templates (``templates/``) are read, once each.
"""

from __future__ import annotations

import base64
import functools
import importlib.resources
from urllib.parse import quote

from .inputs import InvalidConfig

__all__ = [
    "boot_step_unit",
    "data_url",
    "dropin_entry",
    "file_entry",
    "fragment",
    "load_template",
    "unit_entry",
]


# Only RFC 2396 "uric" characters stay unescaped: `quote`'s always-safe ones and these.
_SAFE = "/:=,.-_~@;"
_UNESCAPED = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~" + _SAFE.encode()


def data_url(data: bytes | str) -> str:
    """RFC 2397 ``data:`` URL for file contents: percent-encoded when that is shorter
    (plain text: readable in the payload), else base64."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    # Both lengths are known before either is made: quoting runs byte by byte in Python
    # (~25 ns a byte), so it is done only when it wins (the MCS's appended JSON files, the
    # largest a render makes, are shorter in base64).
    escaped = len(raw.translate(None, _UNESCAPED))
    if len("data:,") + len(raw) + 2 * escaped <= len("data:;base64,") + 4 * ((len(raw) + 2) // 3):
        return "data:," + quote(raw, safe=_SAFE)
    return "data:;base64," + base64.b64encode(raw).decode("ascii")


def file_entry(path: str, data: bytes | str, mode: int = 0o644, *, overwrite: bool = True) -> dict:
    """One ``storage.files`` entry (Ignition 3.x), owned by root."""
    if not path.startswith("/"):
        raise InvalidConfig(f"file path must be absolute: {path!r}")
    return {"path": path, "mode": mode, "overwrite": overwrite, "contents": {"source": data_url(data)}}


def unit_entry(name: str, contents: str | None = None, *, enabled: bool | None = True,
               dropins: list[dict] | None = None) -> dict:
    """One ``systemd.units`` entry."""
    unit: dict = {"name": name}
    if enabled is not None:
        unit["enabled"] = enabled
    if contents is not None:
        unit["contents"] = contents
    if dropins:
        unit["dropins"] = dropins
    return unit


def dropin_entry(name: str, contents: str) -> dict:
    return {"name": name, "contents": contents}


def fragment(files: list[dict] | None = None, units: list[dict] | None = None) -> dict:
    """An Ignition config fragment: ``storage.files`` and ``systemd.units`` (no version)."""
    out: dict = {}
    if files:
        out["storage"] = {"files": list(files)}
    if units:
        out["systemd"] = {"units": list(units)}
    return out


@functools.cache
def load_template(name: str) -> str:
    """A bundled template from ``ignition_server/render/templates`` (read once)."""
    return (importlib.resources.files("ignition_server.render") / "templates" / name).read_text(
        encoding="utf-8"
    )


def boot_step_unit(description: str, exec_start: str, *, exec_stop: str | None = None, extra_service: str = "") -> str:
    """A oneshot unit that must finish before the kubelet starts (it runs after the network is up)."""
    return (
        "[Unit]\n"
        f"Description={description}\n"
        "Wants=network-online.target\n"
        "After=network-online.target\n"
        "Before=kubelet.service kubelet-dependencies.target\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"ExecStart={exec_start}\n"
        + (f"ExecStop={exec_stop}\n" if exec_stop else "")
        + "RemainAfterExit=yes\n"
        + extra_service
        + "\n"
        "[Install]\n"
        "WantedBy=multi-user.target kubelet.service\n"
    )
