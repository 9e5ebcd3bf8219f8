"""The author's agent module, as the agent host sees it: imported with its server deferred, its app found, its kind
told from its source.

An agent module is written the way its toolkit shows: ART's `AgentCoreRLApp` (or this library's `RolloutApp`) with
`@app.rollout_entrypoint`, or a `BedrockAgentCoreApp` with `@app.entrypoint` (SageMaker RFT agents, ART's
`AgentCoreRuntimeApp`), and usually ending in

    if __name__ == "__main__":
        app.run()

`app.run()` (bedrock-agentcore's `BedrockAgentCoreApp.run`) is `uvicorn.run(app, host=..., port=8080)` with the host
127.0.0.1 unless it sees Docker: it ignores any `--host/--port` it is given, so two such processes on one machine
fight for port 8080. The host never runs the module as `__main__` (`import_module` by name: the guarded block does
not run), and while it imports the module `BedrockAgentCoreApp.run` and `uvicorn.run` only note that the module asked
to serve (`servers_deferred`), so a bare module-level `app.run()` does not start a server either. The host then
serves the app it found on the host and port it was given.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.machinery
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from rollout_pipeline.config import AgentKind

logger = logging.getLogger(__name__)

#: The SageMaker RFT SDK's decorator lives here; a handler whose code comes from it is an RFT entrypoint.
RFT_SDK_MODULE: Final = "sagemaker.train.rft"


class AgentModuleError(LookupError):
    """The agent module cannot be served: it is not found, or it defines no app (or several) to serve."""


@dataclass(frozen=True)
class Entrypoint:
    """What the author's module registered: its app, the entry function and whether the RFT decorator wraps it."""

    module: str
    app_name: str
    app: Any
    handler: Callable[..., Any]
    is_rft: bool
    is_art_rollout_app: bool


def _is_agentcore_app(value: Any) -> bool:
    handlers = getattr(value, "handlers", None)
    return isinstance(handlers, dict) and callable(getattr(value, "run", None))


def _is_art_rollout_app(app: Any) -> bool:
    try:
        from agentcore_rl_toolkit.app import AgentCoreRLApp
    except ImportError:  # pragma: no cover - the agent extra is installed wherever the host runs
        return False
    return isinstance(app, AgentCoreRLApp)


def is_rft_handler(handler: Callable[..., Any]) -> bool:
    """True when `handler` is the SDK's `sagemaker_rft_handler` wrapper (its code lives in the SDK's module)."""
    code = getattr(handler, "__code__", None)
    filename = str(getattr(code, "co_filename", ""))
    return filename.replace(os.sep, "/").endswith("sagemaker/train/rft/decorators.py")


@contextlib.contextmanager
def servers_deferred(module: str, argv: Sequence[str] = ()) -> Iterator[list[Any]]:
    """While the author's module is imported: `BedrockAgentCoreApp.run` (what `app.run()` calls on ART's
    `AgentCoreRLApp`, `AgentCoreRuntimeApp`, `RolloutApp` and any other subclass that does not override it) and
    `uvicorn.run` start nothing and only note the app that asked to be served (yielded, in order); `sys.argv` is what
    `python -m MODULE ARGV...` would give (a module that parses `--host/--port` at import sees them). Everything is
    restored on exit."""
    import uvicorn
    from bedrock_agentcore.runtime import BedrockAgentCoreApp

    asked: list[Any] = []

    def deferred_run(self: Any, *args: Any, **kwargs: Any) -> None:
        del args, kwargs
        logger.info("%s called app.run() while being imported: the agent host serves the app instead", module)
        asked.append(self)

    def deferred_uvicorn(app: Any, *args: Any, **kwargs: Any) -> None:
        del args, kwargs
        logger.info("%s called uvicorn.run() while being imported: the agent host serves the app instead", module)
        asked.append(app)

    saved_run = BedrockAgentCoreApp.__dict__["run"]
    saved_uvicorn = uvicorn.run
    saved_argv = sys.argv
    BedrockAgentCoreApp.run = deferred_run  # type: ignore[method-assign]
    uvicorn.run = deferred_uvicorn
    sys.argv = [module, *argv]
    try:
        yield asked
    finally:
        BedrockAgentCoreApp.run = saved_run  # type: ignore[method-assign]
        uvicorn.run = saved_uvicorn
        sys.argv = saved_argv


