"""Lambda code asset built without Docker: pip installs aarch64 wheels locally, then the sources are copied in.

One asset serves every function: the exact dependency versions of `lambdas/requirements.lock` (boto3 and botocore
included, so the Lambdas run the SDK the tests ran with, not whatever the runtime ships; see `stacks/locks.py`), the
`rollout_pipeline` package and the `lambdas/*.py` handler modules at the root.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

import jsii
from aws_cdk import AssetHashType, BundlingOptions, FileSystem, IgnoreMode, ILocalBundling
from aws_cdk import aws_lambda as lambda_

from stacks.locks import LAMBDA_LOCK

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
LIBRARY_PACKAGE: Final = "rollout_pipeline"
HANDLERS_DIR: Final = "lambdas"
#: The lock, relative to the asset source (it lives beside the handlers it ships with).
LOCK_PATH: Final = f"{HANDLERS_DIR}/{LAMBDA_LOCK.name}"
#: Only these paths feed the asset hash, so unrelated edits (tests, docs, the agent) do not re-bundle.
ASSET_EXCLUDES: Final = [
    "*",
    f"!{LIBRARY_PACKAGE}",
    f"!{LIBRARY_PACKAGE}/**",
    f"!{HANDLERS_DIR}",
    f"!{HANDLERS_DIR}/*.py",
    f"!{LOCK_PATH}",
    "**/__pycache__",
    "**/*.pyc",
]
#: Bytecode that Lambda uses as is: /var/task is read-only and zip extraction does not keep source timestamps, so
#: without it every cold start compiles the bundle (botocore included) from source.
COMPILE_ARGS: Final = ["-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash"]
_COPY_IGNORE: Final = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache")


#: How long `uv python find` may take (it only looks: it never downloads).
UV_FIND_TIMEOUT_S: Final = 30


def bytecode_compiler(python_version: str) -> str | None:
    """An interpreter of the Lambda's Python version to precompile the bundle with: this one, `pythonX.Y` on PATH,
    or one uv knows of (`uv python install X.Y` installs one once, next to any system Python)."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == python_version:
        return sys.executable
    return shutil.which(f"python{python_version}") or uv_python(python_version)


