"""Logging: one JSON object per line, or plain text on a terminal. Never tokens or payload text."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

# Whatever a library logs (aiohttp quotes a malformed request line in its errors) passes here:
# a token in a query string or an Authorization value never reaches a log line.
_SECRETS = re.compile(r"(?i)(token=|authorization:\s*(?:bearer\s+)?|bearer\s+)[^\s&'\"\\,)]+")


def redact(text: str) -> str:
    return _SECRETS.sub(lambda m: m.group(1) + "<redacted>", text)


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
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        line = redact(line)
        extra = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if extra:
            line += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        return line


def resolve_format(log_format: str) -> str:
    """`auto`: text on a terminal, JSON otherwise."""
    if log_format == "auto":
        return "text" if sys.stderr.isatty() else "json"
    return log_format


def configure(log_format: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    log_format = resolve_format(log_format)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiohttp's own access log would print query strings (tokens): ours redacts by design.
    logging.getLogger("aiohttp.access").disabled = True
