"""Local mode leaves no temporary file behind, also when the process that made it is killed with SIGKILL (no cleanup
runs; docs/lifecycle.md, "Nothing left behind"): the pipeline's own work directory (`rollouts-local-*`) goes with a
killed owner and stays after a stop (its logs), a `work_dir` given is never removed; an agent process's own log
(`agent-*.log`) goes with the process; a local runtime's own log directory (`local-acr-*`) goes at `close`.

Each child process here runs with its temporary directory in the test's own (`TMPDIR`), so whatever it would leave
is seen, and nothing reaches the machine's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rollout_pipeline.local import lifeline
from rollout_pipeline.local.acr import AgentProcess, LocalAgentRuntime
from tests.conftest import alive, wait_for

pytestmark = pytest.mark.timing

ROOT = Path(__file__).resolve().parents[3]
#: A bound, not a timing: an owner's leftovers go at most `lifeline.CHECK_S` after it, on a quiet machine.
GONE_BOUND_S = 30

#: Makes one work directory of each kind, prints them and the processes it started, then waits to be killed.
OWNER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings

    stopped = LocalPipeline(LocalSettings())
    stopped.stop()  # a stop keeps the work directory (its logs)
    killed = LocalPipeline(LocalSettings())
    given = LocalPipeline(LocalSettings(work_dir=Path(sys.argv[1])))
    print(stopped.work_dir, killed.work_dir, given.work_dir, flush=True)
    time.sleep(3600)
    """
)

#: Starts an agent process with a log of its own (a module that only sleeps), prints its log and pid, waits.
AGENT_OWNER = textwrap.dedent(
    """
    import time
    from rollout_pipeline.local.acr import AgentProcess

    agent = AgentProcess("sleeper", hosted=False).start()
    print(agent.log_path, agent.pid, flush=True)
    time.sleep(3600)
    """
)


def children(pid: int) -> list[int]:
    """The processes `pid` started that still run."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.extend(int(child) for child in (task / "children").read_text().split())
    return found


@pytest.fixture
def sleeper(tmp_path: Path) -> Path:
    """A folder holding module `sleeper`: a process that only waits (an agent stand-in that starts at once)."""
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "sleeper.py").write_text("import time\ntime.sleep(3600)\n")
    return folder


@pytest.fixture
def owner_env(tmp_path: Path, sleeper: Path) -> dict[str, str]:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    return {**os.environ, "TMPDIR": str(temporary), "PYTHONPATH": os.pathsep.join([str(ROOT), str(sleeper)])}


def _start(code: str, env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], list[str]]:
    owner = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    assert owner.stdout is not None
    return owner, owner.stdout.readline().split()


def _kill(owner: subprocess.Popen[str]) -> None:
    owner.send_signal(signal.SIGKILL)
    assert owner.wait(10) == -signal.SIGKILL


def test_a_killed_owner_s_work_directory_goes_a_stopped_or_given_one_stays(
    tmp_path: Path, owner_env: dict[str, str]
) -> None:
    given = tmp_path / "mine"
    owner, printed = _start(OWNER, owner_env, str(given))
    held: list[int] = []
    try:
        stopped, killed, mine = (Path(path) for path in printed)
        assert mine == given
        assert killed.parent == Path(owner_env["TMPDIR"])
        assert killed.name.startswith("rollouts-local-")
        assert all(path.is_dir() for path in (stopped, killed, given))
        held = children(owner.pid)
        assert len(held) == 1, "one holder: the killed pipeline's work directory (none for a stopped or given one)"
        _kill(owner)
        wait_for(lambda: not killed.exists(), timeout_s=GONE_BOUND_S, what="the killed owner's work directory to go")
        wait_for(lambda: not any(alive(pid) for pid in held), timeout_s=GONE_BOUND_S, what="its holder to end")
        assert stopped.is_dir(), "a stopped pipeline's work directory is kept (logs)"
        assert given.is_dir(), "a work directory given is never removed"
    finally:
        if owner.poll() is None:
            owner.kill()
        for pid in held:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_an_agent_process_s_own_log_goes_with_its_killed_owner(owner_env: dict[str, str]) -> None:
    owner, printed = _start(AGENT_OWNER, owner_env)
    agent = int(printed[1])
    try:
        log = Path(printed[0])
        assert log.parent == Path(owner_env["TMPDIR"])
        assert log.name.startswith("agent-")
        assert log.is_file()
        _kill(owner)
        wait_for(lambda: not log.exists(), timeout_s=GONE_BOUND_S, what="the agent's log to go")
        wait_for(lambda: not alive(agent), timeout_s=GONE_BOUND_S, what="the agent process to end")
    finally:
        if owner.poll() is None:
            owner.kill()
        if alive(agent):
            os.kill(agent, signal.SIGKILL)


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's temporary directory, pointed at one of the test's own."""
    import tempfile

    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_a_stopped_agent_process_s_own_log_goes_a_given_one_stays(
    temporary: Path, sleeper: Path, tmp_path: Path
) -> None:
    own = AgentProcess("sleeper", hosted=False, env={"PYTHONPATH": str(sleeper)}).start()
    given = AgentProcess("sleeper", hosted=False, env={"PYTHONPATH": str(sleeper)}, log_path=tmp_path / "given.log")
    given.start()
    assert own.log_path.parent == temporary
    assert own.log_path.is_file()
    own.stop()
    given.stop()
    assert not own.is_alive()
    assert not given.is_alive()
    assert list(temporary.iterdir()) == [], "its own log went with the process"
    assert (tmp_path / "given.log").is_file(), "a log given stays"


def test_a_local_runtime_s_own_log_directory_goes_at_close(temporary: Path, tmp_path: Path) -> None:
    own = LocalAgentRuntime(warm_processes=0)
    given = LocalAgentRuntime(warm_processes=0, log_dir=tmp_path / "logs")
    assert own.log_dir.parent == temporary
    assert own.log_dir.is_dir()
    own.close()
    given.close()
    assert list(temporary.iterdir()) == []
    assert (tmp_path / "logs").is_dir()


def test_a_lifeline_command_names_the_paths_its_process_removes() -> None:
    assert lifeline.command(["python", "-m", "pkg.mod", "-x"], parent_pid=7, remove=[Path("/t/a.log")]) == [
        "python",
        "-m",
        lifeline.MODULE,
        "7",
        f"{lifeline.REMOVE}/t/a.log",
        "pkg.mod",
        "-x",
    ]
