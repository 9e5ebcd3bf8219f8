"""asyncio views of the SDK's blocking streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any, Final

from rollout_pipeline.sdk.delivery import EventStream
from rollout_pipeline.sdk.groups import GroupStream

_END: Final = object()


def _next_or_end(iterator: Iterator[Any]) -> Any:
    try:
        return next(iterator)
    except StopIteration:
        return _END


class AsyncStream(AsyncIterator[Any]):
    """Async view of an `EventStream` or `GroupStream`: each step runs in a worker thread (the loop never blocks).

    `async with` acknowledges the last item when the block ends normally, like the sync `with`.
    """

    def __init__(self, stream: EventStream | GroupStream) -> None:
        self._stream = stream

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Any:
        item = await asyncio.to_thread(_next_or_end, self._stream)
        if item is _END:
            raise StopAsyncIteration
        return item

    async def aclose(self, *, ack_current: bool = False) -> None:
        await asyncio.to_thread(lambda: self._stream.close(ack_current=ack_current))

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose(ack_current=exc_type is None)
