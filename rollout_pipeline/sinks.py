"""HTTP sinks: the `sinks` setting compiled once, for the stack (EventBridge API destinations) and for local mode's
consumer, so both deliver the same request for the same event.

A sink takes some detail types of the experiment's bus and POSTs (or PUTs, PATCHes) each event to `url`, whose
`{$.path}` segments are path parameters read from the event (EventBridge's `PathParameterValues`: the endpoint
has a `*` in their place). The body is a JSON template: a string that is a path (`"$.detail.reward"`) is replaced
by the event's value there (any JSON value; a path the event lacks gives null), everything else is literal; a
template that is one path (`"$.detail"`, the default) sends that part of the event as it is. Deployed, a template
with paths becomes an input transformer (`InputPathsMap` + an `InputTemplate` with an unquoted `<name>` per
path), a bare path an `InputPath`. `bodies` gives a detail type a body of its own (one rule per detail type).

What a sink never delivers: a surplus rollout of an oversampled group (`surplus` is true on its rollout events),
and, with `drop_zero_variance`, a `Group Completed` flagged `zero_variance`. Those filters are in each rule's
event pattern.

Retries are EventBridge's for API destinations: a time-out (5 s), 401, 407, 409, 429 and 5xx are retried with
exponential back-off until `max_retry_attempts` or `max_event_age_s`, any other answer is final; what is not
delivered goes to the sink's dead-letter queue (docs/trainers.md, "HTTP sinks", has the sources).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from rollout_pipeline.config import ConfigError, ExperimentConfig, SinkSettings
from rollout_pipeline.contracts import EVENT_SOURCE, DetailType

#: A JSONPath of the subset EventBridge evaluates and this module reads: `$`, `.name` steps and `[n]` indices.
PATH: Final = re.compile(r"^\$(?:\.[A-Za-z0-9_-]+|\[\d+\])*$")
_STEP: Final = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]")
#: A path parameter in a sink's URL: `{$.detail.input_id}`.
URL_PARAMETER: Final = re.compile(r"\{(\$[^}]*)\}")
#: EventBridge's limit on the variables of one input transformer.
MAX_PATHS: Final = 100
#: An API destination's request times out after this long (EventBridge's own limit).
REQUEST_TIMEOUT_S: Final = 5.0
#: Answers EventBridge retries (besides time-outs and every 5xx).
RETRIED_STATUS: Final = frozenset({401, 407, 409, 429})
#: Rollout events: a sink never delivers a surplus rollout's.
_ROLLOUT_EVENTS: Final = frozenset({DetailType.ROLLOUT_COMPLETED.value, DetailType.ROLLOUT_FAILED.value})


def retried(status: int | None) -> bool:
    """Whether EventBridge retries an answer (`None`: no answer, a time-out or a refused connection)."""
    return status is None or status >= 500 or status in RETRIED_STATUS


@dataclass(frozen=True)
class CompiledBody:
    """A body template as EventBridge takes it: `input_path` (a bare path), or `paths` + `template` (an input
    transformer), or neither (a literal: `template` is the body)."""

    template: Any
    input_path: str | None = None
    paths: tuple[tuple[str, str], ...] = ()
    input_template: str = ""

    def render(self, event: Mapping[str, Any]) -> bytes:
        """The request body for `event`, as EventBridge builds it."""
        return json.dumps(fill(self.template, event), separators=(",", ":")).encode()


@dataclass(frozen=True)
class SinkRoute:
    """One rule of a sink: the events of one detail type, and the body each becomes."""

    detail_type: str
    pattern: dict[str, Any]
    body: CompiledBody


@dataclass(frozen=True)
class CompiledSink:
    """A sink ready to deploy or to run locally."""

    settings: SinkSettings
    #: `url` with `*` for each path parameter (an API destination's `InvocationEndpoint`).
    endpoint: str
    #: The JSONPath of each `*`, in order (`PathParameterValues`).
    path_parameters: tuple[str, ...]
    routes: tuple[SinkRoute, ...]

    @property
    def name(self) -> str:
        return self.settings.name

    def route(self, detail_type: str) -> SinkRoute | None:
        return next((route for route in self.routes if route.detail_type == detail_type), None)

    def url_for(self, event: Mapping[str, Any]) -> str:
        """The URL `event` is sent to (each path parameter's value, percent-encoded as one path segment)."""
        from urllib.parse import quote

        values = iter(self.path_parameters)
        return re.sub(r"\*", lambda _m: quote(_text(lookup(event, next(values))), safe=""), self.endpoint)


def lookup(document: Any, path: str) -> Any:
    """The value at `path` (the `PATH` subset) in `document`, or None when it has none."""
    value = document
    for name, index in _STEP.findall(path[1:]):
        if name:
            value = value.get(name) if isinstance(value, Mapping) else None
        else:
            position = int(index)
            value = value[position] if isinstance(value, list) and position < len(value) else None
        if value is None:
            return None
    return value


def fill(template: Any, event: Mapping[str, Any]) -> Any:
    """`template` with every path string replaced by the event's value there."""
    if isinstance(template, str) and PATH.match(template):
        return lookup(event, template)
    if isinstance(template, Mapping):
        return {key: fill(value, event) for key, value in template.items()}
    if isinstance(template, list):
        return [fill(value, event) for value in template]
    return template


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _paths_in(template: Any, found: list[str]) -> None:
    if isinstance(template, str) and template.startswith("$"):
        if not PATH.match(template):
            raise ValueError(f"{template!r} is not a path EventBridge reads ($, .name steps, [n] indices)")
        if template not in found:
            found.append(template)
    elif isinstance(template, Mapping):
        for key, value in template.items():
            if not isinstance(key, str):
                raise ValueError(f"object keys must be strings (got {key!r})")
            _paths_in(value, found)
    elif isinstance(template, list):
        for value in template:
            _paths_in(value, found)


def compile_body(template: Any) -> CompiledBody:
    """A body template compiled (see the module doc); ValueError naming what is wrong."""
    paths: list[str] = []
    _paths_in(template, paths)
    if isinstance(template, str) and PATH.match(template):
        return CompiledBody(template=template, input_path=template)
    if not paths:
        return CompiledBody(template=template, input_template=json.dumps(template, separators=(",", ":")))
    if len(paths) > MAX_PATHS:
        raise ValueError(f"{len(paths)} paths: an input transformer takes at most {MAX_PATHS}")
    names = {path: f"v{i}" for i, path in enumerate(paths)}
    marks = {path: f"\u0000{names[path]}\u0000" for path in paths}

    def marked(value: Any) -> Any:
        if isinstance(value, str) and value in marks:
            return marks[value]
        if isinstance(value, Mapping):
            return {key: marked(item) for key, item in value.items()}
        if isinstance(value, list):
            return [marked(item) for item in value]
        return value

    text = json.dumps(marked(template), separators=(",", ":"))
    for path, name in names.items():
        text = text.replace(json.dumps(marks[path]), f"<{name}>")
    return CompiledBody(
        template=template,
        paths=tuple((names[path], path) for path in paths),
        input_template=text,
    )


def event_pattern(detail_type: str, *, drop_zero_variance: bool, batch_prefix: str | None = None) -> dict[str, Any]:
    """The rule pattern of one route: the pipeline's events of `detail_type`, never a surplus rollout's, and no
    zero-variance group when `drop_zero_variance`."""
    detail: dict[str, Any] = {}
    if detail_type in _ROLLOUT_EVENTS:
        detail["surplus"] = [False]
    if detail_type == DetailType.GROUP_COMPLETED.value and drop_zero_variance:
        detail["zero_variance"] = [False]
    if batch_prefix:
        detail["batch_id"] = [{"prefix": batch_prefix}]
    pattern: dict[str, Any] = {"source": [EVENT_SOURCE], "detail-type": [detail_type]}
    if detail:
        pattern["detail"] = detail
    return pattern


def _endpoint(url: str) -> tuple[str, tuple[str, ...]]:
    parameters = tuple(URL_PARAMETER.findall(url))
    for path in parameters:
        if not PATH.match(path):
            raise ValueError(f"url path parameter {{{path}}} is not a path EventBridge reads")
    endpoint = URL_PARAMETER.sub("*", url)
    if "*" in URL_PARAMETER.sub("", url):
        raise ValueError("url may hold `*` only as a {$.path} parameter")
    return endpoint, parameters


def compile_sink(sink: SinkSettings, *, drop_zero_variance: bool = False, where: str = "sinks") -> CompiledSink:
    """One sink compiled; `ConfigError` naming the sink and what is wrong."""
    known = [t.value for t in DetailType]
    try:
        unknown = [t for t in (*sink.events, *sink.bodies) if t not in known]
        if unknown:
            raise ValueError(f"unknown detail type(s) {', '.join(map(repr, unknown))} (known: {', '.join(known)})")
        extra = sorted(set(sink.bodies) - set(sink.events))
        if extra:
            raise ValueError(f"bodies for detail types the sink does not take: {', '.join(extra)}")
        if not sink.url.startswith(("https://", "http://")):
            raise ValueError("url must start with https:// (http:// only reaches a local consumer)")
        endpoint, parameters = _endpoint(sink.url)
        routes = tuple(
            SinkRoute(
                detail_type=detail_type,
                pattern=event_pattern(
                    detail_type, drop_zero_variance=drop_zero_variance, batch_prefix=sink.batch_prefix
                ),
                body=compile_body(sink.bodies.get(detail_type, sink.body)),
            )
            for detail_type in dict.fromkeys(sink.events)
        )
    except ValueError as exc:
        raise ConfigError(f"{where} {sink.name}: {exc}") from None
    return CompiledSink(settings=sink, endpoint=endpoint, path_parameters=parameters, routes=routes)


def compile_sinks(config: ExperimentConfig) -> list[CompiledSink]:
    """Every sink of the experiment, compiled (`ConfigError` at the first bad one)."""
    return [compile_sink(sink, drop_zero_variance=config.drop_zero_variance) for sink in config.sinks]


def deploy_problems(sinks: Sequence[CompiledSink]) -> list[str]:
    """What a deployed stack refuses of the sinks: an API destination calls HTTPS endpoints only."""
    return [
        f"sinks {sink.name}: url {sink.settings.url!r} is not https:// (API destinations call HTTPS endpoints only; "
        "http:// works in local mode)"
        for sink in sinks
        if not sink.settings.url.startswith("https://")
    ]
