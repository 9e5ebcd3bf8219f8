"""`make test-stress`: the timing-sensitive tests (marker `timing`), N rounds, while other processes keep every core
busy, so a change can be checked against a machine as loaded as CI's can be.

    python -m tests.stress --rounds 10 --burners 2 [-- extra pytest args]

The burners are plain busy loops in child processes, bounded by `--max-minutes` and stopped when the rounds end
(also on Ctrl-C or a failed round). Exits non-zero at the first failed round, naming it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence

BURN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def start_burners(count: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    """`count` busy-loop processes, each ending by itself after `seconds` at the latest."""
    return [subprocess.Popen([sys.executable, "-c", BURN.format(seconds=seconds)]) for _ in range(count)]


def stop_burners(burners: Sequence[subprocess.Popen[bytes]]) -> None:
    for burner in burners:
        burner.kill()
    for burner in burners:
        burner.wait(timeout=10)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10, help="rounds of the timing tests (default 10)")
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2, help="busy processes (default: cores)")
    parser.add_argument("--max-minutes", type=float, default=60.0, help="the burners stop by themselves after this")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    command = [sys.executable, "-m", "pytest", "-m", "timing", "-q", "-p", "no:cacheprovider", *args.pytest_args]
    burners = start_burners(args.burners, args.max_minutes * 60)
    started = time.monotonic()
    try:
        for round_ in range(1, args.rounds + 1):
            load = os.getloadavg()[0]
            print(f"stress round {round_}/{args.rounds} ({args.burners} burners, load {load:.1f})", flush=True)
            if subprocess.run(command, check=False).returncode != 0:
                print(f"stress: round {round_} failed", flush=True)
                return 1
    finally:
        stop_burners(burners)
    print(f"stress: {args.rounds} rounds passed in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
