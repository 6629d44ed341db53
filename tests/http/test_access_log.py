"""The access log writes the same JSON lines the logging formatter would, in batches, with
client-supplied fields redacted."""

from __future__ import annotations

import asyncio
import io
import json
import time

from ignition_server.http.access_log import FLUSH_LINES, FLUSH_SECONDS, AccessLog


async def test_lines_are_json_with_every_field_and_are_written_in_batches_soon_after() -> None:
    stream = io.StringIO()
    log = AccessLog("json", stream=stream)
    loop = asyncio.get_running_loop()
    recorded = loop.time()
    log.record("GET", "/config/workers", 200, request_id="w1-2a", nodepool="clusters/workers", size=1234,
               duration_ms=0.5, client="127.0.0.1")
    assert stream.getvalue() == ""  # batched: written a moment later, with the lines around it
    # Within its bound, not at the next flush by size: the flush is due FLUSH_SECONDS after the
    # request (the loop's own schedule; how late a loaded machine runs it is not the log's doing).
    assert log._scheduled is not None and log._scheduled.when() <= recorded + FLUSH_SECONDS + 0.01
    await asyncio.sleep(0)
    if loop.time() < recorded + FLUSH_SECONDS:  # the next turn of the loop, unless the machine stalled us past the bound
        assert stream.getvalue() == ""
    started = time.monotonic()
    while not stream.getvalue() and time.monotonic() - started < 30:
        await asyncio.sleep(0.01)
    entry = json.loads(stream.getvalue())
    assert entry["msg"] == "GET /config/workers 200" and entry["logger"] == "ignition_server.access"
    assert {k: entry[k] for k in ("request_id", "nodepool", "status", "bytes", "client")} == {
        "request_id": "w1-2a", "nodepool": "clusters/workers", "status": 200, "bytes": 1234, "client": "127.0.0.1"}
    assert entry["time"].endswith("Z") and "T" in entry["time"]


async def test_a_full_batch_is_written_at_once_and_tokens_in_client_fields_are_redacted() -> None:
    stream = io.StringIO()
    log = AccessLog("json", stream=stream)
    for i in range(FLUSH_LINES):
        log.record("GET", "/x?token=secret-tok", 401, request_id=f'Bearer secret-{i} "q"', nodepool="-", size=0,
                   duration_ms=0.1, client="::1")
    lines = stream.getvalue().splitlines()
    assert len(lines) == FLUSH_LINES
    assert "secret" not in stream.getvalue()
    assert all(json.loads(line)["status"] == 401 for line in lines)  # quotes in a client field stay valid JSON
    log.flush()


async def test_text_lines_read_like_the_other_text_logs() -> None:
    stream = io.StringIO()
    log = AccessLog("text", stream=stream)
    log.record("GET", "/ignition", 503, request_id="7", nodepool="-", size=12, duration_ms=0.2, client="10.0.0.9")
    log.flush()
    line = stream.getvalue().strip()
    assert " INFO    ignition_server.access: GET /ignition 503 " in line, line
    assert line.endswith("request_id=7 nodepool=- status=503 bytes=12 duration_ms=0.2 client=10.0.0.9"), line


async def test_text_stamps_are_in_the_same_zone_as_the_other_text_logs(monkeypatch) -> None:
    import logging
    import time

    from ignition_server.logs import TextFormatter

    monkeypatch.setenv("TZ", "Asia/Kolkata")  # +05:30: a stamp in UTC could not match
    time.tzset()
    try:
        stream = io.StringIO()
        log = AccessLog("text", stream=stream)
        log.record("GET", "/healthz", 200, request_id="1", nodepool="-", size=3, duration_ms=0.1, client="-")
        log.flush()
        other = TextFormatter().format(logging.makeLogRecord({"msg": "x", "levelname": "INFO", "name": "n"}))
        assert stream.getvalue()[:16] == other[:16]  # YYYY-mm-dd HH:MM (a minute boundary could part them)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


async def test_durations_print_as_round_to_the_microsecond_did_and_only_plain_ids_skip_redaction() -> None:
    stream = io.StringIO()
    log = AccessLog("json", stream=stream)
    durations = [0.0, 0.1, 0.2, 0.4565, 1.0005, 12.3456789, 1234.5678, 0.00049, 0.0005001]
    for i, duration in enumerate(durations):
        log.record("GET", "/ignition", 200, request_id=f"w0-{i:x}", nodepool="-", size=1, duration_ms=duration,
                   client="-")
    # Ids the server accepts from a client (app._REQUEST_ID) that redaction or escaping would change.
    for request_id in ("Authorization:c2VjcmV0", "a/b+c_d.e-F9", "x:y"):
        log.record("GET", "/ignition", 200, request_id=request_id, nodepool="-", size=1, duration_ms=1.0, client="-")
    log.flush()
    entries = [json.loads(line) for line in stream.getvalue().splitlines()]
    printed = [line.split('"duration_ms": ')[1].split(",")[0] for line in stream.getvalue().splitlines()]
    # As round(duration, 3) printed them: to the microsecond, in the shortest form; a half-way
    # value may go the other way (0.4565 is stored a hair under it: 0.456, where round says 0.457).
    for duration, text in zip(durations, printed):
        assert text == repr(float(text)) and len(text.partition(".")[2]) <= 3, text
        assert abs(float(text) - duration) <= 0.0005 + 1e-12, (duration, text)
    assert printed[:len(durations)] == ["0.0", "0.1", "0.2", "0.456", "1.0", "12.346", "1234.568", "0.0", "0.001"]
    assert [e["request_id"] for e in entries[len(durations):]] == ["Authorization:<redacted>", "a/b+c_d.e-F9", "x:y"]


async def test_lines_sharing_some_fields_each_keep_their_own() -> None:
    # A line's fixed text is kept per (method, path, status, NodePool): lines that share some
    # of them, interleaved, each print their own.
    fields = [("GET", "/ignition", 200, "clusters/a", "10.0.0.1"), ("GET", "/ignition", 200, "clusters/b", "10.0.0.1"),
              ("HEAD", "/ignition", 200, "clusters/a", "10.0.0.2"), ("GET", "/ignition", 403, "clusters/a", "10.0.0.1"),
              ("GET", "/config/a", 200, "clusters/a", "::1"), ("GET", "/ignition", 200, "clusters/a", "10.0.0.3")]
    for log_format in ("json", "text"):
        stream = io.StringIO()
        log = AccessLog(log_format, stream=stream)
        for i, (method, path, status, nodepool, client) in enumerate(fields * 2):
            log.record(method, path, status, request_id=f"w0-{i:x}", nodepool=nodepool, size=i, duration_ms=0.5,
                       client=client)
        log.flush()
        lines = stream.getvalue().splitlines()
        assert len(lines) == 2 * len(fields)
        for i, (line, (method, path, status, nodepool, client)) in enumerate(zip(lines, fields * 2)):
            if log_format == "json":
                entry = json.loads(line)
                assert {k: entry[k] for k in ("msg", "request_id", "nodepool", "status", "bytes", "duration_ms", "client")} == {
                    "msg": f"{method} {path} {status}", "request_id": f"w0-{i:x}", "nodepool": nodepool,
                    "status": status, "bytes": i, "duration_ms": 0.5, "client": client}
            else:
                assert line.endswith(f" INFO    ignition_server.access: {method} {path} {status} request_id=w0-{i:x} "
                                     f"nodepool={nodepool} status={status} bytes={i} duration_ms=0.5 client={client}"), line
