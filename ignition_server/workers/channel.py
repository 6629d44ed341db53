"""The wire between the owner and a worker: length-prefixed pickles over a socketpair.

Both ends are this program (the owner starts the worker with the socket's other end), so
pickle carries the records and settings as they are. What may be sent is declared in
messages.py.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct

from .messages import Message

_LENGTH = struct.Struct("!I")


class Channel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer)

    def send(self, message: Message) -> None:
        """Queue a message (never blocks; `drain` waits for the buffer to empty)."""
        if self._writer.is_closing():
            return
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._writer.write(_LENGTH.pack(len(data)) + data)

    async def drain(self) -> None:
        await self._writer.drain()

    async def receive(self) -> Message:
        """The next message; raises EOFError when the other end is gone."""
        try:
            (length,) = _LENGTH.unpack(await self._reader.readexactly(_LENGTH.size))
            return pickle.loads(await self._reader.readexactly(length))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise EOFError("the other process closed the channel") from exc

    def close(self) -> None:
        self._writer.close()
