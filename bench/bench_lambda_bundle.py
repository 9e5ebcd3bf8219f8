"""Lambda asset size and handler cold-import time: the bundle before and after it carried its own boto3/botocore.

Before (main up to ea15918): the bundle held pydantic and Powertools (pip-resolved from pyproject's pins); boto3,
botocore, s3transfer, urllib3 came from the Lambda runtime, in whatever version the runtime shipped that day.
After: the bundle installs `lambdas/requirements.lock` (boto3/botocore the tests ran with, hashes checked).

1. Size: both assets are built exactly as `cdk synth` builds them (pip, aarch64 manylinux, the runtime's Python,
   binary wheels only); printed unpacked (Lambda's limit: 250 MB) and zipped (deflate; direct upload limit: 50 MB).
2. Cold import: the same package versions are installed for this machine's Python into a host-runnable copy, laid
   out like Lambda's sys.path: the bundle first (`/var/task`: no bytecode, read-only, so `-B` and no `__pycache__`),
   then the runtime's own packages (`/var/runtime`: precompiled, as the runtime ships them). Each handler is imported
   in a fresh `python -S -B` process (no site-packages), then boto3 is imported and the five clients the pipeline
   uses are created (what the first invocation adds, since handlers import boto3 lazily). Median of --runs.
   A third variant ("after, precompiled") ships the bundle with bytecode for the runtime's Python. Wall times
   (perf_counter) and the process's CPU time (process_time: less sensitive to other load on a shared machine).

Run: `python bench/bench_lambda_bundle.py [--runs 7]` (about 2 minutes; needs the package registry for pip).
Absolute times are this machine's (x86_64, its Python), not Lambda's arm64: compare the rows, not the numbers.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stacks.bundling import LocalPipBundling, copy_sources  # noqa: E402
from stacks.locks import LAMBDA_LOCK, LAMBDA_PYTHON, canonical  # noqa: E402

#: What main's bundling passed to pip before this change (pyproject's pins minus boto3 and the CLI's rich).
BEFORE_REQUIREMENTS = ["pydantic==2.14.3", "aws-lambda-powertools==3.37.0"]
HANDLERS = ("ingest", "dispatch", "completion", "sweeper")
CLIENTS = ("s3", "sqs", "dynamodb", "events", "bedrock-agentcore")
PROBE = """
import json, sys, time
sys.path[:0] = json.loads(sys.argv[1])
c0, t0 = time.process_time(), time.perf_counter()
__import__(sys.argv[2])
t1 = time.perf_counter()
import boto3
session = boto3.session.Session(region_name="us-east-1")
for name in json.loads(sys.argv[3]):
    session.client(name)
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"import": t1 - t0, "first_use": t2 - t1, "cpu": c2 - c0, "boto3": boto3.__file__}))
"""


def tree_size(path: Path) -> tuple[int, int]:
    """(bytes, files) under path."""
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def zipped_size(path: Path) -> int:
    """Size of the folder zipped with deflate, as the CDK uploads a Lambda asset."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "asset.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                zf.write(file, file.relative_to(path))
        return archive.stat().st_size


def distributions(path: Path) -> set[str]:
    """Canonical names of the distributions pip installed into a --target folder."""
    return {canonical(p.name.split("-")[0]) for p in path.glob("*.dist-info")}


def build_target_assets(work: Path) -> dict[str, Path]:
    """The before and after assets for the Lambda's platform, built as `cdk synth` builds them."""
    before, after = work / "before-asset", work / "after-asset"
    for folder in (before, after):
        folder.mkdir()
    bundler = LocalPipBundling(ROOT, LAMBDA_PYTHON, LAMBDA_LOCK)
    command = bundler.pip_command(str(before))
    old_command = command[: command.index("--no-deps")]  # main's command: the same pip call on a requirement list
    subprocess.run([*old_command, *BEFORE_REQUIREMENTS], check=True, stdout=subprocess.DEVNULL)
    copy_sources(ROOT, before)
    subprocess.run(bundler.pip_command(str(after)), check=True, stdout=subprocess.DEVNULL)
    copy_sources(ROOT, after)
    return {"before": before, "after": after}


