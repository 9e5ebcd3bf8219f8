"""The one boto3 client factory: Lambdas (through `wiring.Wiring`), the SDK and local mode all make clients here.

A `ClientFactory` holds one boto3 session, a region and (local mode) an endpoint URL, and creates each service's
client on first use, then reuses it (boto3 clients are thread-safe). Its sessions share the process's one botocore
data loader (`new_session`): each service model is parsed once per process. Nothing imports boto3 until a client is
needed: `lazy(service)` hands out a stand-in that creates the real client on its first attribute access, so a
Lambda wires every port at start and pays `import boto3` (~180 ms) and each client only when a call needs it.

The agent runtime's client (`acr()`) is special: explicit connect/read timeouts and no botocore retries
(`adapters/acr.py` says why).

`client(service)` and `reset()` use the process's default factory (`AWS_ENDPOINT_URL` and the usual boto3 chain):
tests and benchmarks reach moto through it.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Final
from urllib.parse import urlparse

#: Every client but the agent runtime's: standard retries.
RETRIES: Final = {"mode": "standard", "max_attempts": 5}
#: Pooled connections of every client (the agent runtime's too): enough for a dispatcher's threads and for the calls
#: a warm-pool tick has in flight at once (`lifecycle.warm_pool.CALLS_IN_FLIGHT` is this many: beyond it, calls
#: would wait for a connection, or open and drop one each).
MAX_POOL_CONNECTIONS: Final = 100
#: Region of local mode when nothing else names one (moto accepts any).
LOCAL_REGION: Final = "us-east-1"
#: The service name of Amazon Bedrock AgentCore Runtime's data plane (InvokeAgentRuntime, StopRuntimeSession).
ACR_SERVICE: Final = "bedrock-agentcore"


def is_loopback(url: str) -> bool:
    """True for an endpoint on this machine (local mode), e.g. `http://127.0.0.1:4566`."""
    host = (urlparse(url).hostname or "").lower()
    return host == "localhost" or host.startswith("127.") or host == "::1"


class ClientFactory:
    """Lazily created boto3 clients sharing one session, region and (local mode) endpoint URL. Thread-safe.

    `session`, `region` and `endpoint_url` default to boto3's own resolution (`AWS_ENDPOINT_URL`, `AWS_REGION`,
    profiles, instance roles). `user_agent_extra` tags every request (the SDK's say `rollout-pipeline-sdk`).
    """

    def __init__(
        self,
        *,
        session: Any | None = None,
        region: str | None = None,
        endpoint_url: str | None = None,
        user_agent_extra: str | None = None,
        max_pool_connections: int = MAX_POOL_CONNECTIONS,
    ) -> None:
        self._given_session = self._session = session
        self._region = region
        self.endpoint_url = endpoint_url
        self.user_agent_extra = user_agent_extra
        self.max_pool_connections = max_pool_connections
        self._clients: dict[str, Any] = {}
        self._hooks: list[tuple[str, Any]] = []
        self._lock = threading.RLock()

    @property
    def session(self) -> Any:
        with self._lock:
            if self._session is None:
                self._session = new_session(self._region)
                for event_name, handler in self._hooks:
                    self._session.events.register(event_name, handler)
            return self._session

    @property
    def region(self) -> str | None:
        """The region given, else boto3's (`AWS_DEFAULT_REGION`, profile), else `AWS_REGION`, else (an explicit
        local endpoint only) `us-east-1`."""
        if self._region:
            return self._region
        found = self.session.region_name or os.environ.get("AWS_REGION")
        if not found and self.endpoint_url:
            found = LOCAL_REGION
        return str(found) if found else None

    def client(self, service: str) -> Any:
        """The cached client of `service` (created on the first call)."""
        with self._lock:
            cached = self._clients.get(service)
            if cached is None:
                cached = self._clients[service] = self._create(service)
            return cached

    def lazy(self, service: str) -> Any:
        """A stand-in for `client(service)` that creates the real client on its first attribute access."""
        return LazyClient(self, service)

    def acr(self) -> Any:
        """The agent runtime's client: explicit timeouts and no botocore retries (see `adapters/acr.py`)."""
        return self.client(ACR_SERVICE)

    def _create(self, service: str) -> Any:
        from botocore.config import Config

        if service == ACR_SERVICE:
            from rollout_pipeline.adapters.acr import client_config

            config = client_config(self.max_pool_connections)
        else:
            config = Config(retries=dict(RETRIES), max_pool_connections=self.max_pool_connections)
        if self.user_agent_extra:
            config = config.merge(Config(user_agent_extra=self.user_agent_extra))
        kwargs: dict[str, Any] = {"config": config}
        region = self.region
        if region:
            kwargs["region_name"] = region
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
            if is_loopback(self.endpoint_url) and self.session.get_credentials() is None:
                # Local mode's moto server accepts any credentials; a machine without AWS needs none.
                kwargs["aws_access_key_id"] = kwargs["aws_secret_access_key"] = "local"
        made = self.session.client(service, **kwargs)
        made.exceptions  # noqa: B018 - loaded now, under the lock: botocore loads them lazily without one, and two
        # threads' first errors could each load a set of classes, one's `except` then missing the other's raise
        return made

    def register_hook(self, event_name: str, handler: Any) -> None:
        """Register a botocore event handler (e.g. "before-call") on every client made so far and later.

        Clients copy the session's event hooks when they are created, so both are needed; a session made after a
        `reset` gets them again.
        """
        with self._lock:
            session = self.session  # a session made now registers the hooks so far: this one is not among them yet
            self._hooks.append((event_name, handler))
            session.events.register(event_name, handler)
            for cached in self._clients.values():
                cached.meta.events.register(event_name, handler)

    def reset(self) -> None:
        """Forget every client and the session (the environment changed: credentials, endpoint)."""
        with self._lock:
            self._clients.clear()
            self._session = self._given_session


