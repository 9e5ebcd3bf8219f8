"""Example agents. `math_agent` is the one `agent_image/` serves and local mode starts."""
