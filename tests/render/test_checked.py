"""Checks that skip the items already found clean (render/checked.py) find what full checks find.

The premise: each item of a config's lists is checked on its own (the bundled schemas give a
list's items one schema and nothing else: no uniqueItems, no length bounds, no oneOf). Then the
problems of a config, items known clean or not, in order and with their paths, and the lowest
spec version and the reason for it, are what they were without any memo.
"""

from __future__ import annotations

import base64
import importlib.resources
import json
import random
from urllib.parse import quote

import pytest

from ignition_server.render.checked import ITEM_LISTS, CheckedItems
from ignition_server.render.fragments import data_url
from ignition_server.render.inputs import InvalidConfig
from ignition_server.render.spec import SUPPORTED_VERSIONS, minimum_version_reason, version_problems
from ignition_server.render.validation import validate

SHA = "sha256-" + "0" * 64


def schemas() -> list[tuple[str, dict]]:
    folder = importlib.resources.files("ignition_server.render").joinpath("schemas")
    return [(entry.name, json.loads(entry.read_text())) for entry in folder.iterdir() if entry.name.endswith(".json")]


def test_the_schemas_check_each_item_of_a_list_on_its_own() -> None:
    """What CheckedItems relies on: were a schema to constrain a list as a whole (uniqueItems,
    minItems, maxItems, additionalItems, an items tuple), or items through one another
    (oneOf, anyOf, not, dependencies), an item clean in one config could be wrong in another."""
    seen: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("properties", "definitions"):
                    for sub in value.values():
                        walk(sub)
                    continue
                seen.add(key)
                if key == "items":
                    assert isinstance(value, dict), "an items tuple"
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    found = schemas()
    assert len(found) == len(SUPPORTED_VERSIONS)
    for _, schema in found:
        walk(schema)
    assert seen <= {"$schema", "$ref", "allOf", "items", "properties", "required", "title", "type", "definitions",
                    "description", "enum", "default"}, seen
    for name, schema in found:
        storage = schema["definitions"]["storage"]["properties"]
        for section, listed in ITEM_LISTS:
            node = storage[listed] if section == "storage" else schema["definitions"]["systemd"]["properties"][listed]
            assert set(node) == {"type", "items"}, (name, listed)


def item(r: random.Random, i: int) -> dict:
    """A file, often fine, sometimes wrong (unknown key, bad mode, wrong type), sometimes later-spec."""
    entry: dict = {"path": f"/etc/f{r.randrange(6)}", "mode": 0o644, "contents": {"source": f"data:,{i % 3}"}}
    pick = r.randrange(10)
    if pick == 0:
        entry["colour"] = "blue"
    elif pick == 1:
        entry["mode"] = "rw"
    elif pick == 2:
        entry["mode"] = 0o4755
    elif pick == 3:
        entry["contents"] = {"source": "https://example.com/x", "verification": {"hash": SHA}}
    elif pick == 4:
        entry["contents"] = {"source": "gs://bucket/x"}
    elif pick == 5:
        entry["contents"] = {"source": "ftp://example.com/x"}
    return entry


def unit(r: random.Random) -> dict:
    return r.choice([{"name": "a.service", "enabled": True}, {"name": "b.service", "mask": "yes"},
                     {"name": "c.service", "dropins": [{"name": "x.conf", "contents": "[Unit]\n"}]},
                     {"name": "d.service", "extra": 1}])


def configs(seed: int, count: int) -> list[dict]:
    r = random.Random(seed)
    out = []
    for n in range(count):
        config: dict = {"ignition": {"version": "3.0.0"},
                        "storage": {"files": [item(r, n) for _ in range(r.randrange(0, 6))],
                                    "links": [{"path": "/etc/l", "target": "/tmp", "hard": r.random() < 0.3}]},
                        "systemd": {"units": [unit(r) for _ in range(r.randrange(0, 3))]}}
        if r.random() < 0.2:
            config["kernelArguments"] = {"shouldExist": ["a"]}
        if r.random() < 0.1:
            config["storage"]["filesystems"] = [{"device": "/dev/sdb", "format": "none"}]
        out.append(config)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_problems_are_the_same_with_items_known_clean(seed: int) -> None:
    checked = CheckedItems(maxsize=32)  # small: items come and go
    for config in configs(seed, 100):
        for version in SUPPORTED_VERSIONS:
            assert list(version_problems(config, version, checked)) == list(version_problems(config, version))
        try:
            want: tuple = ("ok", minimum_version_reason(config))
        except InvalidConfig as exc:
            want = ("error", str(exc))
        try:
            have: tuple = ("ok", minimum_version_reason(config, checked))
        except InvalidConfig as exc:
            have = ("error", str(exc))
        assert have == want
        if want[0] == "ok":
            config = {**config, "ignition": {"version": want[1][0]}}
            assert outcome(lambda: validate(config, want[1][0], checked)) == outcome(lambda: validate(config, want[1][0]))
    assert len(checked) > 0


def outcome(check) -> str:
    try:
        check()
    except InvalidConfig as exc:
        return str(exc)
    return "valid"


def test_an_item_clean_elsewhere_is_found_at_its_own_place() -> None:
    checked = CheckedItems()
    clean = {"path": "/etc/a", "contents": {"source": "data:,a"}}
    assert list(version_problems({"storage": {"files": [clean]}}, "3.0.0", checked)) == []
    wrong = {"path": "/etc/b", "colour": "x"}
    config = {"storage": {"files": [clean, clean, wrong, clean]}}
    assert list(version_problems(config, "3.0.0", checked)) == list(version_problems(config, "3.0.0")) \
        == [(("storage", "files", 2, "colour"), "unknown key in spec 3.0.0", "storage.files[2].colour")]


def test_values_json_cannot_write_are_always_checked() -> None:
    import datetime as dt

    assert CheckedItems.key("spec", "3.0.0", {"path": dt.date(2026, 1, 1)}) is None
    assert CheckedItems.key("spec", "3.0.0", {"mode": float("nan")}) is None
    assert CheckedItems.key("spec", "3.0.0", {"mode": "1"}) != CheckedItems.key("spec", "3.0.0", {"mode": 1})
    assert CheckedItems.key("spec", "3.0.0", {"mode": 1}) != CheckedItems.key("spec", "3.0.0", {"mode": True})
    assert CheckedItems.key("spec", "3.0.0", {"mode": 1}) != CheckedItems.key("spec", "3.1.0", {"mode": 1})


def test_a_key_that_is_not_a_string_is_never_clean() -> None:
    """JSON writes {1: ...} as {"1": ...}: both are unknown keys, so neither is ever learnt clean."""
    checked = CheckedItems()
    for entry in ({1: "x"}, {"1": "x"}):  # (beside string keys, sorting them fails before any memo)
        config = {"storage": {"files": [entry]}}
        assert list(version_problems(config, "3.0.0", checked)) == list(version_problems(config, "3.0.0")) != []
    assert len(checked) == 0


def test_data_url_is_the_shorter_of_percent_and_base64() -> None:
    def both(raw: bytes) -> str:
        b64 = "data:;base64," + base64.b64encode(raw).decode("ascii")
        pct = "data:," + quote(raw, safe="/:=,.-_~@;")
        return pct if len(pct) <= len(b64) else b64

    r = random.Random(7)
    alphabet = [bytes([i]) for i in range(256)] + [b"a", b"/", b" ", b"\n", b"%", b"Z"] * 40
    for _ in range(5000):
        raw = b"".join(r.choice(alphabet) for _ in range(r.randrange(0, 50)))
        assert data_url(raw) == both(raw)
    assert data_url("né à\n") == both("né à\n".encode())
