"""Example rollout agent: a Strands math agent scored with the GSM8K reward.

Payload (a dataset row minus `id`, plus `_rollout`): `{"question": str, "answer": "#### N" or "N", "_rollout": {...}}`.
An optional row field `task` picks the prompt and the answer format: `"gsm8k"` (word problems, answer written as
`#### N`, strict scoring) or `"arithmetic"` (a short question such as `"7 + 8"` or `"What is 6 x 7?"`, answered with
just a number; the last number of the reply is the answer, so scoring is flexible). Without `task`, the row's answer
tells (`task_of`): `"#### 42"` (GSM8K's format) is `gsm8k`, a plain number (`"42"`, `42`) is `arithmetic`, so rows
shaped like docs/datasets.md's `{"id", "question", "answer": "42"}` are scored as written.
The model endpoint and id come from `_rollout.base_url` / `_rollout.model_id`, sampling params from
`_rollout.sampling_params`, token capture from `_rollout.token_capture`. Optional `_rollout` keys read here:
`reward_mode` ("strict" | "flexible", default strict, env MATH_AGENT_REWARD_MODE), `per_turn_rewards` (bool:
return one reward per assistant turn instead of a number) and `tools` (bool: offer a calculator tool; env
MATH_AGENT_TOOLS=1; off by default because tiny models call tools badly).

A response cut off by `max_tokens` is scored like any other (usually 0: no final answer) with
`stop_reason: "max_tokens"`; it is not an agent error.

Run it: `python -m rollout_pipeline.agent.examples.math_agent --host 127.0.0.1 --port 8080`.
"""

from __future__ import annotations

import ast
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any, cast

from strands import Agent, tool
from strands.types.exceptions import MaxTokensReachedException

from rollout_pipeline.agent.app import RolloutApp, serve
from rollout_pipeline.agent.context import current_rollout
from rollout_pipeline.agent.rewards import Mode, extract_answer, gsm8k_reward, per_turn_rewards
from rollout_pipeline.agent.strands_model import RolloutOpenAIModel

SYSTEM_PROMPT = (
    "You solve grade-school math word problems. Think step by step, then give the final answer on its own line "
    "in the form '#### <number>'."
)
#: The demo's task: SmolLM2-135M gets about 30% of these single-digit sums right at temperature 0.7 (README).
ARITHMETIC_PROMPT = "You are a calculator. Reply with only the result, a single number."
#: task -> (system prompt, default reward mode)
TASKS: dict[str, tuple[str, Mode]] = {
    "gsm8k": (SYSTEM_PROMPT, "strict"),
    "arithmetic": (ARITHMETIC_PROMPT, "flexible"),
}
MAX_QUESTION_CHARS = 10_000

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def evaluate_arithmetic(expression: str) -> float:
    """Evaluate `+ - * / // %` and parentheses over numbers; anything else raises ValueError."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return float(_BINARY[type(node.op)](walk(node.left), walk(node.right)))
        raise ValueError(f"unsupported expression: {ast.dump(node)[:80]}")

    if len(expression) > 200:
        raise ValueError("expression too long")
    try:
        return walk(ast.parse(expression.replace(",", ""), mode="eval"))
    except (SyntaxError, ZeroDivisionError) as exc:
        raise ValueError(str(exc)) from None


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '3 * (4 + 5)'.

    Args:
        expression: numbers with + - * / // % and parentheses.
    """
    try:
        value = evaluate_arithmetic(expression)
    except ValueError as exc:
        return f"error: {exc}"
    return str(int(value)) if value.is_integer() else str(value)


#: Shared by every rollout of this process: `RolloutOpenAIModel` reads each rollout's endpoint, model id, params
#: and token-capture wiring from the rollout context, so sharing it is safe. Non-streaming keeps gateways simple.
MODEL = RolloutOpenAIModel(
    client_args={"base_url": os.environ.get("MODEL_BASE_URL", "http://127.0.0.1:8000/v1")},
    model_id=os.environ.get("MODEL_ID", ""),
    stream=False,
)

app = RolloutApp()


def _flag(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in {"1", "true", "yes"})


def assistant_texts(messages: Sequence[Any]) -> list[str]:
    """The text of every assistant message of a Strands conversation (one entry per turn)."""
    texts: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        parts = [block.get("text", "") for block in message.get("content") or [] if isinstance(block, dict)]
        texts.append("".join(part for part in parts if isinstance(part, str)))
    return texts


def task_of(payload: dict[str, Any]) -> str:
    """The row's `task`; without one, `gsm8k` when its answer is written as GSM8K writes it (`#### N`), else
    `arithmetic` (a plain number: the reply's last number is scored). ValueError for an unknown task."""
    task = payload.get("task")
    if task is None or task == "":
        answer = payload.get("answer")
        return "gsm8k" if isinstance(answer, str) and "####" in answer else "arithmetic"
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: expected one of {', '.join(TASKS)}")
    return str(task)


@app.rollout_entrypoint
async def solve(payload: dict[str, Any]) -> dict[str, Any]:
    """One rollout: ask the model, score its final answer. Raises (-> ART error result) on a malformed payload."""
    question = payload.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("payload needs a non-empty string 'question'")
    if len(question) > MAX_QUESTION_CHARS:
        raise ValueError(f"question longer than {MAX_QUESTION_CHARS} characters")
    ground_truth = payload.get("answer")
    task = task_of(payload)
    system_prompt, task_mode = TASKS[task]
    ctx = current_rollout()
    mode = cast(Mode, str(ctx.raw.get("reward_mode") or os.environ.get("MATH_AGENT_REWARD_MODE") or task_mode))
    use_tools = _flag(ctx.raw.get("tools")) or _flag(os.environ.get("MATH_AGENT_TOOLS"))

    agent = Agent(
        model=MODEL,
        tools=[calculator] if use_tools else [],
        system_prompt=system_prompt,
        callback_handler=None,
    )
    try:
        result = await agent.invoke_async(question)
        final_text, stop_reason = str(result), str(getattr(result, "stop_reason", "end_turn"))
    except MaxTokensReachedException:
        # Truncation is an outcome of the policy, not an infrastructure failure: score what was written.
        partial = assistant_texts(agent.messages)
        final_text, stop_reason = (partial[-1] if partial else ""), "max_tokens"
    turns = assistant_texts(agent.messages) or [final_text]
    if _flag(ctx.raw.get("per_turn_rewards")):
        rewards: float | list[float] = per_turn_rewards(turns, ground_truth, mode)
    else:
        rewards = gsm8k_reward(final_text, ground_truth, mode)
    answer = extract_answer(final_text, mode)
    return {
        "rewards": rewards,
        "response": final_text,
        "predicted_answer": None if answer is None else str(answer),
        "turns": len(turns),
        "policy_version": ctx.policy_version,
        "stop_reason": stop_reason,
        "task": task,
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the math agent (`--host`, `--port`; see `rollout_pipeline.agent.app.serve`)."""
    serve(app, argv)


if __name__ == "__main__":
    main()
