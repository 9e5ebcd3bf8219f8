"""`python -m rollout_pipeline.local.llama_server ARGS`: llama-cpp-python's OpenAI-compatible server (same ARGS as
`python -m llama_cpp.server`) with llama.cpp's extra CPU buffer types off.

Why: llama-cpp-python builds llama.cpp with `-march=native`. On a CPU that advertises AMX (Sapphire Rapids and
later) llama.cpp then places weights in its AMX buffer type, and in a VM whose hypervisor does not enable AMX tile
state the first matrix multiply dies with SIGILL (`tileloadd`: invalid opcode; seen on this project's 2-core CI
VM). `use_extra_bufts = False` keeps weights in plain CPU buffers (AVX2/AVX-512 kernels still apply); for
SmolLM2-135M the repacked/AMX kernels make no measurable difference. Set ROLLOUTS_LLAMA_EXTRA_BUFTS=1 to keep them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def disable_extra_buffer_types() -> None:
    """Make every `llama_cpp.Llama` created from now on load its weights without extra buffer types (AMX, repack)."""
    import llama_cpp.llama_cpp as low_level

    default = low_level.llama_model_default_params

    def params() -> Any:
        value = default()
        value.use_extra_bufts = False
        return value

    low_level.llama_model_default_params = params


def main() -> None:
    """Run llama-cpp-python's server (arguments from the command line)."""
    if os.environ.get("ROLLOUTS_LLAMA_EXTRA_BUFTS") != "1":
        disable_extra_buffer_types()
    from llama_cpp.server import __main__ as server

    # Typed here: llama_cpp's own `main` has no annotations, and the package is absent where `make demo` never ran.
    serve: Callable[[], None] = server.main
    serve()


if __name__ == "__main__":
    main()
