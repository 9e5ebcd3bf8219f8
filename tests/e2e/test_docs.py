"""The documentation is executed: every shell and Python block of the README, docs/sdk.md, docs/agent.md and
docs/datasets.md runs here against local mode, so a documented line that stops working fails the build.

How the blocks run, as a reader would run them:
- One local pipeline for all of them: the README's own `rollouts local up` line (the block marked
  `<!-- docs-test: pipeline -->`), started as a process with `--port` (a free one), `--model-url` (a fake
  OpenAI-compatible model: the real one is a minutes-long build, `make demo`'s business) and `--agent-isolation
  shared` (one agent process for every session: the suite stays fast; process isolation is what
  tests/e2e/test_newcomer_walk.py walks). The endpoint the docs show (`http://127.0.0.1:4580`) is replaced by the
  one it printed.
- Each block runs in a fresh `bash -e -o pipefail` or `python`, in a work directory that looks like a checkout
  (`.venv` and `examples/` linked, a two-row `train.jsonl` of the documented shape), with the environment of a
  shell where the block `rollouts local up` printed was pasted (`ROLLOUTS_ENDPOINT_URL`, `ROLLOUTS_EXPERIMENT`).
  Python blocks may call `train_step(input_id, advantages)`, a stand-in for the reader's own training step.
- Markers, on the line before a block's fence: `<!-- docs-test: skip REASON -->` (needs an AWS account, Docker,
  a long build...: reported as skipped with the reason), `<!-- docs-test: module NAME -->` (a Python module: written
  to NAME.py and imported), `<!-- docs-test: pipeline -->` (the `rollouts local up` line above). Blocks fenced
  with another language (`text`, `json`) are output or data, not run.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from rollout_pipeline.agent.testing import FakeModelServer, RecordedRequest
from rollout_pipeline.local.moto_server import free_port

pytestmark = pytest.mark.slow

REPO: Final = Path(__file__).resolve().parents[2]
PAGES: Final = ("README.md", "docs/sdk.md", "docs/agent.md", "docs/datasets.md")
RUN: Final = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python"}
DOCUMENTED_ENDPOINT: Final = "http://127.0.0.1:4580"
MARKER: Final = re.compile(r"^<!--\s*docs-test:\s*(?P<kind>skip|module|pipeline)\b\s*(?P<arg>.*?)\s*-->$")
FENCE: Final = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
ROWS: Final = (
    '{"id": "q1", "question": "What is 2 + 3?", "answer": "5"}\n'
    '{"id": "q2", "question": "What is 7 + 6?", "answer": "13"}\n'
)
PRELUDE: Final = "def train_step(input_id, advantages):\n    print('train_step', input_id, advantages)\n\n"
BLOCK_TIMEOUT_S: Final = 240
UP_TIMEOUT_S: Final = 180
#: Ctrl-C stops `rollouts local up` in about 2 s; one still up after this is killed (in two full runs one outlived
#: 60 s, which did not happen with this file alone: a defect not yet found, kept out of the suite's time).
STOP_TIMEOUT_S: Final = 15


@dataclass(frozen=True)
class Block:
    """One fenced block of a page, with the marker on the line before its fence (if any)."""

    page: str
    line: int
    lang: str
    code: str
    marker: str | None = None
    arg: str = ""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """Every fenced block of `page` (relative to the repository)."""
    found: list[Block] = []
    lines = (REPO / page).read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = next(n for n in range(index + 1, len(lines)) if lines[n].startswith("```"))
        before = lines[index - 1].strip() if index else ""
        marker = MARKER.match(before)
        found.append(
            Block(
                page,
                index + 1,
                fence.group("lang"),
                "\n".join(lines[index + 1 : end]) + "\n",
                marker.group("kind") if marker else None,
                marker.group("arg") if marker else "",
            )
        )
        index = end + 1
    return found


ALL_BLOCKS: Final = [block for page in PAGES for block in blocks(page)]
RUNNABLE: Final = [block for block in ALL_BLOCKS if block.lang in RUN and block.marker != "pipeline"]


def test_every_marker_says_why_and_one_block_starts_the_pipeline() -> None:
    skips = [block for block in ALL_BLOCKS if block.marker == "skip"]
    assert skips, "the deploy blocks are marked"
    assert all(len(block.arg) >= 10 for block in skips), [block.id for block in skips if len(block.arg) < 10]
    assert [block.id for block in ALL_BLOCKS if block.marker == "pipeline"] == [_pipeline_block().id]
    assert all(block.lang in RUN for block in ALL_BLOCKS if block.marker), "a marker on a block that is not run"
    text = "\n".join((REPO / page).read_text(encoding="utf-8") for page in PAGES)
    assert text.count("docs-test:") == sum(1 for block in ALL_BLOCKS if block.marker), "a marker not before a fence"


def _pipeline_block() -> Block:
    (block,) = [block for block in ALL_BLOCKS if block.marker == "pipeline"]
    return block


# --------------------------------------------------------------------------------------------- the pipeline


def _reply(request: RecordedRequest) -> str:
    """A model that can add: the sum of the numbers in the last user message, so rewards vary by nothing random."""
    messages = request.body.get("messages") or [{}]
    text = str(messages[-1].get("content", ""))
    numbers = [int(n) for n in re.findall(r"\d+", text)]
    return f"The answer is {sum(numbers[:2])}.\n#### {sum(numbers[:2])}" if numbers else "#### 0"


@dataclass
class LocalUp:
    endpoint: str
    experiment: str
    work: Path
    process: subprocess.Popen[str]
    log: Path

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(REPO),
            "ROLLOUTS_ENDPOINT_URL": self.endpoint,
            "ROLLOUTS_EXPERIMENT": self.experiment,
            "PYTHONUNBUFFERED": "1",
        }


def _up_command(block: Block, model_url: str, port: int, work_dir: Path) -> list[str]:
    (line,) = [line.split("#", 1)[0].strip() for line in block.code.splitlines() if line.strip()]
    argv = shlex.split(line)
    assert argv[:3] == ["rollouts", "local", "up"], line
    extra = ["--port", str(port), "--model-url", model_url, "--model-id", "fake", "--agent-isolation", "shared"]
    return [str(REPO / ".venv" / "bin" / "rollouts"), *argv[1:], *extra, "--max-sessions", "8", "--work-dir",
            str(work_dir)]  # fmt: skip


@pytest.fixture(scope="module")
def local_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalUp]:
    root = tmp_path_factory.mktemp("docs")
    work = root / "checkout"
    work.mkdir()
    (work / ".venv").symlink_to(REPO / ".venv")
    (work / "examples").symlink_to(REPO / "examples")
    (work / "train.jsonl").write_text(ROWS)
    log = root / "up.log"
    with FakeModelServer(_reply) as model, log.open("w") as out:
        argv = _up_command(_pipeline_block(), model.base_url, free_port(), root / "pipeline")
        # a new shell's environment: nothing of this test process's own AWS or rollouts settings
        env = {key: value for key, value in os.environ.items() if not key.startswith(("ROLLOUTS_", "AWS_"))}
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=work, env=env)
        try:
            endpoint, experiment = _wait_for_block(log, process)
            yield LocalUp(endpoint, experiment, work, process, log)
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]


def _wait_for_block(log: Path, process: subprocess.Popen[str]) -> tuple[str, str]:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        text = log.read_text()
        found = re.search(r"export ROLLOUTS_ENDPOINT_URL=(\S+) ROLLOUTS_EXPERIMENT=(\S+)", text)
        if found and "Ctrl-C stops the pipeline." in text:
            return found.group(1), found.group(2)
        assert process.poll() is None, f"rollouts local up exited: {text[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"rollouts local up printed no block in {UP_TIMEOUT_S} s: {log.read_text()[-3000:]}")


# ------------------------------------------------------------------------------------------------ the blocks


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.id for block in RUNNABLE])
def test_documented_block_runs(block: Block, local_up: LocalUp) -> None:
    if block.marker == "skip":
        pytest.skip(block.arg)
    code = block.code.replace(DOCUMENTED_ENDPOINT, local_up.endpoint)
    if block.marker == "module":
        (local_up.work / f"{block.arg}.py").write_text(code)
        argv = [sys.executable, "-c", f"import {block.arg}"]
    elif RUN[block.lang] == "python":
        argv = [sys.executable, "-c", PRELUDE + code]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", code]
    try:
        done = subprocess.run(
            argv,
            check=False,
            cwd=local_up.work,
            env=local_up.env(),
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{block.id} ran over {BLOCK_TIMEOUT_S} s:\n{exc.stdout!r}\n{exc.stderr!r}") from None
    assert done.returncode == 0, (
        f"{block.id} failed ({done.returncode}):\n{code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )
    assert local_up.process.poll() is None, f"rollouts local up died during {block.id}"
