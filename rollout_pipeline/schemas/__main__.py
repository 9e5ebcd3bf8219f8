"""Regenerate the event JSON Schemas: `python -m rollout_pipeline.schemas`."""

from rollout_pipeline.schemas import write

for path in write():
    print(path)
