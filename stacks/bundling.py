"""Lambda code asset built without Docker: pip installs aarch64 wheels locally, then the sources are copied in.

One asset serves every function: the runtime dependencies of the library (from `pyproject.toml`, minus boto3 which
the Lambda runtime provides), the `rollout_pipeline` package and the `lambdas/*.py` handler modules at the root.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Final

import jsii
from aws_cdk import BundlingOptions, IgnoreMode, ILocalBundling
from aws_cdk import aws_lambda as lambda_

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
LIBRARY_PACKAGE: Final = "rollout_pipeline"
HANDLERS_DIR: Final = "lambdas"
#: Provided by the Lambda Python runtime; bundling them only grows the package.
RUNTIME_PROVIDED: Final = frozenset({"boto3", "botocore", "s3transfer", "jmespath", "urllib3"})
#: Library dependencies no handler imports (the CLI's terminal display): left out of the Lambda asset.
CLI_ONLY: Final = frozenset({"rich"})
#: Only these paths feed the asset hash, so unrelated edits (tests, docs, the agent) do not re-bundle.
ASSET_EXCLUDES: Final = [
    "*",
    f"!{LIBRARY_PACKAGE}",
    f"!{LIBRARY_PACKAGE}/**",
    f"!{HANDLERS_DIR}",
    f"!{HANDLERS_DIR}/*.py",
    "!pyproject.toml",
    "**/__pycache__",
    "**/*.pyc",
]
_COPY_IGNORE: Final = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache")
_REQUIREMENT_NAME: Final = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def runtime_requirements(pyproject: Path = REPO_ROOT / "pyproject.toml") -> list[str]:
    """The library's pinned runtime dependencies, without what the Lambda runtime already has."""
    data = tomllib.loads(pyproject.read_text())
    requirements: list[str] = data["project"]["dependencies"]
    kept = []
    for requirement in requirements:
        match = _REQUIREMENT_NAME.match(requirement)
        if match and match.group(1).lower().replace("_", "-") not in RUNTIME_PROVIDED | CLI_ONLY:
            kept.append(requirement)
    return kept


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

    Returns False (so CDK falls back to the Docker image) only when pip itself is unusable here.
    """

    def __init__(self, source: Path, python_version: str, requirements: list[str]) -> None:
        self._source = source
        self._python_version = python_version
        self._requirements = requirements

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
            *self._requirements,
        ]

    def try_bundle(self, output_dir: str, *_args: object, **_kwargs: object) -> bool:
        try:
            subprocess.run([sys.executable, "-m", "pip", "--version"], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            return False
        print(f"bundling Lambda code locally (pip, aarch64, Python {self._python_version})", file=sys.stderr)
        subprocess.run(self.pip_command(output_dir), check=True, stdout=sys.stderr)
        copy_sources(self._source, Path(output_dir))
        return True


def lambda_code(runtime: lambda_.Runtime, source: Path = REPO_ROOT) -> lambda_.AssetCode:
    """The shared Lambda asset for `runtime` (a `python3.X` runtime on arm64)."""
    python_version = runtime.name.removeprefix("python")
    requirements = runtime_requirements(source / "pyproject.toml")
    docker_command = (
        f"pip install --no-compile --target /asset-output {' '.join(requirements)} && "
        f"cp -r /asset-input/{LIBRARY_PACKAGE} /asset-output/ && "
        f"cp -r /asset-input/{HANDLERS_DIR} /asset-output/ && "
        f"find /asset-input/{HANDLERS_DIR} -maxdepth 1 -name '*.py' ! -name __init__.py "
        "-exec cp {} /asset-output/ \\;"
    )
    return lambda_.Code.from_asset(
        str(source),
        exclude=ASSET_EXCLUDES,
        ignore_mode=IgnoreMode.GLOB,
        bundling=BundlingOptions(
            image=runtime.bundling_image,
            platform="linux/arm64",
            command=["bash", "-c", docker_command],
            local=LocalPipBundling(source, python_version, requirements),
        ),
    )
