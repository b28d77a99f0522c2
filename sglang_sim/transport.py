"""Raw ASGI responses the simulator needs beyond Starlette's: a body streamed in chunks that
watches for the client going away (so the engine can abort the request, as SGLang does), and
that can stop mid-body and drop the connection (the "cut" fault)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

Scope = dict[str, Any]


class ChunkedResponse:
    """Send `chunks` as the body. cut=True: stop after them without finishing the body (uvicorn
    then closes the connection). on_complete runs after a whole body was sent; on_disconnect
    when the client left first."""

    def __init__(self, chunks: AsyncIterator[bytes], *, status: int = 200, media_type: str,
                 content_length: int | None = None, cut: bool = False,
                 on_complete: Callable[[], object] | None = None,
                 on_disconnect: Callable[[], object] | None = None) -> None:
        self.chunks = chunks
        self.status = status
        self.headers = [(b"content-type", media_type.encode())]
        if content_length is not None:
            self.headers.append((b"content-length", str(content_length).encode()))
        self.cut = cut
        self.on_complete = on_complete
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, watch):
                task.cancel()
            for task in (pump, watch):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        if pump.done() and not pump.cancelled() and pump.exception() is None:
            if not self.cut and self.on_complete is not None:
                self.on_complete()
        elif self.on_disconnect is not None:
            self.on_disconnect()

    async def _pump(self, send: Callable) -> None:
        async for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if not self.cut:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _wait_disconnect(receive: Callable) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def wait_or_disconnect(receive: Callable, fut: asyncio.Future[Any]) -> bool:
    """Wait for `fut`; False if the client disconnected first (fut is left pending)."""
    watch = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait({fut, watch}, return_when=asyncio.FIRST_COMPLETED)
        return fut in done
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch


async def one_chunk(body: bytes) -> AsyncIterator[bytes]:
    yield body
