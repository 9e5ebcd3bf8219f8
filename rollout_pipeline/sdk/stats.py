"""Statistics of a batch from its group items alone (one paged Query, no result object read): rewards, the groups
that carry a GRPO signal, and pass@k per input.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code",
https://arxiv.org/abs/2107.03374, eq. 1): for an input with `n` samples of which `c` pass,
`pass@k = 1 - C(n - c, k) / C(n, k)`, the probability that at least one of `k` samples drawn without replacement
from the `n` passes; the batch's pass@k is its mean over the inputs with `n >= k`. A sample passes when its reward
is at least `threshold` (1.0 by default: full credit). Failed rollouts are not samples by default (an infrastructure
failure says nothing of the policy); `failures="fail"` counts each as a sample that did not pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from rollout_pipeline.ledger.items import GroupItem

#: The reward at or above which a sample counts as a pass, unless told otherwise.
DEFAULT_PASS_THRESHOLD: Final = 1.0
FailurePolicy = Literal["exclude", "fail"]
FAILURE_POLICIES: Final = ("exclude", "fail")


def pass_at_k(n: int, c: int, k: int) -> float:
    """`1 - C(n - c, k) / C(n, k)` (exact binomials): the chance that `k` of `n` samples, `c` of which pass, hold
    a pass. `ValueError` unless `0 <= c <= n` and `1 <= k <= n`."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n (got n={n}, c={c}, k={k})")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def parse_ks(text: str) -> tuple[int, ...]:
    """`"1,4,8"` -> (1, 4, 8): positive integers, ascending, without repeats. `ValueError` naming a bad one."""
    ks: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"{part!r} in {text!r} is not a positive integer (expected e.g. 1,4,8)")
        ks.add(int(part))
    return tuple(sorted(ks))


@dataclass(frozen=True)
class InputSamples:
    """One input's samples: `n` counted, `c` of them passing, and its rollouts that failed."""

    input_id: str
    n: int
    c: int
    failed: int


@dataclass(frozen=True)
class PassAtK:
    """pass@k of one batch for one k: the mean over `inputs` inputs with at least k samples (None when none has)."""

    k: int
    value: float | None
    inputs: int


@dataclass
class BatchStats:
    """What `exp.data.stats` computes for one batch."""

    batch_id: str
    threshold: float
    failures: FailurePolicy
    groups: int = 0
    complete_groups: int = 0
    rollouts: int = 0
    succeeded: int = 0
    failed: int = 0
    reward_mean: float | None = None
    groups_with_variance: int = 0
    pass_at: list[PassAtK] = field(default_factory=list)
    samples: list[InputSamples] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "groups": self.groups,
            "complete_groups": self.complete_groups,
            "rollouts": self.rollouts,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "reward_mean": self.reward_mean,
            "groups_with_variance": self.groups_with_variance,
            "pass_threshold": self.threshold,
            "failures": self.failures,
            "pass_at_k": {str(p.k): {"value": p.value, "inputs": p.inputs} for p in self.pass_at},
        }


def input_samples(group: GroupItem, threshold: float, failures: FailurePolicy) -> InputSamples:
    """One complete group as pass@k samples."""
    rewards = list(group.rewards.values())
    failed = len(group.failures)
    passing = sum(1 for reward in rewards if reward >= threshold)
    return InputSamples(group.input_id, len(rewards) + (failed if failures == "fail" else 0), passing, failed)


def batch_stats(
    batch_id: str,
    groups: Iterable[GroupItem],
    *,
    ks: Sequence[int] = (),
    threshold: float = DEFAULT_PASS_THRESHOLD,
    failures: FailurePolicy = "exclude",
) -> BatchStats:
    """Rewards, groups with signal and pass@k over the complete groups of a batch (incomplete ones are counted in
    `groups` only)."""
    if failures not in FAILURE_POLICIES:
        raise ValueError(f"failures must be one of {', '.join(FAILURE_POLICIES)} (got {failures!r})")
    if not math.isfinite(threshold):
        raise ValueError(f"the pass threshold must be a finite number (got {threshold})")
    stats = BatchStats(batch_id=batch_id, threshold=threshold, failures=failures)
    reward_sum = 0.0
    for group in groups:
        stats.groups += 1
        stats.rollouts += group.group_size
        stats.succeeded += len(group.rewards)
        stats.failed += len(group.failures)
        reward_sum += sum(group.rewards.values())
        if not group.complete:
            continue
        stats.complete_groups += 1
        if len(set(group.rewards.values())) > 1:
            stats.groups_with_variance += 1
        stats.samples.append(input_samples(group, threshold, failures))
    stats.reward_mean = reward_sum / stats.succeeded if stats.succeeded else None
    for k in ks:
        values = [pass_at_k(s.n, s.c, k) for s in stats.samples if s.n >= k]
        stats.pass_at.append(PassAtK(k, sum(values) / len(values) if values else None, len(values)))
    return stats
