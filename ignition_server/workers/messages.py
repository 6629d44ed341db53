"""Every message on the owner–worker channel (channel.py), declared in one place.

Both ends are this program, so pickle carries these as they are. The owner starts a worker
with `Hello`; from then on the owner tells (`IndexChanges`, `Behind`, `RenderWaitIs`, `Hold`), answers (`Granted`,
`Refused`, `WaitIs`) and asks for reports (`ReportNow`, `Drain`); the worker says it serves (`Ready`),
asks (`Ask`, `AskWait`) and reports (`Report`, `Reported`, `Missing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..auth.presented import Presented
from ..auth.tokens import Grant
from ..config import ServeSettings
from ..tls.certificates import TLSFiles


@dataclass(frozen=True)
class WorkerSpec:
    """All a worker needs, sent in its first message (`Hello`)."""

    number: int
    settings: ServeSettings
    port: int
    tls_files: TLSFiles
    memory_bytes: int  # this worker's memory tier and ready bodies: its share of --cache-memory
    ready_bytes: int
    generation: int
    tokens: list[list]
    renders: list[list]


# -- the owner to a worker --------------------------------------------------------------

@dataclass(frozen=True)
class Hello:
    """The first message: who the worker is and the index rows it starts from."""
    spec: WorkerSpec


@dataclass(frozen=True)
class IndexChanges:
    """Token index changes since the worker's rows (or the last IndexChanges), up to `generation`."""
    generation: int
    changes: list[Any]  # payload_cache's index changes, replayed by PayloadCache.apply


@dataclass(frozen=True)
class Behind:
    """What the owner is behind on (a watch reconnecting): the worker's /readyz says so."""
    what: list[str]


@dataclass(frozen=True)
class RenderWaitIs:
    """The Retry-After for a payload still rendering, as the owner's render queue says (render_wait.py)."""
    seconds: int


@dataclass(frozen=True)
class Granted:
    """The answer to `Ask`: the credential opens this payload."""
    ask_id: int
    grant: Grant


@dataclass(frozen=True)
class Refused:
    """The answer to `Ask`: refused, with the status the worker answers the node."""
    ask_id: int
    status: int
    reason: str
    retry_after: int | None


@dataclass(frozen=True)
class WaitIs:
    """The answer to `AskWait`: that NodePool's Retry-After, from its place in the render queue."""
    ask_id: int
    seconds: int


@dataclass(frozen=True)
class Hold:
    """Hold off `source` for `seconds`: the owner counts every worker's failed attempts."""
    source: str | None
    seconds: float


@dataclass(frozen=True)
class ReportNow:
    """A scrape of the owner's /metrics is waiting: report, then say `Reported(report_id)`."""
    report_id: int


@dataclass(frozen=True)
class Drain:
    """Stop accepting, finish in-flight responses, exit."""


# -- a worker to the owner --------------------------------------------------------------

@dataclass(frozen=True)
class Ready:
    """The worker listens and serves."""
    pid: int


@dataclass(frozen=True)
class Ask:
    """A credential the worker would refuse: the owner (who holds the keys and the latest index) decides."""
    ask_id: int
    presented: Presented
    remote: str | None


@dataclass(frozen=True)
class AskWait:
    """A payload still rendering: how long should its node wait (the owner knows its place in the queue)?"""
    ask_id: int
    secret: str


@dataclass(frozen=True)
class Report:
    """Counters since the last report, the NodePools served, the payload bytes held."""
    deltas: dict[str, dict[str | int, int]]  # label (a NodePool, a status code, a cache counter) -> count
    served: list[str]
    held: dict[str, int]


@dataclass(frozen=True)
class Reported:
    """The report `ReportNow(report_id)` asked for has been sent."""
    report_id: int


@dataclass(frozen=True)
class Missing:
    """A stored payload is gone or failed its integrity check: the owner renders it again."""
    secret: str


ToWorker = Hello | IndexChanges | Behind | RenderWaitIs | Granted | Refused | WaitIs | Hold | ReportNow | Drain
ToOwner = Ready | Ask | AskWait | Report | Reported | Missing
Message = ToWorker | ToOwner
