"""Fake Redis servers that misbehave, run on a thread of the test process: one answers any command with an array
header of 2**31-1 elements and then streams integers for as long as the client reads; one accepts and never answers.
Each counts the connections it accepted (a client without backoff reconnects as fast as it fails)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from pagedserve.services.ports import free_port

FLOOD_HEADER = b"*2147483647\r\n"
FLOOD_CHUNK = b":1\r\n" * 16384


@dataclass
class HostileRedis:
    mode: str  # "flood" or "silent"
    port: int = field(default_factory=free_port)
    num_connections: int = 0
    num_bytes_sent: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> HostileRedis:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True, name=f"redis-{self.mode}")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"hostile Redis ({self.mode}) did not start on port {self.port}")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        try:
            if not await reader.read(65536):  # the first command (or the handshake)
                return
            if self.mode == "silent":
                while await reader.read(65536):
                    pass
                return
            writer.write(FLOOD_HEADER)
            while True:
                writer.write(FLOOD_CHUNK)
                await writer.drain()
                self.num_bytes_sent += len(FLOOD_CHUNK)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
