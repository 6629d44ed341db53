"""Go's encoding as the takeover reproduces it, piece by piece (tests/takeover/test_cpo_parity.py
compares the whole with HyperShift's own code): the Go types' shape is complete, durations print
as Go prints them, keys sort as go-yaml sorts them, strings are quoted where go-yaml quotes them."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from ignition_server.takeover import go_json, go_yaml


def test_every_struct_the_shape_names_is_in_it() -> None:
    shapes = json.loads(resources.files("ignition_server.takeover").joinpath("go_types.json").read_text())
    named: set[str] = set()

    def walk(ref: Any) -> None:
        if isinstance(ref, dict):
            (kind, inner), = ref.items()
            if kind == "struct":
                named.add(inner)
            elif kind != "custom":
                walk(inner)
    for fields in shapes["structs"].values():
        for field in fields:
            walk(field["type"])
    assert set(shapes["roots"].values()) | named <= set(shapes["structs"])


@pytest.mark.parametrize("given, printed", [
    ("300s", "5m0s"), ("1h", "1h0m0s"), ("90m", "1h30m0s"), ("1.5s", "1.5s"), ("1500ms", "1.5s"), ("300ms", "300ms"),
    ("0", "0s"), ("0s", "0s"), ("2h45m30.25s", "2h45m30.25s"), ("1us", "1µs"), ("-90s", "-1m30s"), ("100ns", "100ns"),
])
def test_durations_print_as_go_prints_them(given: str, printed: str) -> None:
    assert go_json.format_duration(go_json.parse_duration(given)) == printed


def test_go_json_keeps_field_order_drops_unknown_fields_and_escapes_html() -> None:
    tls = {"minTLSVersion": "VersionTLS12", "ciphers": ["a<b"], "unknown": 1}
    out = go_json.struct({"tlsSecurityProfile": {"custom": tls, "type": "Custom"}}, "ClusterConfiguration")
    assert out == {}  # a field ClusterConfiguration does not have
    out = go_json.struct({"apiServer": {"tlsSecurityProfile": {"custom": tls, "type": "Custom"}}}, "ClusterConfiguration")
    text = go_json.dumps(out)
    assert '"type":"Custom","custom":{"ciphers":["a\\u003cb"],"minTLSVersion":"VersionTLS12"}' in text
    assert "unknown" not in text


# Recorded from go-yaml v2.4.4 (go.yaml.in/yaml/v2, as HyperShift 3ee96155 vendors it): yaml.Marshal of a
# map with these keys, and of {"k": value} for each value.
GO_YAML_KEY_ORDER = ["-1", ".a", "_x", "1", "2", "10", "B", "Z", "a", "a-b", "a0", "a00", "a001", "a9", "a09", "a10", "ab", "b", "x1y", "x01y", "z", "ä"]
GO_YAML_SCALARS = [
    ("plain", "plain"),
    ("10.0.0.0/16", "10.0.0.0/16"),
    ("3.2.0", "3.2.0"),
    ("", "\"\""),
    ("true", "\"true\""),
    ("Off", "\"Off\""),
    ("y", "\"y\""),
    ("~", "\"~\""),
    ("123", "\"123\""),
    ("0x1f", "\"0x1f\""),
    ("1e3", "\"1e3\""),
    (".5", "\".5\""),
    (".inf", "\".inf\""),
    ("2026-01-02", "\"2026-01-02\""),
    ("2026-01-02T03:04:05Z", "\"2026-01-02T03:04:05Z\""),
    ("2026-13-02", "2026-13-02"),
    ("<<", "<<"),
    ("+", "+"),
    ("1.2.3", "1.2.3"),
    ("1:30", "\"1:30\""),
    ("0o17", "\"0o17\""),
    ("08", "\"08\""),
    ("-12", "\"-12\""),
    ("1_000", "\"1_000\""),
    ("0b101", "\"0b101\""),
    ("-0b1", "\"-0b1\""),
    ("0x_1f", "\"0x_1f\""),
    ("1__0", "\"1__0\""),
    (".", "."),
    ("-", "'-'"),
    ("+1", "\"+1\""),
    ("0.", "\"0.\""),
    ("1e", "1e"),
    ("0x", "0x"),
    ("2001-1-1", "\"2001-1-1\""),
    ("2026-01-02 03:04:05", "\"2026-01-02 03:04:05\""),
    ("2026-01-02t03:04:05Z", "\"2026-01-02t03:04:05Z\""),
    ("2026-01-02T03:04:05", "2026-01-02T03:04:05"),
    ("12e3", "\"12e3\""),
    ("-.5", "\"-.5\""),
    ("+.5e-3", "\"+.5e-3\""),
    ("9223372036854775808", "\"9223372036854775808\""),
    ("18446744073709551616", "\"18446744073709551616\""),
    ("-9223372036854775809", "\"-9223372036854775809\""),
    ("0777", "\"0777\""),
    ("0999", "\"0999\""),
    ("1.0e+5", "\"1.0e+5\""),
    ("Inf", "Inf"),
    ("NaN", "NaN"),
    ("infinity", "infinity"),
    (".Inf", "\".Inf\""),
    ("tab\there", "\"tab\\there\""),
    ("a b", "a b"),
    ("café", "café"),
]


def test_keys_sort_as_go_yaml_sorts_them() -> None:
    assert go_yaml.sorted_keys(reversed(GO_YAML_KEY_ORDER)) == GO_YAML_KEY_ORDER


@pytest.mark.parametrize("value, printed", GO_YAML_SCALARS)
def test_scalars_print_as_go_yaml_prints_them(value: str, printed: str) -> None:
    assert go_yaml.dump({"k": value}) == f"k: {printed}\n"
