"""`from strands_tools import calculator` as ART's example writes it: a module holding a Strands tool named
`calculator` that evaluates an arithmetic expression (the real one uses sympy; this one the math agent's evaluator)."""

from strands import tool

from rollout_pipeline.agent.examples.math_agent import evaluate_arithmetic


@tool
def calculator(expression: str) -> str:
    """Calculate the result of a mathematical expression such as '3 * (4 + 5)'.

    Args:
        expression: the expression to evaluate (numbers, + - * / // % and parentheses).
    """
    try:
        value = evaluate_arithmetic(expression)
    except ValueError as exc:
        return f"Error: {exc}"
    return str(int(value)) if value.is_integer() else str(value)
