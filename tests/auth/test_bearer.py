"""The Bearer value's decoding: every value gets the answer base64.b64decode(validate=True) gave
(bearer_token calls binascii directly, without b64decode's two Python frames per request)."""

from __future__ import annotations

import base64
import binascii

import pytest

from ignition_server.auth.tokens import Refusal, bearer_token


def reference(header: str | None) -> str | int:
    """The token, or the refusal's status, as bearer_token answered with base64.b64decode."""
    if not header:
        return 401
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return 401
    try:
        token = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return 401
    return token if token and token.isprintable() else 401


VALUES = [
    base64.b64encode(b"tok-0123456789abcdef").decode(),
    "  " + base64.b64encode(b"padded ").decode() + "  ",
    base64.b64encode(b"ab").decode().rstrip("="),  # padding missing
    base64.b64encode(b"ab").decode() + "=",  # padding too long
    "dG9r\nZW4=", "dG9r ZW4=", "dG9r_ZW4-", "dG9rZW4=dG9r",  # characters or padding out of place
    "dG9rZW4é=", "ＤＧ９ｒ",  # not ASCII
    base64.b64encode("tökén".encode()).decode(),  # UTF-8 token
    base64.b64encode(b"\xff\xfe").decode(),  # not UTF-8
    base64.b64encode(b"tab\there").decode(),  # not printable
    base64.b64encode(b"").decode(), "=", "",
]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "Basic"])
def test_each_value_gets_the_answer_b64decode_gave(scheme: str, value: str) -> None:
    header = f"{scheme} {value}"
    try:
        got: str | int = bearer_token(header)
    except Refusal as refusal:
        got = refusal.status
    assert got == reference(header)


def test_no_header_is_refused() -> None:
    for header in (None, "", "Bearer", "Bearer   "):
        with pytest.raises(Refusal) as refused:
            bearer_token(header)
        assert refused.value.status == 401