_loader_lock = threading.Lock()


@functools.cache
def _data_loader(data_path: str | None) -> Any:
    import botocore.loaders

    return botocore.loaders.create_loader(data_path)


def new_session(region: str | None = None) -> Any:
    """A boto3 session on the process's one botocore data loader (per `AWS_DATA_PATH`): a session of its own
    (credentials, region, hooks), but each service model and endpoint file is read and parsed once per process, not
    once per session (about 40 ms a session and client; tests, the SDK and local mode make hundreds of sessions)."""
    import boto3
    import botocore.session

    core = botocore.session.get_session()
    loader = _data_loader(core.get_config_variable("data_path"))
    core.register_component("data_loader", loader)
    session = boto3.session.Session(botocore_session=core, region_name=region)
    with _loader_lock:  # boto3 appends its own data folder to its session's loader: once is enough
        loader.search_paths[:] = list(dict.fromkeys(loader.search_paths))
    return session


class LazyClient:
    """Stands in for a boto3 client of `factory` and creates it on the first attribute access."""

    __slots__ = ("_factory", "_service")

    def __init__(self, factory: ClientFactory, service: str) -> None:
        self._factory = factory
        self._service = service

    def __getattr__(self, name: str) -> Any:
        return getattr(self._factory.client(self._service), name)

    def __repr__(self) -> str:
        return f"LazyClient({self._service!r})"


class EnvironmentFactory(ClientFactory):
    """The process's default factory: boto3's configuration from the environment. When `AWS_ENDPOINT_URL` changes
    (a local pipeline points it at its moto server, and back), clients made for the old endpoint are dropped
    instead of being reused against it."""

    #: The variables that decide where a client goes.
    WATCHED: Final = ("AWS_ENDPOINT_URL",)

    def __init__(self) -> None:
        super().__init__()
        self._seen: tuple[str | None, ...] | None = None

    def client(self, service: str) -> Any:
        current = tuple(os.environ.get(name) for name in self.WATCHED)
        with self._lock:
            if current != self._seen:
                self.reset()
                self._seen = current
            return super().client(service)


_default: ClientFactory = EnvironmentFactory()


def default_factory() -> ClientFactory:
    """The process's default factory (boto3's own configuration: `AWS_ENDPOINT_URL`, `AWS_REGION`, ...)."""
    return _default


def client(service: str) -> Any:
    """The default factory's client of `service` (tests, benchmarks and ledger code given no client)."""
    return _default.client(service)


def register_hook(event_name: str, handler: Any) -> None:
    """`ClientFactory.register_hook` on the default factory."""
    _default.register_hook(event_name, handler)


def reset() -> None:
    """Forget the default factory's clients and session (tests switch credentials and endpoints)."""
    _default.reset()
