"""The access log: one line per request, in the format of the other logs, written in batches.

Through `logging`, a line cost about a quarter of a kept-alive request's CPU (py-spy: record
construction, the generic JSON formatter, a lock and a write per line). These lines have
fixed fields, so they are formatted directly, in batches: a line is written at most
FLUSH_SECONDS after its request (or once FLUSH_LINES are waiting), not after every turn of
the event loop. Written per turn, the log was ~10% of a kept-alive request's CPU (20 µs of
~200, log on against off; one worker, same run). The client-supplied fields (path, request
id) are redacted as in `logs`, and escaped so that no client can start a line.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
from json.encoder import encode_basestring_ascii as json_string  # json.dumps of a str, minus the encoder
from typing import Any, TextIO

from ..logs import escape_controls, redact, resolve_format

LOGGER = "ignition_server.access"
FLUSH_LINES = 256
FLUSH_SECONDS = 0.1  # how late an access line may reach the log
QUOTES_KEPT = 4096
# A request id redact() and escaping leave as it is: no `=`, `%`, `:`, space, backslash or control
# (what logs._SECRETS needs to match, what escape_controls changes).
_PLAIN = re.compile(r"[A-Za-z0-9._/+-]*")


class AccessLog:
    def __init__(self, log_format: str, stream: TextIO | None = None) -> None:
        self._json = resolve_format(log_format) == "json"
        self._logger = logging.getLogger(LOGGER)  # getLogger takes the logging module's lock: once, not per request
        self._stamp_format = "%Y-%m-%dT%H:%M:%S" if self._json else "%Y-%m-%d %H:%M:%S"
        # As the other logs stamp theirs: JSON in UTC (with a Z), text in local time (logging's asctime).
        self._clock = time.gmtime if self._json else time.localtime
        self._stream = stream
        self._lines: list[tuple[Any, ...]] = []
        self._quotes: dict[str, str] = {}
        self._fixed: dict[tuple[str, str, int, str], tuple[str, str]] = {}
        self._scheduled: asyncio.Handle | None = None
        self._second = -1
        self._stamp = ""

    @property
    def enabled(self) -> bool:
        return self._logger.isEnabledFor(logging.INFO)

    def record(self, method: str, path: str, status: int, *, request_id: str, nodepool: str, size: int,
               duration_ms: float, client: str) -> None:
        # Kept as a tuple and formatted with the rest of its batch in `flush`: one tight loop
        # over a batch runs warm, where code between two ~300 KiB TLS writes runs with cold
        # caches (the whole handler cost 2-3x its in-isolation time there).
        self._lines.append((time.time(), method, path, status, request_id, nodepool, size, duration_ms, client))
        if len(self._lines) >= FLUSH_LINES:
            self.flush()
        elif self._scheduled is None:
            self._scheduled = asyncio.get_running_loop().call_later(FLUSH_SECONDS, self.flush)

    def _quoted(self, text: str) -> str:
        """`text` redacted and, for JSON, quoted; a fleet repeats its paths, NodePools and
        addresses, so each is done once (bounded)."""
        done = self._quotes.get(text)
        if done is None:
            done = redact(text)
            # JSON escapes control characters itself; a text line must not be split by a
            # decoded `%0A` in a path.
            done = json_string(done) if self._json else escape_controls(done)
            if len(self._quotes) >= QUOTES_KEPT:
                self._quotes.clear()
            self._quotes[text] = done
        return done

    def _format(self, now: float, method: str, path: str, status: int, request_id: str, nodepool: str, size: int,
                duration_ms: float, client: str) -> str:
        second = int(now)
        stamp = self._stamp if second == self._second else self._time(second)
        millis = int(now * 1000) % 1000
        # To the microsecond, in round(duration_ms, 3)'s shortest form, for a seventh of its cost
        # (round with digits goes through a decimal string: 0.5 µs a line); a half-way value may
        # round the other way (0.4565 is stored a hair under it).
        duration_ms = round(duration_ms * 1000) / 1000
        # Request ids are mostly unique: redacted and quoted each time, never kept; the server's
        # own and most clients' are plain (nothing redact or escaping could change), checked first.
        if not _PLAIN.fullmatch(request_id):
            request_id = redact(request_id) if self._json else escape_controls(redact(request_id))
        before, middle = self._fixed.get((method, path, status, nodepool)) or self._fix(method, path, status, nodepool)
        # A dict lookup where the address is known (a fleet's nodes each ask a few times).
        client = self._quotes.get(client) or self._quoted(client)
        if self._json:
            return (f'{{"time": "{stamp}.{millis:03d}Z{before}{json_string(request_id)}{middle}{size}, '
                    f'"duration_ms": {duration_ms}, "client": {client}}}')
        return f"{stamp},{millis:03d}{before}{request_id}{middle}{size} duration_ms={duration_ms} client={client}"

    def _fix(self, method: str, path: str, status: int, nodepool: str) -> tuple[str, str]:
        """A line's text around its request id (up to its size) for these fields, redacted and
        quoted (`_quoted`), kept by its parts: a fleet's lines share a few, and looking the
        parts up is cheaper than quoting each field of each line."""
        quoted = self._quoted
        message, pool = quoted(f"{method} {path} {status}"), quoted(nodepool)
        if self._json:
            fixed = (f'", "level": "info", "logger": "{LOGGER}", "msg": {message}, "request_id": ',
                     f', "nodepool": {pool}, "status": {status}, "bytes": ')
        else:
            fixed = (f" INFO    {LOGGER}: {message} request_id=", f" nodepool={pool} status={status} bytes=")
        if len(self._fixed) >= QUOTES_KEPT:
            self._fixed.clear()
        self._fixed[(method, path, status, nodepool)] = fixed
        return fixed

    def _time(self, second: int) -> str:
        """The stamp of `second`: formatted once a second (`_format` calls this only when the
        second changes), not once a request."""
        self._second = second
        self._stamp = time.strftime(self._stamp_format, self._clock(second))
        return self._stamp

    def flush(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        if not self._lines:
            return
        text = "\n".join([self._format(*line) for line in self._lines]) + "\n"
        self._lines.clear()
        stream = self._stream or sys.stderr
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # a closed or full log stream must not fail requests
            pass
