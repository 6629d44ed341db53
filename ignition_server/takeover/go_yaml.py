"""YAML as HyperShift's serializers print it (sigs.k8s.io/yaml's JSONToYAML over go-yaml v2).

The CPO's YAML is JSON read back into plain maps and written by go-yaml v2: keys in go-yaml's
natural order (digit runs compared as numbers), a string plain unless go-yaml would read it back
as something else (then double-quoted), a string with a line break as a literal block, lines
folded at 80 columns. go-yaml's emitter is libyaml's, as PyYAML's is: this module makes the
style choices go-yaml's encoder makes and hands the events to PyYAML's emitter, its scalars
written as go-yaml writes them (`go_emitter.py`).
"""

from __future__ import annotations

import datetime
import functools
import io
import re
from collections.abc import Iterable
from typing import Any

from yaml.events import (
    DocumentEndEvent,
    DocumentStartEvent,
    Event,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
    StreamStartEvent,
)

from ignition_server.takeover import go_json
from ignition_server.takeover.go_emitter import GoEmitter

_WORDS = {"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON", "n", "N", "no", "No", "NO",
          "false", "False", "FALSE", "off", "Off", "OFF", "", "~", "null", "Null", "NULL",
          ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF"}
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_BASE60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_DATE = re.compile(r"(\d{4})-(\d\d?)-(\d\d?)")
_CLOCK = re.compile(r"(\d\d?):(\d\d?):(\d\d?)(\.\d+)?")
_ZONE = re.compile(r"Z|[+-]\d\d:\d\d")
_INT = {"0x": 16, "0X": 16, "0o": 8, "0O": 8, "0b": 2, "0B": 2}


# Characters Go's json.Marshal leaves raw and go-yaml's reader then refuses ("control characters are
# not allowed"): the CPO's serialization of an object holding one fails, and it writes nothing.
_REFUSED = re.compile("[\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")


class NotSerializable(ValueError):
    """A string the CPO's serializer refuses: the CPO writes nothing for the object that holds it."""


def plain_is_string(text: str) -> bool:
    """Whether go-yaml reads `text`, unquoted, back as the same string (encode.go's stringv)."""
    if text in _WORDS:
        return False
    first = text[0]
    if first == ".":
        return not _is_float(text)
    if first in "+-" or first.isdigit():
        if _is_timestamp(text) or _is_int(text.replace("_", "")) or _is_float_like(text.replace("_", "")):
            return False
        return not _BASE60.fullmatch(text)
    return True


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return "_" not in text and not text.lower().lstrip("+-").startswith(("inf", "nan"))


def _is_float_like(text: str) -> bool:
    return bool(_FLOAT.fullmatch(text)) and _is_float(text)


def _is_int(text: str) -> bool:
    """strconv.ParseInt/ParseUint(text, 0, 64), and go-yaml's own 0b forms."""
    body = text[1:] if text[:1] in "+-" else text
    base = _INT.get(body[:2], 8 if len(body) > 1 and body[0] == "0" else 10)
    digits = body[2:] if body[:2] in _INT else body
    allowed = "0123456789abcdef"[:base]
    if not digits or any(c.lower() not in allowed for c in digits):
        return False
    value = int(digits, base)
    return value < 2 ** 64 if text[0] != "-" else value <= 2 ** 63


def _is_timestamp(text: str) -> bool:
    date = _DATE.match(text)
    if not date or not _valid_date(*(int(g) for g in date.groups())):
        return False
    rest = text[date.end():]
    if not rest:
        return True
    if rest[0] not in "Tt ":
        return False
    clock = _CLOCK.match(rest, 1)
    if not clock or int(clock.group(1)) > 23 or int(clock.group(2)) > 59 or int(clock.group(3)) > 59:
        return False
    zone = rest[clock.end():]
    return (zone == "" and rest[0] == " ") or (rest[0] in "Tt" and bool(_ZONE.fullmatch(zone)))


def _valid_date(year: int, month: int, day: int) -> bool:
    try:
        datetime.date(year, month, day)
    except ValueError:
        return False
    return True


def _less(a: str, b: str) -> bool:
    """go-yaml v2's keyList.Less for two string keys: letters by code point, letters before
    other characters, runs of digits by their value."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x == y:
            continue
        xl, yl = x.isalpha(), y.isalpha()
        if xl and yl:
            return x < y
        if xl or yl:
            return yl
        an = bn = 0
        if x == "0" or y == "0":
            j = i - 1
            while j >= 0 and a[j].isdigit():
                if a[j] != "0":
                    an = bn = 1
                    break
                j -= 1
        ai, bi = i, i
        while ai < len(a) and a[ai].isdigit():
            an, ai = an * 10 + int(a[ai]), ai + 1
        while bi < len(b) and b[bi].isdigit():
            bn, bi = bn * 10 + int(b[bi]), bi + 1
        if an != bn:
            return an < bn
        if ai != bi:
            return ai < bi
        return x < y
    return len(a) < len(b)


def _compare(a: str, b: str) -> int:
    return -1 if _less(a, b) else (1 if _less(b, a) else 0)


def sorted_keys(keys: Iterable[str]) -> list[str]:
    return sorted(keys, key=functools.cmp_to_key(_compare))


def _scalar(text: str) -> ScalarEvent:
    if _REFUSED.search(text):
        raise NotSerializable(f"yaml: control characters are not allowed (in {text[:40]!r})")
    if "\n" in text:
        style: str | None = "|"
    elif plain_is_string(text):
        style = None
    else:
        style = '"'
    return ScalarEvent(None, None, (True, True), text, style=style)


def _read_back(text: str) -> str:
    """A string value as go-yaml reads it back from Go's JSON, where NEL is left raw: a line break in
    a double-quoted scalar, folded with the spaces around it (one NEL: a space; n of them: n-1 newlines)."""
    if "\x85" not in text:
        return text
    out: list[str] = []
    at = 0
    for run in _BLANKS.finditer(text):
        out.append(text[at:run.start()])
        nels = run.group().count("\x85")
        out.append(run.group() if not nels else (" " if nels == 1 else "\n" * (nels - 1)))
        at = run.end()
        if run.group().endswith("\x85") and text.startswith(("---", "..."), at) and text[at + 3:at + 4] in (" ", "\x85") \
                and at + 3 < len(text):
            raise NotSerializable("yaml: found unexpected document indicator")
    out.append(text[at:])
    return "".join(out)


_BLANKS = re.compile("[ \x85]+")


def _check_key(key: str) -> None:
    """go-yaml reads the CPO's JSON back as YAML: a key must be a simple key there, on one line (NEL,
    which Go's JSON leaves raw, breaks it) and at most 1024 characters as JSON prints it."""
    if "\x85" in key or len(go_json.dumps(key)) > 1024:
        raise NotSerializable(f"yaml: did not find expected ',' or '}}' (key {key[:40]!r})")


def _events(value: Any, out: list[Event]) -> None:
    if isinstance(value, dict):
        out.append(MappingStartEvent(None, None, True, flow_style=False))
        for key in sorted_keys(value):
            _check_key(key)
            out.append(_scalar(key))
            _events(value[key], out)
        out.append(MappingEndEvent())
    elif isinstance(value, list):
        out.append(SequenceStartEvent(None, None, True, flow_style=False))
        for item in value:
            _events(item, out)
        out.append(SequenceEndEvent())
    elif isinstance(value, str):
        out.append(_scalar(_read_back(value)))
    elif value is None or isinstance(value, (bool, int)):
        text = "null" if value is None else ("true" if value is True else "false" if value is False else str(value))
        out.append(ScalarEvent(None, None, (True, True), text, style=None))
    else:
        raise TypeError(f"no YAML for {type(value).__name__} here")


def dump(value: Any) -> str:
    """The YAML HyperShift's serializer prints for `value` (plain data: dicts, lists, strings, ints)."""
    events: list[Event] = [StreamStartEvent(encoding=None), DocumentStartEvent(explicit=False)]
    _events(value, events)
    events += [DocumentEndEvent(explicit=False), StreamEndEvent()]
    out = io.StringIO()
    emitter = GoEmitter(out, allow_unicode=True, width=80, indent=2)
    for event in events:
        emitter.emit(event)
    return out.getvalue()
