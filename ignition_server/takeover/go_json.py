"""Go's encoding/json, as the control-plane-operator applies it to an object it decoded.

The CPO reads an object (a HostedControlPlane's `spec.configuration`, a ConfigMap) into Go
structs and writes it out again: fields the struct lacks are gone, fields without `omitempty`
appear empty (`imageStreamImportMode: ""`), struct fields come out in declaration order (which
the configuration hash sees), maps in key order. `go_types.json` holds those structs' shape,
printed from the Go types themselves by `go_types.go` (see its header); `GoValue.of` walks a
plain object through that shape, and `dumps` prints the result as `json.Marshal` does.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

# Types with their own MarshalJSON (apimachinery): what they print for a value as the API holds it.
TIME = "k8s.io/apimachinery/pkg/apis/meta/v1.Time"
DURATION = "k8s.io/apimachinery/pkg/apis/meta/v1.Duration"
INT_OR_STRING = "k8s.io/apimachinery/pkg/util/intstr.IntOrString"
RAW = ("k8s.io/apimachinery/pkg/runtime.RawExtension", "k8s.io/apimachinery/pkg/apis/meta/v1.FieldsV1")


@cache
def _shapes() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(resources.files(__package__).joinpath("go_types.json").read_text())
    return loaded


def root(name: str) -> str:
    """The struct id of a root type (`ConfigMap`, `ClusterConfiguration`, `DNS`, ...)."""
    found: str = _shapes()["roots"][name]
    return found


@dataclass(frozen=True)
class GoValue:
    """A value as Go holds it after decoding: `out` is what json.Marshal prints (dicts in field
    order), `empty` what `omitempty` omits, `zero` what `omitzero` omits."""

    out: Any
    empty: bool
    zero: bool

    @staticmethod
    def of(value: Any, shape: Any) -> "GoValue":
        """`value` (a plain object, as YAML or JSON holds it) decoded into `shape` and encoded."""
        if isinstance(shape, str):
            return _basic(value, shape)
        (kind, inner), = shape.items()
        if kind == "ptr":
            return GoValue(None, True, True) if value is None else GoValue(GoValue.of(value, inner).out, False, False)
        if kind == "list":
            if value is None:
                return GoValue(None, True, True)
            return GoValue([GoValue.of(item, inner).out for item in value], not value, False)
        if kind == "map":
            if value is None:
                return GoValue(None, True, True)
            return GoValue({k: GoValue.of(value[k], inner).out for k in sorted(value)}, not value, False)
        if kind == "struct":
            return _struct(value or {}, inner)
        return _custom(value, inner)


def struct(value: Any, name: str) -> dict[str, Any]:
    """A root type's object (`ConfigMap`, `DNS`, ...) as the CPO would print it."""
    out: dict[str, Any] = GoValue.of(value, {"struct": root(name)}).out
    return out


def _basic(value: Any, kind: str) -> GoValue:
    if kind == "string":
        text = "" if value is None else str(value)
        return GoValue(text, not text, not text)
    if kind == "bool":
        flag = bool(value)
        return GoValue(flag, not flag, not flag)
    if kind in ("int", "uint"):
        number = int(value or 0)
        return GoValue(number, number == 0, number == 0)
    if kind == "bytes":
        if value is None:
            return GoValue(None, True, True)
        raw = value if isinstance(value, bytes) else base64.b64decode(value)
        return GoValue(base64.b64encode(raw).decode(), not raw, False)
    raise ValueError(f"no Go kind {kind!r} in go_types.json")


def _struct(value: dict[str, Any], name: str) -> GoValue:
    out: dict[str, Any] = {}
    zero = True
    for field in _shapes()["structs"][name]:
        if field.get("inline"):
            inner = GoValue.of(value, field["type"])
            out.update(inner.out)
            zero = zero and inner.zero
            continue
        got = GoValue.of(value.get(field["name"]), field["type"])
        zero = zero and got.zero
        if (field.get("omitempty") and got.empty) or (field.get("omitzero") and got.zero):
            continue
        out[field["name"]] = got.out
    return GoValue(out, False, zero)


def _custom(value: Any, name: str) -> GoValue:
    if name == TIME:
        return GoValue(format_time(value) if value else None, False, not value)
    if name == DURATION:
        text = format_duration(parse_duration(value or "0s"))
        return GoValue(text, False, text == "0s")
    if name == INT_OR_STRING:
        return GoValue(0 if value is None else value, False, not value)
    if name in RAW:
        return GoValue(value, False, value is None)
    raise ValueError(f"no marshaller for {name}")


def format_time(text: str) -> str:
    """metav1.Time as it marshals: RFC 3339 in UTC, whole seconds."""
    moment = datetime.datetime.fromisoformat(text.replace("z", "Z"))
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
          "m": 60_000_000_000, "h": 3_600_000_000_000}
_PART = re.compile(r"(\d*\.?\d*)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> int:
    """Nanoseconds in a Go duration string (time.ParseDuration)."""
    sign, body = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
    if body == "0":
        return 0
    total, at = 0.0, 0
    for match in _PART.finditer(body):
        if match.start() != at or match.group(1) in ("", "."):
            raise ValueError(f"invalid duration {text!r}")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        at = match.end()
    if at != len(body) or not body:
        raise ValueError(f"invalid duration {text!r}")
    return sign * round(total)


def format_duration(ns: int) -> str:
    """time.Duration.String(): `1h0m0s`, `1m30s`, `1.5s`, `300ms`, `0s`."""
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _fraction(ns, size) + unit
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = _fraction(rest, 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    if minutes:
        return f"{sign}{minutes}m{text}"
    return sign + text


def _fraction(value: int, size: int) -> str:
    whole, part = divmod(value, size)
    if not part:
        return str(whole)
    digits = len(str(size)) - 1
    return f"{whole}.{part:0{digits}d}".rstrip("0")


_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def dumps(value: Any) -> str:
    """json.Marshal's bytes for a GoValue's `out`: compact, `<>&` escaped as Go escapes them."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return re.sub("[<>&\u2028\u2029]", lambda m: _ESCAPES[m.group()], text)
