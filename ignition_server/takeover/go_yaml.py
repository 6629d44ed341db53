"""YAML as HyperShift's serializers print it (sigs.k8s.io/yaml's JSONToYAML over go-yaml v2).

The CPO's YAML is JSON read back into plain maps and written by go-yaml v2: keys in go-yaml's
natural order (digit runs compared as numbers), a string plain unless go-yaml would read it back
as something else (then double-quoted), a string with a line break as a literal block, lines
folded at 80 columns. go-yaml's emitter is libyaml's, as PyYAML's is: this module makes the
style choices go-yaml's encoder makes and hands the events to PyYAML's emitter.
"""

from __future__ import annotations

import datetime
import functools
import re
from typing import Any

import yaml
from yaml.events import (DocumentEndEvent, DocumentStartEvent, Event, MappingEndEvent, MappingStartEvent, ScalarEvent,
                         SequenceEndEvent, SequenceStartEvent, StreamEndEvent, StreamStartEvent)

_WORDS = {"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON", "n", "N", "no", "No", "NO",
          "false", "False", "FALSE", "off", "Off", "OFF", "", "~", "null", "Null", "NULL",
          ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF"}
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_BASE60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_DATE = re.compile(r"(\d{4})-(\d\d?)-(\d\d?)")
_CLOCK = re.compile(r"(\d\d?):(\d\d?):(\d\d?)(\.\d+)?")
_ZONE = re.compile(r"Z|[+-]\d\d:\d\d")
_INT = {"0x": 16, "0X": 16, "0o": 8, "0O": 8, "0b": 2, "0B": 2}


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


def sorted_keys(keys: Any) -> list[str]:
    return sorted(keys, key=functools.cmp_to_key(lambda a, b: -1 if _less(a, b) else (1 if _less(b, a) else 0)))


def _scalar(text: str) -> ScalarEvent:
    if "\n" in text:
        style: str | None = "|"
    elif plain_is_string(text):
        style = None
    else:
        style = '"'
    return ScalarEvent(None, None, (True, True), text, style=style)


def _events(value: Any, out: list[Event]) -> None:
    if isinstance(value, dict):
        out.append(MappingStartEvent(None, None, True, flow_style=False))
        for key in sorted_keys(value):
            out.append(_scalar(key))
            _events(value[key], out)
        out.append(MappingEndEvent())
    elif isinstance(value, list):
        out.append(SequenceStartEvent(None, None, True, flow_style=False))
        for item in value:
            _events(item, out)
        out.append(SequenceEndEvent())
    elif isinstance(value, str):
        out.append(_scalar(value))
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
    text: str = yaml.emit(events, allow_unicode=True, width=80, indent=2)
    return text
