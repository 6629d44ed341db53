"""The data URLs a render writes, and the client rules' check of data URLs, made cheaper (issue
33) but the same: `fragments.data_url` percent-encodes as `urllib.parse.quote` does, and the
check of a data URL refuses what it refused while it decoded every one."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from hypothesis import given, strategies as st

from ignition_server.render.fragments import _SAFE, data_url
from ignition_server.render.inputs import InvalidConfig
from ignition_server.render.validation import validate

# Bytes a payload's files are made of: JSON (indentation, quotes, escapes), text, UTF-8, binary.
_BYTES = st.one_of(
    st.binary(max_size=600),
    st.text(max_size=300).map(str.encode),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                 max_leaves=20).map(lambda v: json.dumps(v, indent=4).encode()),
)


@given(_BYTES)
def test_a_data_url_percent_encodes_as_quote_does(raw: bytes) -> None:
    url = data_url(raw)
    if url.startswith("data:,"):
        assert url == "data:," + quote(raw, safe=_SAFE)


def test_a_large_json_file_is_percent_encoded_as_quote_does() -> None:
    # The shape of the MCS's rendered MachineConfig file: indented JSON holding data URLs.
    raw = json.dumps({"spec": {"config": {"storage": {"files": [
        {"path": f"/etc/f{i}", "contents": {"source": "data:;base64," + "QUJD" * 2000}} for i in range(50)]}}}},
        indent=4).encode()
    url = data_url(raw)
    assert url.startswith("data:,%7B%0A%20%20%20%20%22spec"), url[:40]
    assert url == "data:," + quote(raw, safe=_SAFE)


def _config(source: str) -> dict:
    return {"ignition": {"version": "3.2.0"}, "storage": {"files": [{"path": "/etc/x", "contents": {"source": source}}]}}


@pytest.mark.parametrize("source", ["data:,plain", "data:,%zz-a-malformed-escape-is-kept", "data:,100%", "data:;base64,aGk=",
                                    "data:text/plain;charset=utf-8,%C3%A9"])
def test_data_urls_the_check_accepts(source: str) -> None:
    validate(_config(source), "3.2.0")


@pytest.mark.parametrize("source, why", [
    ("data:no-comma", "invalid data url: no comma"),
    ("data:;base64,aGk", "invalid data url: Incorrect padding"),
    ("data:,\ud800", "invalid data url: 'utf-8' codec can't encode character '\\ud800'"),  # JSON can hold it
])
def test_data_urls_the_check_refuses(source: str, why: str) -> None:
    with pytest.raises(InvalidConfig) as refused:
        validate(_config(source), "3.2.0")
    assert str(refused.value).startswith("storage.files[0].contents.source: " + why)