def build_host_layouts(work: Path, before_names: set[str]) -> dict[str, list[Path]]:
    """sys.path layouts (bundle, runtime) runnable by this Python, with the locked versions."""
    host = work / "host-packages"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    subprocess.run([*pip, "--no-deps", "--require-hashes", "--target", str(host), "-r", str(LAMBDA_LOCK)], check=True)
    layouts: dict[str, list[Path]] = {}
    for name, in_bundle in (("before", before_names), ("after", distributions(host))):
        bundle, runtime = work / f"{name}-task", work / f"{name}-runtime"
        bundle.mkdir()
        runtime.mkdir()
        for dist_info in host.glob("*.dist-info"):
            dest = bundle if canonical(dist_info.name.split("-")[0]) in in_bundle else runtime
            for line in (dist_info / "RECORD").read_text().splitlines():
                top = line.split(",")[0].split("/")[0]
                source = host / top
                if top and source.exists() and not (dest / top).exists():
                    (shutil.copytree if source.is_dir() else shutil.copy2)(source, dest / top)
        copy_sources(ROOT, bundle)
        compileall.compile_dir(runtime, quiet=1, workers=0)  # the runtime's packages ship precompiled
        layouts[name] = [bundle, runtime]
    compiled = work / "after-compiled-task"
    shutil.copytree(work / "after-task", compiled)
    compileall.compile_dir(
        compiled, quiet=1, workers=0, invalidation_mode=compileall.py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    layouts["after, precompiled"] = [compiled, work / "after-runtime"]
    return layouts


def probe(layout: list[Path], handler: str) -> dict[str, float | str]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "POWERTOOLS_SERVICE_NAME": handler,
        "POWERTOOLS_METRICS_NAMESPACE": "bench",
    }
    paths = json.dumps([str(p) for p in layout])
    out = subprocess.run(
        [sys.executable, "-S", "-B", "-c", PROBE, paths, handler, json.dumps(CLIENTS)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=layout[0],
    )
    result: dict[str, float | str] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-bundle-") as tmp:
        work = Path(tmp)
        assets = build_target_assets(work)
        print(f"Lambda asset (aarch64, Python {LAMBDA_PYTHON}):")
        for name, path in assets.items():
            size, files = tree_size(path)
            print(
                f"  {name:6} {size / 2**20:6.1f} MiB unpacked, {zipped_size(path) / 2**20:5.1f} MiB zipped, "
                f"{files} files; packages: {', '.join(sorted(distributions(path)))}"
            )
        layouts = build_host_layouts(work, distributions(assets["before"]))
        plain, compiled = (tree_size(layouts[name][0])[0] for name in ("after", "after, precompiled"))
        print(f"  bytecode adds {(compiled - plain) / 2**20:.1f} MiB unpacked (measured on this machine's Python)")
        print(f"Cold import (median of {args.runs}, Python {sys.version.split()[0]} on this machine), ms:")
        header = f"{'import handler':>15} {'+ boto3 + 5 clients':>20} {'total':>8} {'total CPU':>10}"
        print(f"  {'handler':10} {'variant':20} {header}")
        for handler in HANDLERS:
            for variant, layout in layouts.items():
                runs = [probe(layout, handler) for _ in range(args.runs)]
                from_bundle = Path(str(runs[0]["boto3"])).is_relative_to(layout[0])
                assert from_bundle == (variant != "before"), f"{variant}: boto3 imported from {runs[0]['boto3']}"
                imp = statistics.median(float(r["import"]) for r in runs) * 1000
                use = statistics.median(float(r["first_use"]) for r in runs) * 1000
                tot = statistics.median(float(r["import"]) + float(r["first_use"]) for r in runs) * 1000
                cpu = statistics.median(float(r["cpu"]) for r in runs) * 1000
                print(f"  {handler:10} {variant:20} {imp:15.0f} {use:20.0f} {tot:8.0f} {cpu:10.0f}")


if __name__ == "__main__":
    main()
