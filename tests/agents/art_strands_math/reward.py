import re

from agentcore_rl_toolkit import RewardFunction


class GSM8KReward(RewardFunction):
    def __call__(
        self,
        response_text="",
        ground_truth="",
        method="strict",
        format_score=0.0,
        score=1.0,
        **kwargs,
    ):
        answer = self.extract_solution(solution_str=response_text, method=method)
        if answer is None:
            reward = 0
        else:
            if answer == ground_truth:
                reward = score
            else:
                reward = format_score
        return reward

    @staticmethod
    def extract_solution(solution_str, method="strict"):
        """
        This is taken from https://github.com/volcengine/verl/blob/4da0d3d3/verl/utils/reward_score/gsm8k.py#L20
        """
        _SOLUTION_CLIP_CHARS = 300

        assert method in ["strict", "flexible"]

        # Optimization: Regular expression matching on very long strings can be slow.
        # For math problems, the final answer is usually at the end.
        # We only match on the last 300 characters, which is a safe approximation for 300 tokens.
        if len(solution_str) > _SOLUTION_CLIP_CHARS:
            solution_str = solution_str[-_SOLUTION_CLIP_CHARS:]

        if method == "strict":
            # this also tests the formatting of the model
            solutions = re.findall("#### (\\-?[0-9\\.\\,]+)", solution_str)
            if len(solutions) == 0:
                final_answer = None
            else:
                # take the last solution
                final_answer = solutions[-1].replace(",", "").replace("$", "")
        elif method == "flexible":
            answer = re.findall("(\\-?[0-9\\.\\,]+)", solution_str)
            final_answer = None
            if len(answer) == 0:
                # no reward is there is no answer
                pass
            else:
                invalid_str = ["", "."]
                # find the last number that is not '.'
                for final_answer in reversed(answer):
                    if final_answer not in invalid_str:
                        break
        return final_answer
