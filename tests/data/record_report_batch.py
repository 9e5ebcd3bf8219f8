"""Record `report_batch.json` (the report test's fixture) from a real local run: SmolLM2 through the local pipeline,
3 arithmetic rows x 4, a 10 s rollout deadline so slow attempts time out and are retried, and one rollout cancelled
while the batch runs so the failure chart has a bar. Needs the model extra; run from the repository root:

    python tests/data/record_report_batch.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from rollout_pipeline.contracts import DetailType
from rollout_pipeline.local.demo import first_rows, sample_dataset_path
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings
from rollout_pipeline.report import collect

TARGET = Path(__file__).parent / "report_batch.json"


def main() -> int:
    settings = LocalSettings(
        experiment="report-fixture",
        rollout_timeout_s=10,
        sampling_params={"temperature": 0.7, "max_tokens": 32},
    )
    with tempfile.TemporaryDirectory() as tmp, LocalPipeline(settings) as pipeline:
        experiment = pipeline.experiment
        batch_id = experiment.submit_file(first_rows(sample_dataset_path("arithmetic"), 3, Path(tmp)))
        events = []
        cancelled = False
        for event in experiment.events(batch_id=batch_id, timeout=600):
            events.append(event.envelope)
            if not cancelled and event.detail_type is DetailType.ROLLOUT_COMPLETED:
                experiment.cancel_rollout(batch_id, "add-03", 3, runtime=pipeline.runtime)
                cancelled = True
            if event.detail_type is DetailType.BATCH_COMPLETED:
                break
        data = collect(experiment, batch_id, events)
    TARGET.write_text(data.to_json() + "\n", encoding="utf-8")
    print(f"{TARGET}: {len(data.rows)} rollouts, {len(data.events)} events, status {data.status['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
