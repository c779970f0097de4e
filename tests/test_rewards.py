import pytest

from rlvr.rewards import REWARDS, score
from rlvr.rewards.math import extract_answer


@pytest.mark.parametrize(
    "response,label,expected",
    [
        ("46", "46", 1.0),
        ("The answer is 46.", "46", 1.0),
        ("first 12, then \\boxed{46}", "46", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("Answer: 1/2", "\\frac{1}{2}", 1.0),
        ("47", "46", 0.0),
        ("4 6", "46", 0.0),
        ("no number here", "46", 0.0),
        ("", "46", 0.0),
        ("1,234", "1234", 1.0),
    ],
)
def test_math_reward(response, label, expected):
    assert score("math", response, label) == expected


def test_extract_answer_priority():
    assert extract_answer("answer is 3 but \\boxed{4}") == "4"
    assert extract_answer("I think 3. The answer is 5") == "5"


def test_unknown_reward_lists_valid_names():
    with pytest.raises(KeyError, match=r"unknown reward 'nope' \(--rm-type\); valid: .*math"):
        REWARDS["nope"]
