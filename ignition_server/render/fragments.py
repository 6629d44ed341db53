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
import re

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
# Runs of characters to escape, each a piece of its own (`re.split` keeps a captured separator).
_ESCAPED_RUNS = re.compile("([^" + re.escape(_UNESCAPED.decode("ascii")) + "]+)")


def _percent_encode(raw: bytes) -> str:
    """`urllib.parse.quote(raw, safe=_SAFE)`, by runs instead of byte by byte (`quote` is a
    Python loop over every byte, ~25 ns each): a run to escape is one `bytes.hex`, and a run met
    before in `raw` (JSON's indentation and quotes, a text's line ends) is looked up. A render's
    190 KB rendered MachineConfig file is ~11,000 runs: 1.7x faster than `quote`."""
    pieces = _ESCAPED_RUNS.split(raw.decode("latin-1"))  # one character a byte
    done: dict[str, str] = {}
    for i in range(1, len(pieces), 2):  # odd places: the runs to escape
        run = pieces[i]
        escaped = done.get(run)
        if escaped is None:
            escaped = done[run] = "%" + run.encode("latin-1").hex("%").upper()
        pieces[i] = escaped
    return "".join(pieces)


def data_url(data: bytes | str) -> str:
    """RFC 2397 ``data:`` URL for file contents: percent-encoded when that is shorter
    (plain text: readable in the payload), else base64."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    # Both lengths are known before either is made: only the shorter is.
    escaped = len(raw.translate(None, _UNESCAPED))
    if len("data:,") + len(raw) + 2 * escaped <= len("data:;base64,") + 4 * ((len(raw) + 2) // 3):
        return "data:," + _percent_encode(raw)
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