def import_agent_module(module_name: str, argv: Sequence[str] = ()) -> tuple[ModuleType, list[Any]]:
    """Import the author's module by name (never as `__main__`) with servers deferred; returns it and the apps it
    asked to serve while it was imported. `AgentModuleError` when the module itself is not found (an import error
    inside it propagates as it is: its traceback is the author's to read)."""
    with servers_deferred(module_name, argv) as asked:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                path = os.environ.get("PYTHONPATH") or "not set"
                raise AgentModuleError(f"no module named {module_name!r} on the agent's PYTHONPATH ({path})") from None
            raise
    return module, asked


def load_entrypoint(spec: str, argv: Sequence[str] = ()) -> Entrypoint:
    """Import `module` (or `module:app`) as `import_agent_module` does and return the entrypoint its
    `BedrockAgentCoreApp` registered (`handlers["main"]`: ART's `rollout_entrypoint` and `@app.entrypoint` alike).

    Without `:app`, the module's one app with an entrypoint is taken; when it defines several, the one it asked to
    serve (`app.run()`) if that is one of them, else `AgentModuleError` asks for `MODULE:APP`."""
    module_name, _, app_name = spec.partition(":")
    module, asked = import_agent_module(module_name, argv)
    if app_name:
        if not hasattr(module, app_name):
            raise AgentModuleError(f"{module_name} has no attribute {app_name!r}")
        apps = {app_name: getattr(module, app_name)}
    else:
        apps = {}
        for name, value in vars(module).items():
            if _is_agentcore_app(value) and all(value is not seen for seen in apps.values()):
                apps[name] = value
    apps = {name: app for name, app in apps.items() if _is_agentcore_app(app) and "main" in app.handlers}
    if len(apps) > 1:
        served = {name: app for name, app in apps.items() if any(app is wanted for wanted in asked)}
        apps = served if len(served) == 1 else apps
    if not apps:
        raise AgentModuleError(f"{module_name} defines no BedrockAgentCoreApp with an @app.entrypoint")
    if len(apps) > 1:
        raise AgentModuleError(
            f"{module_name} defines several apps ({', '.join(sorted(apps))}): name one as MODULE:APP"
        )
    name, app = next(iter(apps.items()))
    handler = app.handlers["main"]
    return Entrypoint(
        module=module_name,
        app_name=name,
        app=app,
        handler=handler,
        is_rft=is_rft_handler(handler),
        is_art_rollout_app=_is_art_rollout_app(app),
    )


def _module_source(module: str, search_path: Sequence[str]) -> Path | None:
    """The source file of `module`, found on `search_path` without importing anything."""
    locations: list[str] | None = list(search_path)
    spec = None
    for part in module.split("."):
        spec = importlib.machinery.PathFinder.find_spec(part, locations)
        if spec is None:
            return None
        locations = list(spec.submodule_search_locations or [])
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _parsed_source(module: str, search_path: Sequence[str] | None) -> ast.Module | None:
    """The syntax tree of `module`'s source (`package.module`, or `module:attribute`), read without importing it;
    None when it cannot be found, read or parsed."""
    source = _module_source(module.partition(":")[0], search_path if search_path is not None else sys.path)
    if source is None:
        return None
    try:
        return ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


def top_level_imports(module: str, search_path: Sequence[str] | None = None) -> list[str]:
    """The modules `module`'s source imports in its own body (absolute imports, in order, without duplicates; read,
    not imported): what importing it will import first. Empty when its source cannot be read."""
    tree = _parsed_source(module, search_path)
    names: list[str] = []
    for node in tree.body if tree is not None else []:
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return list(dict.fromkeys(names))


def agent_kind_of(module: str, search_path: Sequence[str] | None = None) -> AgentKind:
    """`rft` when the module's source (read, not imported) uses the SageMaker RFT SDK, ART's `AgentCoreRuntimeApp`
    or a plain `@app.entrypoint` and no ART `rollout_entrypoint`; else `art`."""
    tree = _parsed_source(module, search_path)
    if tree is None:
        return "art"
    imported: set[str] = set()
    attributes: set[str] = set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Attribute):
            attributes.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
    if "rollout_entrypoint" in attributes:
        return "art"
    uses_rft = any(name == RFT_SDK_MODULE or name.startswith(RFT_SDK_MODULE + ".") for name in imported)
    if uses_rft or "AgentCoreRuntimeApp" in names or "entrypoint" in attributes:
        return "rft"
    return "art"
