"""`rollouts local up` / `local demo` stop on Ctrl-C even when started with SIGINT ignored (a child inherits an
ignored SIGINT, and Python then installs no KeyboardInterrupt handler: the process slept through Ctrl-C)."""

from __future__ import annotations

import os
import signal

import pytest

from rollout_pipeline.local.pipeline import interrupt_on_signals


def _ctrl_c_inside() -> None:
    with interrupt_on_signals():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # bounded: the handler runs at the next bytecode boundary
            pass


def test_sigint_interrupts_inside_even_when_it_was_ignored_and_stays_ignored_after() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt):
            _ctrl_c_inside()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