def uv_python(python_version: str) -> str | None:
    """The path of a Python `python_version` that `uv python find` reports, if uv is installed (PATH or this venv)."""
    beside = Path(sys.executable).with_name("uv")
    uv = shutil.which("uv") or (str(beside) if beside.is_file() else None)
    if uv is None:
        return None
    try:
        found = subprocess.run(
            [uv, "python", "find", python_version],
            check=True,
            capture_output=True,
            text=True,
            timeout=UV_FIND_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    path = found.stdout.strip().splitlines()[-1] if found.stdout.strip() else ""
    return path if path and Path(path).is_file() else None


def copy_sources(source: Path, output: Path) -> None:
    """Copy the library, the handler modules flat (`ingest.handler`, ...) and `lambdas/` as a package too.

    The package copy keeps `from lambdas.x import y` working for handlers that share a helper module.
    """
    shutil.copytree(source / LIBRARY_PACKAGE, output / LIBRARY_PACKAGE, ignore=_COPY_IGNORE, dirs_exist_ok=True)
    handlers = source / HANDLERS_DIR
    if handlers.is_dir():
        shutil.copytree(handlers, output / HANDLERS_DIR, ignore=_COPY_IGNORE, dirs_exist_ok=True)
        for module in sorted(handlers.glob("*.py")):
            if module.name != "__init__.py":
                shutil.copy2(module, output / module.name)


@jsii.implements(ILocalBundling)
class LocalPipBundling:
    """Bundle on this machine: `pip install --platform manylinux aarch64 --only-binary` then copy the sources.

    Then precompiles everything with an interpreter of the Lambda's Python version if this machine has one (bytecode
    of another version is useless there); without one the asset still works, with a slower first invocation.
    Returns False (so CDK falls back to the Docker image) only when pip itself is unusable here.
    """

    def __init__(self, source: Path, python_version: str, lock: Path, compiler: str | None) -> None:
        self._source = source
        self._python_version = python_version
        self._lock = lock
        self._compiler = compiler

    def pip_command(self, output_dir: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",
            "--platform",
            "manylinux2014_aarch64",
            "--platform",
            "manylinux_2_28_aarch64",
            "--implementation",
            "cp",
            "--python-version",
            self._python_version,
            "--only-binary=:all:",
            "--upgrade",
            "--target",
            output_dir,
            # Exactly the lock: every package pinned and hash-checked, nothing resolved beyond it.
            "--no-deps",
            "--require-hashes",
            "-r",
            str(self._lock),
        ]

    def try_bundle(self, output_dir: str, *_args: object, **_kwargs: object) -> bool:
        try:
            subprocess.run([sys.executable, "-m", "pip", "--version"], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            return False
        print(f"bundling Lambda code locally (pip, aarch64, Python {self._python_version})", file=sys.stderr)
        subprocess.run(self.pip_command(output_dir), check=True, stdout=sys.stderr)
        copy_sources(self._source, Path(output_dir))
        compiler = self._compiler
        if compiler is None:
            print(
                f"warning: no python{self._python_version} here to precompile the Lambda bundle: every cold start "
                f"compiles boto3/botocore from source. Install one once (`uv python install {self._python_version}`, "
                f"or python{self._python_version} on PATH) and synth again (see docs/deploy.md)",
                file=sys.stderr,
            )
        else:
            subprocess.run([compiler, *COMPILE_ARGS, output_dir], check=True, stdout=sys.stderr)
        return True


def asset_hash(source: Path, python_version: str, compiler: str | None, docker_command: str) -> str:
    """The asset's hash: the sources that feed it (`ASSET_EXCLUDES`), how they are bundled, and whether this synth
    precompiles the bundle.

    CDK's own source hash (sources + bundling options) leaves out the last: a synth that finds no Python of the
    runtime's version and one that precompiles gave the same S3 key, so whichever bundle reached the bootstrap bucket
    first stayed there (CloudFormation sees no change). Nothing machine-specific goes in (no absolute path).
    """
    bundling_facts = {
        "bytecode": f"python{python_version}" if compiler is not None else "none",
        "compile": COMPILE_ARGS,
        "pip": LocalPipBundling(Path(), python_version, Path(LOCK_PATH), None).pip_command("OUT")[1:],
        "docker": docker_command,
    }
    return FileSystem.fingerprint(
        str(source),
        exclude=ASSET_EXCLUDES,
        ignore_mode=IgnoreMode.GLOB,
        extra_hash=json.dumps(bundling_facts, sort_keys=True),
    )


def lambda_code(runtime: lambda_.Runtime, source: Path = REPO_ROOT) -> lambda_.AssetCode:
    """The shared Lambda asset for `runtime` (a `python3.X` runtime on arm64)."""
    python_version = runtime.name.removeprefix("python")
    compiler = bytecode_compiler(python_version)
    docker_command = (
        f"pip install --no-compile --no-deps --require-hashes --target /asset-output -r /asset-input/{LOCK_PATH} && "
        f"cp -r /asset-input/{LIBRARY_PACKAGE} /asset-output/ && "
        f"cp -r /asset-input/{HANDLERS_DIR} /asset-output/ && "
        f"find /asset-input/{HANDLERS_DIR} -maxdepth 1 -name '*.py' ! -name __init__.py "
        "-exec cp {} /asset-output/ \\; && "
        f"python {' '.join(COMPILE_ARGS)} /asset-output"
    )
    return lambda_.Code.from_asset(
        str(source),
        exclude=ASSET_EXCLUDES,
        ignore_mode=IgnoreMode.GLOB,
        asset_hash_type=AssetHashType.CUSTOM,
        asset_hash=asset_hash(source, python_version, compiler, docker_command),
        bundling=BundlingOptions(
            image=runtime.bundling_image,
            platform="linux/arm64",
            command=["bash", "-c", docker_command],
            local=LocalPipBundling(source, python_version, source / LOCK_PATH, compiler),
        ),
    )
