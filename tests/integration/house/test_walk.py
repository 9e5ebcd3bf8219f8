"""The walk is a rule: the upload and result walks (`bench/bench_walk.py`: file changes a reader follows for one
upload and one result) stay under their ceilings, and docs/benchmarks.md shows what they measure today.

The walk is deterministic (a clock that moves only when the pipeline sleeps; only the thread that carries it and the
work it hands to pools are traced), so the figures are compared exactly, whatever the machine's load. Plain moto:
the faithful profile's throttles and retries would be walked too."""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]

#: File changes each walk may take at most: a feature that needs more shortens a walk first.
CEILINGS = {"upload, window on": 158, "upload, window off": 158, "result": 150}

pytestmark = pytest.mark.plain_moto


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_walk_for_tests", REPO / "bench" / "bench_walk.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def measured(bench: ModuleType) -> Iterator[dict[str, Any]]:
    """The walk's rows, measured once for the module (fake credentials, plain moto: `bench_walk.walk`'s own)."""
    with pytest.MonkeyPatch.context() as env:
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            env.setenv(key, "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        env.setenv("AWS_REGION", "us-east-1")
        env.delenv("AWS_ENDPOINT_URL", raising=False)
        env.delenv("AWS_PROFILE", raising=False)
        yield bench.measure()


def test_the_walks_stay_under_their_ceilings(measured: dict[str, Any]) -> None:
    over = {
        name: f"{figures.file_changes} file changes > {CEILINGS[name]}"
        for name, figures in measured.items()
        if figures.file_changes > CEILINGS[name]
    }
    assert not over, (
        f"a walk grew past its ceiling: {over}; shorten it (WALK_ROOMS=1 python bench/bench_walk.py prints the "
        "rooms each strand walks through)"
    )


def test_the_docs_show_todays_walk(bench: ModuleType, measured: dict[str, Any]) -> None:
    documented = bench.documented(bench.DOCS.read_text())
    assert documented == bench.table(measured), (
        f"docs/benchmarks.md's walk table is not what the walk measures today:\n{documented}\nmeasured:\n"
        f"{bench.table(measured)}\nrun `python bench/bench_walk.py --write-docs` and commit the table"
    )


def test_a_walk_follows_the_work_it_hands_to_a_pool_and_no_other_thread(bench: ModuleType) -> None:
    """Each work item the walk submits to a pool is a strand of its own (whichever worker runs it); a thread the
    walk starts beside it, and a pool's work another thread submits, are not walked."""
    from rollout_pipeline import ids

    unfollowed = ThreadPoolExecutor(max_workers=1)
    go = threading.Event()

    def beside() -> None:
        go.wait(5)
        ids.slug("beside")
        unfollowed.submit(ids.slug, "unfollowed").result()

    def walk() -> None:
        thread = threading.Thread(target=beside, daemon=True)
        thread.start()
        ids.slug("walk")
        with ThreadPoolExecutor(max_workers=1) as pool:  # one worker: three strands all the same
            list(pool.map(ids.slug, ["a", "b", "c"]))
        go.set()
        thread.join()

    events = bench.trace(walk)
    unfollowed.shutdown()
    calls = sorted((strand, function) for strand, kind, _room, function in events if kind == "call")
    assert calls == [(0, "slug"), (1, "slug"), (2, "slug"), (3, "slug")]
