"""Agent processes forked from one warm parent (`local.forks`): the parent imports the agent's libraries once and
each session's process is forked from it; nothing it forked outlives a killed owner; a parent whose imports start a
thread does not fork (the runtime starts processes afresh); a parent that dies is replaced."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_pipeline.config import warmup_payload
from rollout_pipeline.local import forks
from rollout_pipeline.local.acr import DEFAULT_AGENT_MODULE, LocalAgentRuntime
from tests.conftest import alive, proc_stat, wait_for

pytestmark = [
    pytest.mark.timing,
    pytest.mark.skipif(not forks.supported(), reason="agent processes are forked on Linux only"),
]

ROOT = Path(__file__).resolve().parents[3]
#: A bound, not a timing: a killed owner's parent ends within `lifeline.CHECK_S`, its children as much later.
GONE_BOUND_S = 30
SESSION = "forked-session-0123456789abcdef0123456789"

#: An agent written the ART way that answers at once (no model); when imported, it writes the CPU its process
#: reports (`cpu_s` of its usage) to `$USAGE_DIR/PID`.
QUICK_AGENT = textwrap.dedent(
    """
    {imports}
    import os
    from pathlib import Path
    from rollout_pipeline.agent.app import RolloutApp
    from rollout_pipeline.agent.usage import current_usage

    if os.environ.get("USAGE_DIR"):
        Path(os.environ["USAGE_DIR"], str(os.getpid())).write_text(str(current_usage()["cpu_s"]))

    app = RolloutApp()


    @app.rollout_entrypoint
    def rollout(payload):
        return {{"rewards": 1.0}}
    """
)

#: Starts a runtime with two warm processes and a log directory of its own; prints its parent, its processes and
#: the log directory; waits to be killed.
OWNER = textwrap.dedent(
    """
    import time
    from rollout_pipeline.local.acr import LocalAgentRuntime

    runtime = LocalAgentRuntime("quick_agent", warm_processes=2, max_sessions=2).start()
    print(runtime.parent_pid, *(p.pid for p in runtime._spares), runtime.log_dir, flush=True)
    time.sleep(3600)
    """
)


def parent_of(pid: int) -> int:
    return int(proc_stat(pid)[1])


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    """Module `quick_agent`, and `threaded_agent` whose installed library (`threadlib`, in a `site-packages`
    folder) starts a thread when imported."""
    folder = tmp_path / "agents"
    library = tmp_path / "site-packages" / "threadlib"
    library.mkdir(parents=True)
    folder.mkdir()
    (library / "__init__.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), name='threadlib-poller', "
        "daemon=True).start()\n"
    )
    (folder / "quick_agent.py").write_text(QUICK_AGENT.format(imports="import json"))
    (folder / "threaded_agent.py").write_text(QUICK_AGENT.format(imports="import threadlib"))
    return folder


@pytest.fixture
def env(agents: Path, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "usage").mkdir()
    return {
        "PYTHONPATH": os.pathsep.join([str(agents), str(agents.parent / "site-packages")]),
        "USAGE_DIR": str(tmp_path / "usage"),
    }


@pytest.fixture
def runtime(env: dict[str, str], tmp_path: Path) -> Iterator[LocalAgentRuntime]:
    with LocalAgentRuntime("quick_agent", env=env, warm_processes=1, max_sessions=2, log_dir=tmp_path / "logs") as rt:
        yield rt


def test_the_parent_imports_the_libraries_the_agent_imports_never_the_agent_or_its_folders_modules(
    agents: Path,
) -> None:
    names = forks.imports_for(DEFAULT_AGENT_MODULE)
    assert {"strands", "rollout_pipeline.agent.strands_model", "uvicorn"} <= set(names)
    assert DEFAULT_AGENT_MODULE not in names
    assert "rollout_pipeline.agent.host" not in names, "each process runs the host as __main__"
    (agents / "helpers.py").write_text("OPENED = open(__file__)\n")
    (agents / "mine.py").write_text("import json\nimport helpers\nimport strands\n")
    sys.path.insert(0, str(agents))
    try:
        mine = forks.imports_for("mine")
    finally:
        sys.path.remove(str(agents))
    assert "strands" in mine
    assert "helpers" not in mine, "a module of the agent's own folder is imported by each process, not the parent"


def cpu_s(pid: int) -> float:
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_each_sessions_process_is_forked_from_the_runtimes_one_parent_and_counts_its_start_up(
    runtime: LocalAgentRuntime, tmp_path: Path
) -> None:
    assert runtime.forked
    runtime.invoke(SESSION, warmup_payload("exp", SESSION))
    process = runtime.process_of(SESSION)
    assert process is not None
    assert process.pid is not None
    parent = runtime.parent_pid
    assert parent is not None
    assert parent_of(process.pid) == parent
    # Its CPU counts the start-up its parent did for it (as a process started afresh would have spent it): at least
    # the parent's CPU now, less what forking and reaping two children cost the parent since (a few ms each).
    reported = float((tmp_path / "usage" / str(process.pid)).read_text())
    assert reported >= cpu_s(parent) - 0.1 > 0.1
    runtime.stop(SESSION)
    assert process.exit_code() == -signal.SIGKILL, "a stopped session's process is killed, its end reported"


def test_a_parent_that_died_is_replaced_and_sessions_go_on(runtime: LocalAgentRuntime) -> None:
    first = runtime.parent_pid
    assert first is not None
    os.killpg(first, signal.SIGKILL)
    wait_for(lambda: runtime.parent_pid is None, timeout_s=GONE_BOUND_S, what="the runtime to see its parent end")
    runtime.invoke(SESSION, warmup_payload("exp", SESSION))
    second = runtime.parent_pid
    assert second is not None
    assert second != first
    assert alive(second)
    process = runtime.process_of(SESSION)
    assert process is not None
    assert process.ping() is not None


def test_a_parent_whose_imports_start_a_thread_does_not_fork(
    env: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rollout_pipeline.local.acr")
    with LocalAgentRuntime("threaded_agent", env=env, warm_processes=1, log_dir=tmp_path / "logs") as runtime:
        runtime.invoke(SESSION, warmup_payload("exp", SESSION))
        process = runtime.process_of(SESSION)
        assert process is not None
        assert process.pid is not None
        assert not runtime.forked
        assert parent_of(process.pid) == os.getpid(), "started afresh"
    assert "started threads: threadlib-poller" in caplog.text


def test_a_killed_owner_ends_the_parent_then_every_forked_process_and_the_logs_go(
    env: dict[str, str], tmp_path: Path
) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    owner_env = {**os.environ, "TMPDIR": str(temporary), "PYTHONPATH": f"{ROOT}{os.pathsep}{env['PYTHONPATH']}"}
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=owner_env)
    assert owner.stdout is not None
    *pids, logs = owner.stdout.readline().split()
    parent, *processes = (int(pid) for pid in pids)
    try:
        assert len(processes) == 2
        assert all(parent_of(pid) == parent for pid in processes)
        assert Path(logs).is_dir()
        owner.send_signal(signal.SIGKILL)
        assert owner.wait(10) == -signal.SIGKILL
        wait_for(lambda: not alive(parent), timeout_s=GONE_BOUND_S, what="the parent to end")
        wait_for(lambda: not any(map(alive, processes)), timeout_s=GONE_BOUND_S, what="its processes to end")
        wait_for(lambda: not Path(logs).exists(), timeout_s=GONE_BOUND_S, what="the log directory to go")
    finally:
        if owner.poll() is None:
            owner.kill()
        for pid in (parent, *processes):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
