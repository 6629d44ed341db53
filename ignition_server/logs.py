"""Logging: one JSON object per line, or plain text on a terminal. Never tokens or payload text."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

# Whatever a library logs (aiohttp quotes a malformed request line in its errors) passes here:
# a token in a query string or an Authorization value never reaches a log line, however it is
# spelled: whitespace as it is or escaped by a repr or JSON (`Bearer\t`, an obs-folded
# `Authorization:\r\n Bearer`), the parameter name percent-encoded (`tok%65n=`, once or
# twice), after `&` or `;`.
_WS = r"(?:\s|\\+[tnrvf]|\\+x[0-9a-f]{2}|\\+u00[0-9a-f]{2})"  # escaped once or more (a repr in JSON)
_TOKEN_NAME = r"(?:t|%(?:25)?[57]4)(?:o|%(?:25)?[46]f)(?:k|%(?:25)?[46]b)(?:e|%(?:25)?[46]5)(?:n|%(?:25)?[46]e)"
_SECRETS = re.compile(
    rf"(?i)({_TOKEN_NAME}{_WS}*(?:=|%(?:25)?3d){_WS}*|authorization{_WS}*:{_WS}*(?:bearer{_WS}+)?|bearer{_WS}+)"
    r"[^\s&;'\"\\,)]+"
)
# What could end a line early or rewrite it on a terminal: C0 and C1 controls, DEL, the Unicode
# line and paragraph separators. A path's `%0A`, decoded, would otherwise start a forged line.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def redact(text: str) -> str:
    return _SECRETS.sub(lambda m: m.group(1) + "<redacted>", text)


def escape_controls(text: str) -> str:
    """`text` on one line: every control character as a visible escape (`\\n`, `\\x1b`)."""
    return _CONTROLS.sub(lambda m: repr(m.group())[1:-1] if m.group() not in "\u2028\u2029"
                         else f"\\u{ord(m.group()):04x}", text)


# Attributes every LogRecord has; anything else was passed in `extra` and is worth showing.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(self._format(record))

    def _format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """One record per line, and a line per record: the message and every field are escaped
    (`escape_controls`), and a traceback's lines are indented, so nothing a client sends can
    make a line that reads as a record of its own."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.getMessage())
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        extra = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if extra:
            line += " " + " ".join(f"{k}={escape_controls(str(v))}" for k, v in extra.items())
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        for detail in (record.exc_text, record.stack_info and self.formatStack(record.stack_info)):
            if detail:
                line += "".join(f"\n    {escape_controls(part)}" for part in detail.splitlines())
        return redact(line)


class RepeatFilter(logging.Filter):
    """Repeated identical warnings and errors are logged once per `window` seconds, the next
    one saying how many were left out; a malformed request (aiohttp logs each with a full
    traceback at ERROR, so a client could write the log as fast as it sends) is one warning
    line without the traceback, keyed by its kind, not by the client."""

    def __init__(self, window: float = 10.0, keep: int = 1024, clock=time.monotonic) -> None:
        super().__init__()
        self._window, self._keep, self._clock = window, keep, clock
        self._seen: dict[tuple, tuple[float, int]] = {}  # key -> (when last logged, left out since)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        error = record.exc_info[1] if record.exc_info else None
        kind = type(error).__name__ if error is not None else ""
        if record.name.startswith("aiohttp") and error is not None and _is_malformed_request(record):
            record.msg, record.args = "malformed request: %s", (_what_was_malformed(error),)
            record.exc_info, record.exc_text, record.levelno, record.levelname = None, None, logging.WARNING, "WARNING"
            key: tuple = (record.name, kind)
        else:
            key = (record.name, record.levelno, record.getMessage(), kind)
        now = self._clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self._window:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        if len(self._seen) >= self._keep:
            self._seen.clear()
        self._seen[key] = (now, 0)
        if last is not None and last[1]:
            record.repeated_left_out = last[1]
        return True


# aiohttp's description of what was wrong, before it quotes the client's bytes: words of letters,
# digits and a little punctuation, never a quote, a slash or a `?` (a path, a query, a repr start
# there). A single word is dropped too: it could be a bare value.
_DESCRIPTION = re.compile(r"[A-Za-z][A-Za-z0-9 ,._-]*")


def _what_was_malformed(error: BaseException) -> str:
    """The kind of a malformed request and aiohttp's description of it, never what the client sent.

    aiohttp quotes the offending bytes (`Unexpected whitespace after header value: b' c2Vj'`): an
    obs-folded `Authorization: Bearer\\r\\n <token>` puts the token alone on its line, where no
    pattern can tell it from any other text, so no quote of the request is logged at all."""
    from aiohttp.http_exceptions import InvalidURLError

    code = getattr(error, "code", 400)
    message = "" if isinstance(error, InvalidURLError) else str(getattr(error, "message", "")).strip()
    found = _DESCRIPTION.match(message.splitlines()[0]) if message else None
    description = re.sub(r"\s+b$", "", found.group()).strip() if found else ""  # `b` of a b'…' repr
    return f"{code} {type(error).__name__}" + (f": {description}" if " " in description else "")


def _is_malformed_request(record: logging.LogRecord) -> bool:
    from aiohttp.http_exceptions import HttpProcessingError

    return bool(record.exc_info) and isinstance(record.exc_info[1], HttpProcessingError)  # type: ignore[index]


def resolve_format(log_format: str) -> str:
    """`auto`: text on a terminal, JSON otherwise."""
    if log_format == "auto":
        return "text" if sys.stderr.isatty() else "json"
    return log_format


def configure(log_format: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    log_format = resolve_format(log_format)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiohttp's own access log would print query strings (tokens): ours redacts by design.
    logging.getLogger("aiohttp.access").disabled = True
