"""ART-style API on top of the pipeline: `invoke` -> `RolloutFuture`, `run_batch` -> `BatchItem`s.

Same surface as `agentcore_rl_toolkit.RolloutClient` (0.2.0), different engine: nothing polls S3. A submission goes
to the rollout queue (the pipeline enforces the global TPS and session limits, retries and deadlines) and a single
background dispatcher thread per client long-polls the client's own subscription on the event bus (made before its
first submission, removed at `close()`) and resolves futures from the pushed `Rollout Completed` / `Rollout Failed`
events. Differences from ART are listed in docs/sdk.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import traceback
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from rollout_pipeline.contracts import DetailType, RolloutCompleted, RolloutFailed
from rollout_pipeline.sdk.batches import Batches
from rollout_pipeline.sdk.delivery import DEFAULT_POLL_WAIT_S, EventFilter, EventStream
from rollout_pipeline.sdk.errors import RolloutFailedError, SdkError
from rollout_pipeline.sdk.events import Events
from rollout_pipeline.sdk.handle import ExperimentHandle
from rollout_pipeline.sdk.transport import Event, QueueReader

if TYPE_CHECKING:
    from rollout_pipeline.ports import AgentRuntime

logger = logging.getLogger(__name__)

#: Batches of this client remembered after their futures resolved, so late duplicates are still consumed.
_RECENT_BATCHES: Final = 10_000
#: How long the dispatcher keeps consuming its batches' trailing events after the last future resolved.
DEFAULT_LINGER_S: Final = 10.0
#: Pause between empty receives when the client was made with `poll_wait_s` < 1 (short polling).
_SHORT_POLL_PAUSE_S: Final = 0.2
#: Consecutive dispatcher errors (e.g. expired credentials) after which pending futures fail with the error.
_MAX_DISPATCH_ERRORS: Final = 5
#: What a client's own subscription takes from the bus: the outcomes, and `Batch Completed` (after which the ledger
#: holds every outcome of that batch: one the subscription missed is read there).
_CLIENT_TYPES: Final = (DetailType.ROLLOUT_COMPLETED, DetailType.ROLLOUT_FAILED, DetailType.BATCH_COMPLETED)

__all__ = ["BatchItem", "BatchResult", "CancelledError", "RolloutClient", "RolloutFuture"]


@dataclass
class BatchItem:
    """One payload's outcome in `run_batch` (ART's `BatchItem` fields, plus the pipeline event).

    success: the rollout succeeded (`Rollout Completed`); result: its result object; error: why not (a failed
    rollout's reason and error text, a timeout, a submission error); index: the payload's position; elapsed:
    seconds from submission to the outcome; event: the `Rollout Completed` / `Rollout Failed` detail, if any.
    """

    success: bool
    result: dict[str, Any] | None = None
    error: str | None = None
    index: int | None = None
    elapsed: float | None = None
    event: RolloutCompleted | RolloutFailed | None = None


class RolloutFuture:
    """The future result of one rollout, resolved by the pushed event (never by polling).

    `result(timeout)` returns the result object (ART's dict: the agent's output plus `rewards`, `status_code`...)
    or raises `RolloutFailedError` (the rollout failed: reason, error), `TimeoutError` (not yet: the future stays
    pending and can be waited on again) or `concurrent.futures.CancelledError` (cancelled). Results too big to
    travel in the event are read from S3 on first access.
    """

    def __init__(
        self, client: RolloutClient, batch_id: str, input_id: str, index: int = 0, *, owns_batch: bool = False
    ) -> None:
        self._client = client
        self.batch_id = batch_id
        self.input_id = input_id
        self.index = index
        self._owns_batch = owns_batch
        self._inner: concurrent.futures.Future[RolloutCompleted] = concurrent.futures.Future()
        self._start = time.monotonic()
        self._finished: float | None = None
        self._event: RolloutCompleted | RolloutFailed | None = None
        self._result: dict[str, Any] | None = None
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------------------- resolution

    def _resolve(self, detail: RolloutCompleted | RolloutFailed) -> None:
        with self._lock:
            if self._inner.done():
                return
            self._event = detail
            self._finished = time.monotonic()
            if isinstance(detail, RolloutCompleted):
                self._inner.set_result(detail)
            else:
                message = f"rollout {detail.rollout_id} of batch {detail.batch_id} failed: {detail.reason.value}: "
                self._inner.set_exception(
                    RolloutFailedError(message + detail.error, event=detail, reason=detail.reason.value)
                )

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if not self._inner.done():
                self._finished = time.monotonic()
                self._inner.set_exception(exc)

    # ------------------------------------------------------------------------------------------- waiting

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the rollout is terminal (at most `timeout` seconds) and return its result object."""
        detail = self._inner.result(timeout)
        return self._materialize(detail)

    async def result_async(self, timeout: float | None = None) -> dict[str, Any]:
        """`result()` for asyncio; a timeout leaves the future pending (it is not cancelled)."""
        wrapped = asyncio.shield(asyncio.wrap_future(self._inner))
        try:
            detail = await asyncio.wait_for(wrapped, timeout) if timeout is not None else await wrapped
        except TimeoutError:
            raise TimeoutError(f"Result not ready after {timeout}s") from None
        if self._result is None and detail.result is None:
            return await asyncio.to_thread(self._materialize, detail)
        return self._materialize(detail)

    def __await__(self) -> Any:
        return self.result_async().__await__()

    def _materialize(self, detail: RolloutCompleted) -> dict[str, Any]:
        with self._lock:
            if self._result is None:
                if detail.result is not None:
                    self._result = dict(detail.result)
                else:
                    self._result = self._client.experiment.fetch_result(detail.result_uri)
            return self._result

    def done(self) -> bool:
        """True once the rollout is terminal (succeeded or failed) or the future was cancelled."""
        return self._inner.done()

    async def done_async(self) -> bool:
        """ART compatibility: same as `done()` (no I/O involved)."""
        return self.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The failure (`RolloutFailedError`...) once terminal, or None on success."""
        return self._inner.exception(timeout)

    def add_done_callback(self, fn: Any) -> None:
        """Call `fn(self)` when the future is done (from the dispatcher thread)."""
        self._inner.add_done_callback(lambda _inner: fn(self))

    # -------------------------------------------------------------------------------------------- cancel

    def cancel(self) -> bool:
        """Stop waiting and cancel the rollout in the pipeline (its session is stopped, it ends as `Rollout Failed`
        / cancelled); a future from `invoke` cancels its one-rollout batch.

        Returns False when the rollout was already terminal. Afterwards `result()` raises `CancelledError`.
        """
        with self._lock:
            if self._inner.cancelled() or not self._inner.cancel():
                return False
            self._finished = time.monotonic()
        # Best effort, as ART's stop: the pipeline's own deadline ends the rollout anyway.
        batches, runtime = self._client._batches, self._client.runtime
        try:
            if self._owns_batch:
                batches.cancel(self.batch_id, runtime=runtime)
            else:
                batches.cancel_rollout(self.batch_id, self.input_id, self.index, runtime=runtime)
        except Exception as exc:
            logger.warning("could not cancel %s/%s#%s: %s", self.batch_id, self.input_id, self.index, exc)
        return True

    async def cancel_async(self) -> bool:
        """`cancel()` for asyncio."""
        return await asyncio.to_thread(self.cancel)

    @property
    def cancelled(self) -> bool:
        """True if the future was cancelled (as ART's property)."""
        return self._inner.cancelled()

    # ---------------------------------------------------------------------------------------------- info

    @property
    def event(self) -> RolloutCompleted | RolloutFailed | None:
        """The terminal event's detail once received (reward, timings, attempt, result URI...)."""
        return self._event

    @property
    def session_id(self) -> str | None:
        """The ACR session of the last attempt, once terminal (the pipeline derives it per attempt)."""
        return self._event.session_id if self._event is not None else None

    @property
    def reward(self) -> float | None:
        return self._event.reward if isinstance(self._event, RolloutCompleted) else None

    @property
    def result_key(self) -> str | None:
        """ART compatibility: the result object's key, once known."""
        uri = self._event.result_uri if self._event is not None else None
        return uri.split("/", 3)[3] if uri and uri.count("/") >= 3 else None

    def elapsed(self) -> float:
        """Seconds from submission to the outcome (or to now while pending)."""
        end = self._finished if self._finished is not None else time.monotonic()
        return end - self._start

    def __repr__(self) -> str:
        state = "cancelled" if self.cancelled else "done" if self.done() else "pending"
        return f"RolloutFuture({self.batch_id}/{self.input_id}#{self.index}, {state})"


class _LiveFilter(EventFilter):
    """Matches the events of the batches the dispatcher currently serves (a live set)."""

    def __init__(self, dispatcher: _Dispatcher) -> None:
        super().__init__()
        self._dispatcher = dispatcher

    def matches(self, event: Event) -> bool:
        return self._dispatcher.serves(event.batch_id)


class _Dispatcher:
    """The one background thread of a client: its events -> futures. Runs while futures are pending.

    Where events come from: by default a private subscription of the client's own (`subscription.SubscribedStream`
    over every outcome on the bus, made by `open()` before the first submission and removed by `close()`; events
    of other consumers' batches are deleted from it, an outcome it missed is read from the ledger), else
    `queue_url` (a subscription the caller made, e.g. the ART backend's), else, with `consume_others`, the trainer
    queue (this client is its one consumer)."""

    def __init__(
        self,
        experiment: ExperimentHandle,
        *,
        poll_wait_s: float,
        visibility_s: int | None,
        consume_others: bool,
        linger_s: float = DEFAULT_LINGER_S,
        queue_url: str | None = None,
    ) -> None:
        self._experiment = experiment
        self._private = queue_url is None and not consume_others
        self._queue_url = queue_url or experiment.trainer_queue_url
        self._poll_wait_s = poll_wait_s
        self._visibility_s = visibility_s
        self._consume_others = consume_others
        self._lock = threading.Lock()
        self._futures: dict[tuple[str, str, int], RolloutFuture] = {}
        self._batches: OrderedDict[str, None] = OrderedDict()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._linger_s = linger_s
        self._own: EventStream | None = None

    def open(self) -> None:
        """Make the client's own subscription, if it reads one and has none yet (before a submission, so that the
        rule exists when its events are published)."""
        if not self._private:
            return
        from rollout_pipeline.sdk.subscription import SubscribedStream, stream_pattern

        with self._lock:
            if self._own is not None or self._stop.is_set():
                return
            self._own = SubscribedStream(
                self._experiment.aws,
                self._experiment.bus_name,
                stream_pattern(None, _CLIENT_TYPES),
                self._experiment.seen,
                replay=self._missed,
                event_filter=_LiveFilter(self),
                poll_wait_s=self._poll_wait_s,
            )

    def _missed(self, skip: Callable[[str], bool]) -> Iterator[Event]:
        """The outcomes of the batches with pending futures, from the ledger (what the subscription may have
        missed: see `SubscribedStream`), read as they are handed over."""
        with self._lock:
            batches = sorted({f.batch_id for f in self._futures.values() if not f.done()})
        return Events(self._experiment).replay(batches, _CLIENT_TYPES[:2], skip=skip)

    def serves(self, batch_id: str) -> bool:
        with self._lock:
            return batch_id in self._batches

    def register(self, futures: Sequence[RolloutFuture]) -> None:
        if self._stop.is_set():
            raise SdkError("this RolloutClient is closed: make a new one")
        with self._lock:
            for future in futures:
                self._futures[(future.batch_id, future.input_id, future.index)] = future
                self._batches[future.batch_id] = None
                self._batches.move_to_end(future.batch_id)
            while len(self._batches) > _RECENT_BATCHES:
                self._batches.popitem(last=False)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="rollouts-dispatcher", daemon=True)
                self._thread.start()

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def pending(self) -> int:
        with self._lock:
            return sum(1 for f in self._futures.values() if not f.done())

    def _run(self) -> None:
        own = self._own
        stream = own or EventStream(
            QueueReader(self._experiment.aws, self._queue_url, visibility_s=self._visibility_s),
            self._experiment.seen,
            event_filter=_LiveFilter(self),
            consume_others=self._consume_others,
            poll_wait_s=self._poll_wait_s,
        )
        errors = 0
        last_event = time.monotonic()
        try:
            while not self._stop.is_set():
                with self._lock:
                    self._futures = {k: f for k, f in self._futures.items() if not f.done()}
                    # Linger after the last future: the group/batch events of our batches follow their last
                    # rollout event; consume them rather than leave them to other consumers (or the DLQ).
                    if not self._futures and time.monotonic() - last_event >= self._linger_s:
                        self._thread = None
                        return
                try:
                    delivery = stream.next_delivery(None)
                except Exception as exc:
                    errors += 1
                    logger.warning("dispatcher: %s (attempt %d of %d)", exc, errors, _MAX_DISPATCH_ERRORS)
                    if errors >= _MAX_DISPATCH_ERRORS:
                        self._fail_all(exc)
                        with self._lock:
                            self._thread = None
                        return
                    self._stop.wait(min(0.5 * 2**errors, 10.0))
                    continue
                errors = 0
                if delivery is None or delivery.event is None:
                    if self._poll_wait_s < 1:  # short polling: pause instead of spinning
                        self._stop.wait(_SHORT_POLL_PAUSE_S)
                    continue
                self._route(delivery.event)
                stream.ack(delivery)
                last_event = time.monotonic()
        finally:
            if stream is not own:  # the client's own subscription lives until `close()`
                stream.close()
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None

    def _route(self, event: Event) -> None:
        detail = event.detail
        if event.detail_type in (DetailType.ROLLOUT_COMPLETED, DetailType.ROLLOUT_FAILED):
            assert isinstance(detail, RolloutCompleted | RolloutFailed)
            with self._lock:
                future = self._futures.pop((detail.batch_id, detail.input_id, detail.index), None)
            if future is not None:
                future._resolve(detail)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            futures, self._futures = list(self._futures.values()), {}
        for future in futures:
            future._fail(exc)

    def close(self, timeout: float) -> None:
        self._stop.set()
        with self._lock:
            thread = self._thread
            own, self._own = self._own, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._fail_all(CancelledError("the rollout client was closed"))
        if own is not None:
            own.close()


class RolloutClient:
    """Invoke rollouts and get their results, ART-style, over an attached `Experiment`.

    `defaults` are `_rollout` overrides added to every payload (ART's `**extra_config`, e.g. `base_url`,
    `model_id`, `temperature`); per-call keyword arguments win. Submission options (`group_size` is always 1
    here, as in ART) come from the experiment unless given: `sampling_params`, `timeout_s`, `max_attempts`,
    `policy_version`. Events come from the client's own subscription on the event bus (made before its first
    submission, removed at `close()`), so any number of clients, `groups()` streams and `rollouts watch` run side
    by side; `queue_url`: read them from this queue instead (a subscription made with
    `exp.subscriptions.open`); `consume_others=True` (and no `queue_url`): from the trainer queue, this client
    being its one consumer (events of other batches are deleted). The dispatcher thread runs while futures are
    pending, then `linger_s` more seconds. Use the client as a context manager or call `close()` to stop it.
    """

    def __init__(
        self,
        experiment: ExperimentHandle,
        *,
        sampling_params: Mapping[str, Any] | None = None,
        timeout_s: int | None = None,
        max_attempts: int | None = None,
        policy_version: str | None = None,
        poll_wait_s: float = DEFAULT_POLL_WAIT_S,
        visibility_s: int | None = None,
        consume_others: bool = False,
        linger_s: float = DEFAULT_LINGER_S,
        runtime: AgentRuntime | None = None,
        queue_url: str | None = None,
        **defaults: Any,
    ) -> None:
        self.experiment = experiment
        self._batches = Batches(experiment)
        #: Stops sessions when a future is cancelled (default: ACR with the experiment's session).
        self.runtime = runtime
        self.exp_id = experiment.name
        self.agent_runtime_arn = experiment.runtime_arn
        self.s3_bucket = experiment.results_bucket
        self.extra_config = dict(defaults)
        #: ART's attributes: the model the agent is pointed at (per-client default, else the experiment's).
        self.base_url: str = str(defaults.get("base_url") or experiment.config.model_base_url)
        self.model_id: str = str(defaults.get("model_id") or experiment.config.model_id)
        self.region: str | None = experiment.aws.region
        self._submit_options: dict[str, Any] = {
            "sampling_params": sampling_params,
            "timeout_s": timeout_s,
            "max_attempts": max_attempts,
            "policy_version": policy_version,
        }
        self._poll_wait_s = poll_wait_s
        self._dispatcher = _Dispatcher(
            experiment,
            poll_wait_s=poll_wait_s,
            visibility_s=visibility_s,
            consume_others=consume_others,
            linger_s=linger_s,
            queue_url=queue_url,
        )

    # ------------------------------------------------------------------------------------------ invoke

    def _row(self, payload: Mapping[str, Any], input_id: str | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
        row = dict(payload)
        rollout = {**self.extra_config, **dict(row.get("_rollout") or {}), **overrides}
        if rollout:
            row["_rollout"] = rollout
        if input_id is not None:
            row["id"] = input_id
        return row

    def submit_many(
        self,
        rows: Sequence[Mapping[str, Any]],
        *,
        name: str = "run",
        owns_batch: bool = False,
        policy_version: str | None = None,
    ) -> list[RolloutFuture]:
        """Submit rows as one batch (one rollout each); return a future per row, in order.

        `policy_version` overrides the client's for this batch (an async trainer's step at submission).
        Futures are registered right after the submission returns; an outcome that arrives earlier is read
        again from the ledger (the client's own subscription) or given back and delivered again (a queue given or
        the trainer queue): nothing is lost.
        """
        from rollout_pipeline.sdk.submission import validate_payloads

        if self._dispatcher.closed:
            raise SdkError("this RolloutClient is closed: make a new one")
        parsed = validate_payloads(rows)
        options = dict(self._submit_options)
        if policy_version is not None:
            options["policy_version"] = policy_version
        file_options = self._batches.file_options(
            1, options["sampling_params"], options["timeout_s"], options["max_attempts"], options["policy_version"]
        )
        self._dispatcher.open()
        batch_id = self._batches.submit_rows(parsed, file_options, name)
        futures = [RolloutFuture(self, batch_id, row.input_id, 0, owns_batch=owns_batch) for row in parsed]
        self._dispatcher.register(futures)
        return futures

    def invoke(
        self,
        payload: Mapping[str, Any],
        session_id: str | None = None,
        input_id: str | None = None,
        **rollout_overrides: Any,
    ) -> RolloutFuture:
        """Submit one rollout (a batch of its own) and return its future.

        `session_id` is accepted for ART compatibility and ignored: the pipeline derives one per attempt.
        `input_id` defaults to the payload's `id`, else a fresh one. `rollout_overrides` go into `_rollout`.
        """
        if session_id is not None:
            logger.debug("invoke: session_id is derived by the pipeline; %r ignored", session_id)
        row_id = input_id if input_id is not None else payload.get("id") or f"inv-{uuid.uuid4().hex[:12]}"
        (future,) = self.submit_many(
            [self._row(payload, str(row_id), rollout_overrides)], name="invoke", owns_batch=True
        )
        return future

    async def invoke_async(
        self,
        payload: Mapping[str, Any],
        session_id: str | None = None,
        input_id: str | None = None,
        **rollout_overrides: Any,
    ) -> RolloutFuture:
        """`invoke()` for asyncio (the submission runs in a worker thread)."""
        return await asyncio.to_thread(lambda: self.invoke(payload, session_id, input_id, **rollout_overrides))

    # --------------------------------------------------------------------------------------- run_batch

    def run_batch(  # noqa: PLR0917 - ART's positional signature
        self,
        payloads: Sequence[Mapping[str, Any]],
        max_concurrent_sessions: int | None = None,
        timeout: float = 900.0,
        initial_interval: float = 0.5,
        max_interval: float = 30.0,
        backoff_factor: float = 1.5,
        log_interval: float = 30.0,
    ) -> BatchResult:
        """Run payloads (one rollout each) and yield a `BatchItem` per payload in completion order.

        `max_concurrent_sessions` caps this call's outstanding rollouts (submitted in waves, one batch each);
        None submits everything at once and leaves pacing to the pipeline's global limits. `timeout` is per
        payload from its submission: a late one yields `success=False, error="Timeout after ...s"`.
        `initial_interval`, `max_interval`, `backoff_factor` are accepted for ART compatibility and unused
        (nothing polls). Status is logged every `log_interval` seconds.
        """
        del initial_interval, max_interval, backoff_factor
        return BatchResult(self, payloads, max_concurrent_sessions, timeout, log_interval)

    def run_batch_async(  # noqa: PLR0917 - ART's positional signature
        self,
        payloads: Sequence[Mapping[str, Any]],
        max_concurrent_sessions: int | None = None,
        timeout: float = 900.0,
        initial_interval: float = 0.5,
        max_interval: float = 30.0,
        backoff_factor: float = 1.5,
        log_interval: float = 30.0,
    ) -> AsyncBatchResult:
        """`run_batch()` for asyncio: `async for item in client.run_batch_async(payloads): ...`."""
        del initial_interval, max_interval, backoff_factor
        return AsyncBatchResult(BatchResult(self, payloads, max_concurrent_sessions, timeout, log_interval))

    # -------------------------------------------------------------------------------------------- close

    @property
    def pending(self) -> int:
        """Futures still waiting for their event."""
        return self._dispatcher.pending()

    @property
    def closed(self) -> bool:
        """True once `close()` ran: the client takes no more submissions."""
        return self._dispatcher.closed

    def close(self) -> None:
        """Stop the dispatcher thread; futures still pending fail with `CancelledError` (rollouts go on)."""
        self._dispatcher.close(timeout=self._poll_wait_s + 10)

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _format_exception(exc: BaseException) -> str:
    if isinstance(exc, RolloutFailedError | SdkError):
        return str(exc)
    return "".join(traceback.format_exception(exc))


class BatchResult(Iterator[BatchItem]):
    """Iterator of `BatchItem`s in completion order (see `RolloutClient.run_batch`)."""

    def __init__(
        self,
        client: RolloutClient,
        payloads: Sequence[Mapping[str, Any]],
        max_concurrent: int | None,
        timeout: float,
        log_interval: float,
    ) -> None:
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError("max_concurrent_sessions must be >= 1")
        self.client = client
        self.payloads = list(payloads)
        self.max_concurrent = max_concurrent
        self.timeout = timeout
        self.log_interval = log_interval
        self._pending: deque[tuple[int, Mapping[str, Any]]] = deque(enumerate(self.payloads))
        self._active: dict[concurrent.futures.Future[RolloutCompleted], tuple[int, RolloutFuture]] = {}
        self._ready: deque[BatchItem] = deque()
        self._last_log = time.monotonic()

    def __iter__(self) -> BatchResult:
        return self

    def __next__(self) -> BatchItem:
        while not self._ready:
            if not self._pending and not self._active:
                raise StopIteration
            self._fill()
            if self._ready:
                break
            self._wait()
        return self._ready.popleft()

    def _fill(self) -> None:
        room = len(self._pending) if self.max_concurrent is None else self.max_concurrent - len(self._active)
        wave = [self._pending.popleft() for _ in range(min(room, len(self._pending)))]
        if not wave:
            return
        rows = []
        for index, payload in wave:
            row = self.client._row(payload, None, {})
            row.setdefault("id", f"p{index}")
            rows.append(row)
        try:
            futures = self.client.submit_many(rows, name="run-batch")
        except Exception as exc:
            for index, _payload in wave:
                self._ready.append(BatchItem(success=False, error=_format_exception(exc), index=index, elapsed=0.0))
            return
        for (index, _payload), future in zip(wave, futures, strict=True):
            self._active[future._inner] = (index, future)

    def _wait(self) -> None:
        if not self._active:
            return
        now = time.monotonic()
        nearest = min(self.timeout - f.elapsed() for _i, f in self._active.values())
        wait_s = max(0.0, min(nearest, self.log_interval - (now - self._last_log)))
        done, _ = concurrent.futures.wait(list(self._active), timeout=wait_s, return_when="FIRST_COMPLETED")
        for inner in done:
            index, future = self._active.pop(inner)
            self._ready.append(_item(index, future))
        for inner, (index, future) in list(self._active.items()):
            if future.elapsed() >= self.timeout:
                del self._active[inner]
                future.cancel()
                self._ready.append(
                    BatchItem(
                        success=False, error=f"Timeout after {self.timeout}s", index=index, elapsed=future.elapsed()
                    )
                )
        if time.monotonic() - self._last_log >= self.log_interval:
            self._last_log = time.monotonic()
            if self._active:
                logger.info("[Status] %d active, %d pending", len(self._active), len(self._pending))


def _item(index: int, future: RolloutFuture) -> BatchItem:
    try:
        result = future.result(timeout=0)
    except RolloutFailedError as exc:
        event = exc.event if isinstance(exc.event, RolloutFailed) else None
        return BatchItem(success=False, error=str(exc), index=index, elapsed=future.elapsed(), event=event)
    except Exception as exc:
        return BatchItem(success=False, error=_format_exception(exc), index=index, elapsed=future.elapsed())
    return BatchItem(success=True, result=result, index=index, elapsed=future.elapsed(), event=future.event)


_END: Final = object()


class AsyncBatchResult(AsyncIterator[BatchItem]):
    """Async view of a `BatchResult` (each step runs in a worker thread)."""

    def __init__(self, batch: BatchResult) -> None:
        self._batch = batch

    def __aiter__(self) -> AsyncBatchResult:
        return self

    async def __anext__(self) -> BatchItem:
        item = await asyncio.to_thread(lambda: next(self._batch, _END))
        if item is _END:
            raise StopAsyncIteration
        assert isinstance(item, BatchItem)
        return item
