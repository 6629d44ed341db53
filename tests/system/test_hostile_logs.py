"""A hostile client against the logs of the real server: whatever it sends, no token in any
spelling reaches a line, no line it writes reads as a record of its own, and a flood of
malformed requests is a few lines, not a traceback each."""

from __future__ import annotations

import base64
import logging
import re
import socket
import ssl
from pathlib import Path

import pytest
from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine, InvalidHeader, InvalidURLError, LineTooLong

from ignition_server.logs import JsonFormatter, RepeatFilter, TextFormatter, redact
from testsupport.harness import ServerProcess, wait_for

SPELLINGS = [  # (what a line may hold, the secret in it)
    ("b'GET /config/w?tok%65n=sec-a1 HTTP/1.1\\x01'", "sec-a1"),
    ("GET /config/w?x=1;token=sec-a2", "sec-a2"),
    ("/config/w?TOK%2545N%3Dsec-a3", "sec-a3"),
    ("b'Authorization:\\r\\n\\tBearer\\tc2VjLWE0'", "c2VjLWE0"),  # obs-folded, as a repr shows it
    ("Authorization: Bearer\tc2VjLWE1", "c2VjLWE1"),
    ('"Authorization": "Bearer\\u0009c2VjLWE2"', "c2VjLWE2"),  # as JSON escapes a tab
    ("authorization :  bearer   c2VjLWE3", "c2VjLWE3"),
]


@pytest.mark.parametrize("text, secret", SPELLINGS)
def test_every_spelling_of_a_token_is_redacted(text: str, secret: str) -> None:
    assert secret not in redact(text)
    record = logging.makeLogRecord({"name": "aiohttp.server", "levelno": logging.ERROR, "levelname": "ERROR",
                                    "msg": "Error handling request: %s", "args": (text,)})
    for formatter in (JsonFormatter(), TextFormatter()):
        assert secret not in formatter.format(record)


def malformed(error: Exception) -> logging.LogRecord:
    """The record aiohttp's server logs for a request it could not parse."""
    return logging.makeLogRecord({"name": "aiohttp.server", "levelno": logging.ERROR, "levelname": "ERROR",
                                  "msg": "Error handling request", "exc_info": (type(error), error, None)})


@pytest.mark.parametrize("error", [
    # What llhttp says of an obs-folded `Authorization: Bearer\r\n <token>`: the token alone on its line.
    BadHttpMessage("Unexpected whitespace after header value:\n\n  b' c2VjLWQx'\n    ^"),
    BadHttpMessage("Unexpected whitespace after header value:\n\n  b'\\tc2VjLWQx'\n    ^"),
    InvalidHeader(b"c2VjLWQx\x00"),  # a header value with a NUL, quoted without its name
    InvalidURLError("c2VjLWQx:443"),  # a target, as it came
    LineTooLong(b"c2VjLWQx" * 20, 100),
    BadStatusLine("c2VjLWQx"),
], ids=lambda error: type(error).__name__)
def test_a_malformed_request_is_logged_without_what_the_client_sent(error: Exception) -> None:
    record = malformed(error)
    assert RepeatFilter().filter(record)
    for formatter in (JsonFormatter(), TextFormatter()):
        line = formatter.format(record)
        assert "c2VjLWQx" not in line and "malformed request: 400" in line, line


def test_repeated_identical_errors_are_logged_once_a_window() -> None:
    now = [0.0]
    repeat = RepeatFilter(window=10.0, clock=lambda: now[0])

    def record(message: str) -> logging.LogRecord:
        return logging.makeLogRecord({"name": "x", "levelno": logging.ERROR, "levelname": "ERROR", "msg": message})

    assert [repeat.filter(record("same")) for _ in range(5)] == [True, False, False, False, False]
    assert repeat.filter(record("other"))  # a different error is not held back by the first
    now[0] = 11.0
    again = record("same")
    assert repeat.filter(again) and again.repeated_left_out == 4


def send(proc: ServerProcess, data: bytes) -> bytes:
    context = proc.ssl_context()
    with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(data)
            try:
                return tls.recv(200)
            except (ssl.SSLError, ConnectionError):
                return b""


@pytest.mark.parametrize("fold", [b"\r\n ", b"\r\n\t"], ids=["space", "tab"])
@pytest.mark.parametrize("log_format", ["json", "text"])
def test_an_obs_folded_bearer_token_reaches_no_log_line(tmp_path: Path, fold: bytes, log_format: str) -> None:
    # One malformed request a server: only the first of a kind is logged in a window (RepeatFilter).
    (tmp_path / "source").mkdir()
    proc = ServerProcess(tmp_path / "source", tmp_path / "cache", extra=["--log-format", log_format, "--workers", "0"]).start()
    try:
        assert send(proc, b"GET /ignition HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer" + fold
                    + b"c2VjLWM1\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.0 400")
        send(proc, b"GET /config/w HTTP/1.1\r\nHost: x\r\nX-Request-Id: last-one\r\nConnection: close\r\n\r\n")
        wait_for(lambda: "last-one" in proc.logs(), what="the last request's access line")
    finally:
        proc.stop()
    logs = proc.logs()
    assert "malformed request" in logs  # the request was logged, as the kind of error it was
    assert "c2VjLWM1" not in logs


def test_a_hostile_client_cannot_leak_forge_or_flood_the_text_log(tmp_path: Path) -> None:
    (tmp_path / "source").mkdir()
    proc = ServerProcess(tmp_path / "source", tmp_path / "cache", extra=["--log-format", "text"]).start()
    try:
        secrets = ["sec-b1", "c2VjLWIy", "c2VjLWIz"]
        send(proc, b"GET /config/w?a=1;tok%65n=sec-b1 HTTP/1.1\x01\r\nHost: x\r\n\r\n")
        send(proc, b"GET /ignition HTTP/1.1\r\nHost: x\r\nAuthorization:\r\n\tBearer\tc2VjLWIy\r\nX: \x01\r\n\r\n")
        send(proc, b"GET /ignition HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer\tc2VjLWIz\r\nX: \x01\r\n\r\n")
        # A decoded %0A in the path, a request id with fields of its own: each would write a line of its own.
        send(proc, b"GET /config/w%0A1999-01-01%2000:00:00,000%20INFO%20%20%20%20forged:%20x HTTP/1.1\r\n"
                   b"Host: x\r\nX-Request-Id: id1 status=200 client=192.0.2.66\r\nConnection: close\r\n\r\n")
        for n in range(40):  # a flood of malformed requests
            send(proc, b"GET /x%d HTTP/1.1\x01\r\nHost: x\r\n\r\n" % n)
        send(proc, b"GET /config/w HTTP/1.1\r\nHost: x\r\nX-Request-Id: last-one\r\nConnection: close\r\n\r\n")
        wait_for(lambda: "last-one" in proc.logs(), what="the last request's access line")
    finally:
        proc.stop()
    logs = proc.logs()
    for secret in secrets:
        assert secret not in logs, secret
    assert base64.b64encode(b"sec-b1").decode() not in logs
    record_start = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
    for line in logs.splitlines():
        assert record_start.match(line) or line.startswith(" ") or not line.strip(), f"a line of no record: {line!r}"
        assert not line.startswith("1999-"), f"a forged record: {line!r}"
    assert "client=192.0.2.66" not in logs
    assert "Traceback" not in logs
    malformed = logs.count("malformed request")
    assert 1 <= malformed <= 8, f"{malformed} lines for 43 malformed requests"  # per kind and process, per 10 s
