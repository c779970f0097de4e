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


# --- math: issue #19 rules (final answer, hedges, truncation, units, percent, exactness) ----------

import asyncio  # noqa: E402

from rlvr.core.errors import ConfigError  # noqa: E402
from rlvr.rewards import RewardConfig, grade  # noqa: E402
from rlvr.rewards.grader import Grader, build_reward  # noqa: E402
from rlvr.rewards.math import final_answers, grade_math  # noqa: E402
from rlvr.rewards.math.equiv import MathOptions, is_equivalent, split_values  # noqa: E402
from rlvr.core.types import Sample, Status  # noqa: E402


def _math(response, label, status=Status.COMPLETED, prompt="", **cfg):
    return build_reward("math", RewardConfig(**cfg))(Sample(prompt, [], label=label, response=response, status=status))


@pytest.mark.parametrize(
    "response,label,expected",
    [
        # the thinking block holds guesses; the final answer after it counts
        ("<think>maybe \\boxed{12}</think>So she has \\boxed{14} apples.", "14", 1.0),
        ("<think>maybe \\boxed{12}</think>So she has \\boxed{14} apples.", "12", 0.0),
        ("<think>I get 5, so \\boxed{5}</think>", "5", 1.0),  # nothing after: the thinking's answer
        ("<think>so \\boxed{5} and then", "5", 0.0),  # never finished thinking
        # several values: a list equals the list it states, never one of its members
        ("so $x = \\boxed{2}$ or $x = \\boxed{-3}$.", "-3, 2", 1.0),
        ("so $x = \\boxed{2}$ or $x = \\boxed{-3}$.", "2", 0.0),
        ("So $a = \\boxed{3}$ and $b = \\boxed{4}$.", "(3, 4)", 1.0),
        ("So $a = \\boxed{4}$ and $b = \\boxed{3}$.", "(3, 4)", 0.0),
        ("(a) \\boxed{12}.\n(b) \\boxed{7}.", "12, 7", 1.0),
        ("First \\boxed{5}. No wait, it is \\boxed{6}.", "6", 1.0),  # a correction: the last group
        # hedges get 0
        ("The answer is 6 (or 4 if order matters).", "6", 0.0),
        ("The final answer is 100, or maybe 120.", "100", 0.0),
        ("\\boxed{12 \\text{ or } 15}", "12", 0.0),
        ("\\boxed{\\pm 3}", "3", 0.0),
        ("\\boxed{\\pm 3}", "3, -3", 1.0),
        ("Answer: $\\frac{1}{2}$ (or 0.5)", "1/2", 1.0),  # the same value twice is no hedge
        ("Answer: 2/3, or about 0.67.", "2/3", 1.0),  # an approximation annotates, it is no candidate
        ("\\boxed{A, C}", "A", 0.0),
        ("The answer is (B) or possibly (D).", "B", 0.0),
        ("\\boxed{AC}", "C", 0.0),
        ("The answer is B, not C.", "B", 1.0),
        ("\\boxed{A, C}", "A, C", 1.0),  # a multi-select label
        # units and scale words
        ("\\boxed{3.5 \\text{ million}}", "3500000", 1.0),
        ("\\boxed{3.5 \\text{ million}}", "350000", 0.0),
        ("\\boxed{5 \\text{ million}}", "5", 1.0),  # a label counted in millions
        ("\\boxed{12\\pi \\text{ square units}}", "12\\pi", 1.0),
        ("\\boxed{45 \\text{ km/h}}", "45", 1.0),
        ("\\boxed{3 \\text{ meters}}", "300", 0.0),  # units are dropped, never converted
        # sets, vectors, mixed numbers
        ("\\boxed{x < -1 \\text{ or } x > 3}", "(-\\infty,-1)\\cup(3,\\infty)", 1.0),
        ("\\boxed{x \\le -1 \\text{ or } x \\ge 3}", "(-\\infty,-1)\\cup(3,\\infty)", 0.0),
        ("\\boxed{\\text{no real solutions}}", "\\emptyset", 1.0),
        ("\\boxed{0}", "\\emptyset", 0.0),
        ("\\boxed{\\text{all real numbers}}", "(-\\infty,\\infty)", 1.0),
        ("\\boxed{\\text{all real numbers}}", "(0,\\infty)", 0.0),
        ("\\boxed{(1, -2, 3)}", "\\begin{pmatrix} 1 \\\\ -2 \\\\ 3 \\end{pmatrix}", 1.0),
        ("\\boxed{(1, 2, 3)}", "\\begin{pmatrix} 1 \\\\ -2 \\\\ 3 \\end{pmatrix}", 0.0),
        ("\\boxed{\\begin{pmatrix} 1 & 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", 0.0),
        ("Half of 7.\n#### 3 1/2", "3.5", 1.0),
        ("#### 31/2", "3.5", 0.0),
        # exact numbers: a rounded decimal is not the fraction or radical
        ("\\boxed{0.333333}", "\\frac{1}{3}", 0.0),
        ("\\boxed{1.7320508}", "\\sqrt{3}", 0.0),
        ("\\boxed{0.125}", "\\frac18", 1.0),
        ("\\boxed{0.\\overline{3}}", "1/3", 1.0),
        # no final statement, no answer
        ("Let me set up 3x + 5 = 20, so 3x = 15 and", "15", 0.0),
        ("So he needs 11 more boxes, because each box holds 12.", "11", 1.0),
        ("<answer>4</answer>", "4", 1.0),
    ],
)
def test_math_issue_19_rules(response, label, expected):
    assert _math(response, label) == expected


def test_math_percent_policy():
    assert [_math("\\boxed{25\\%}", "0.25"), _math("\\boxed{0.25}", "25\\%")] == [1, 1]
    assert _math("\\boxed{25\\%}", "25") == 1  # labels often drop the sign
    assert [_math("\\boxed{0.25}", "25"), _math("\\boxed{2.5\\%}", "0.25")] == [0, 0]
    number = dict(math_percent_policy="number")
    assert [_math("\\boxed{25\\%}", "0.25", **number), _math("\\boxed{25\\%}", "25", **number)] == [0, 1]
    strict = dict(math_percent_policy="strict")
    assert [_math("\\boxed{25\\%}", "0.25", **strict), _math("\\boxed{25\\%}", "25", **strict)] == [1, 0]
    with pytest.raises(ConfigError, match="--math-percent-policy"):
        RewardConfig(math_percent_policy="ratio").validate()


def test_math_approximation_only_when_asked():
    assert _math("\\boxed{0.33}", "\\frac13") == 0.0
    assert _math("\\boxed{0.33}", "\\frac13", prompt="Round to the nearest hundredth.") == 1.0
    assert _math("\\boxed{0.34}", "\\frac13", prompt="Round to the nearest hundredth.") == 0.0
    assert _math("\\boxed{3.1}", "\\pi", prompt="to the nearest tenth") == 1.0
    assert _math("\\boxed{33\\%}", "1/3", prompt="Round to the nearest percent.") == 1.0  # 0.33: 2 places
    assert _math("\\boxed{34\\%}", "1/3", prompt="Round to the nearest percent.") == 0.0
    assert _math("\\boxed{0.3333}", "1/3", math_tolerance=1e-3) == 1.0
    assert _math("\\boxed{0.3}", "1/3", math_tolerance=1e-3) == 0.0
    assert is_equivalent("1.41", "\\sqrt{2}", MathOptions(tolerance=0.01)) and not is_equivalent("1.41", "\\sqrt{2}")
    with pytest.raises(ConfigError, match="--math-tolerance"):
        RewardConfig(math_tolerance=-1.0).validate()


@pytest.mark.parametrize(
    "response,expected",
    [
        ("So the answer is $\\boxed{42}$. Let me double-check: 6 * 7 = 42, and", 1.0),  # closed box before the cut
        ("The answer is 42. Now let me verify this by", 1.0),  # a finished marker sentence
        ("<think>6 * 7 = 42.</think>The answer is \\boxed{42}.\n\nLet me explain: first", 1.0),
        ("First, 15 * 3 = 45. Next, 45 - 3 = 42.", 0.0),  # numbers, but no final answer
        ("We compute 6 * 7 = 42", 0.0),  # the last number at the cut
        ("So the answer is 42", 0.0),  # "42" at the cut may have been "420"
        ("Putting it together: \\boxed{42", 0.0),  # a box the cut left open
        ("Total: 42.\n#### 42", 0.0),  # "#### 42" at the cut
        ("<think>so \\boxed{42}. Let me check 6 * 7 =", 0.0),  # cut while thinking
        ("<think>" + "step " * 10_000 + "maybe \\boxed{42}? Let me check", 0.0),  # <think> far back
    ],
)
def test_truncated_response_needs_an_answer_completed_before_the_cut(response, expected):
    assert _math(response, "42", status=Status.TRUNCATED) == expected


def test_truncated_status_reaches_the_math_reward_through_the_rollout():
    # A scripted engine stops at --rollout-max-response-len with finish reason "length"; the rollout
    # marks the sample truncated and grades it with the math reward, which must not credit the
    # last number of the cut reasoning.
    from rlvr.config import RolloutConfig
    from rlvr.engine.base import GenerateResult, SamplingParams
    from rlvr.rollout.rollout import Rollout

    class Chars:  # one token per character
        eos_token_id = None

        def decode(self, ids, skip_special_tokens=True):
            return "".join(map(chr, ids))

    class Scripted:
        def __init__(self, texts):
            self.texts = texts

        async def generate(self, requests):
            out = []
            for req, text in zip(requests, self.texts):
                ids = [ord(c) for c in text][: req.params.max_new_tokens]
                reason = "length" if len(text) > req.params.max_new_tokens else "stop"
                out.append(GenerateResult(req.rid, ids, [0.0] * len(ids), reason, 0))
            return out

    cut = "First, 15 * 3 = 45. Next, 45 - 3 = 42. Then we still need to"  # cut after "= 42."
    finished = "First, 15 * 3 = 45. Next, 45 - 3 = 42."
    boxed = "So \\boxed{42}. Let me double-check the arithmetic once more, step by step."
    limit = len(finished)
    rollout = Rollout(RolloutConfig(rollout_max_response_len=limit), Scripted([cut, finished, boxed]), Chars(),
                      None, Grader(RewardConfig(rm_type="math")))
    group = [Sample("q", [1], label="42", index=i) for i in range(3)]
    asyncio.run(rollout.run_group(group, SamplingParams(max_new_tokens=limit), shape=False))
    assert [s.status for s in group] == [Status.TRUNCATED, Status.COMPLETED, Status.TRUNCATED]
    assert group[0].response == finished  # the same text as the finished response...
    assert [s.scalar_reward() for s in group] == [0.0, 1.0, 1.0]  # ...but no credit when cut


def test_final_answers_readings():
    assert final_answers("The width is \\boxed{4} and the length is \\boxed{9}.", label_parts=2) == ["9", "4, 9"]
    assert split_values("x = 2 \\text{ or } x = -3") == (["2", "-3"], True)
    assert grade_math(Sample("", [], label="7", response="<think>\\boxed{7}")) == 0.0


def test_math_reward_is_configured_from_the_reward_config():
    grader = Grader(RewardConfig(rm_type="math", math_percent_policy="number"))
    samples = [Sample("", [], label="50\\%", response="\\boxed{0.5}"), Sample("", [], label="50", response="50%.")]
    grader.grade_sync(samples)
    assert [s.reward for s in samples] == [0.0, 1.0]
    assert grade("math", "\\boxed{0.5}", "50\\%").score == 1.0  # the default policy: the same value


# --- slime's names and modes -------------------------------------------------------------------


def test_dapo_strict_box_mode():
    strict = RewardConfig(dapo_strict_box=True)
    assert grade("dapo", "so \\boxed{42}", "42", strict).fields == {"acc": 1.0, "pred": "42"}
    assert score("dapo", "so \\boxed{42}", "42") == -1.0  # Minerva mode needs "Answer:"
    assert score("dapo", "Answer: 42", "42", strict) == -1.0  # strict mode needs the box
    assert score("dapo", "\\boxed{42}" + " pad" * 30, "42", strict) == -1.0  # outside the last 100 chars
    assert score("dapo", "\\boxed{42.0}", "42", strict) == -1.0  # a plain string comparison
    assert score("dapo", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", strict) == 1.0  # any label type


def test_slime_rm_type_names():
    for name in ("math", "dapo", "deepscaler", "f1", "gpqa", "remote_rm", "random",
                 "boxed_math", "boxed_dapo", "boxed_deepscaler", "boxed_f1"):
        assert name in REWARDS, name
    assert score("boxed_math", "I think 3 but \\boxed{4}", "4") == 1.0
    assert score("boxed_math", "The answer is 4.", "4") == 0.0  # no box: an empty response
    assert score("boxed_f1", "\\boxed{Eiffel Tower}", "Eiffel Tower") == 1.0
    assert score("gpqa", "The answer is (C).", "C") == 1.0
    assert score("gpqa", "The answer is (C).", 2) == 1.0  # an index label
    assert score("gpqa", "The answer is (C) or (D).", "C") == 0.0
    assert score("random", "x", "y") in (0.0, 1.0)
    assert score("deepscaler", "<think>a</think> \\boxed{7} </think> \\boxed{8}", "7") == 1.0  # slime's split


@pytest.mark.parametrize(
    "response,label,expected",
    [
        ("The answer is 7. Actually, wait, it is 8.", "8", 1.0),  # a correction replaces the answer
        ("The answer is 7. Actually, wait, it is 8.", "7", 0.0),
        ("The answer is 42. Wait, let me double-check: 6 * 7 = 42. Yes.", "42", 1.0),  # a check is no correction
        ("I'm fairly confident the answer is 7, but it might be 8.", "7", 0.0),  # an alternative
        ("Answer: $x=\\frac{-1\\pm\\sqrt{5}}{2}$", "\\frac{-1+\\sqrt5}{2}, \\frac{-1-\\sqrt5}{2}", 1.0),
        ("Answer: $x=\\frac{-1\\pm\\sqrt{5}}{2}$", "\\frac{-1+\\sqrt5}{2}", 0.0),  # \pm names two values
        ("The answer is approximately 42 minutes.", "42", 1.0),
        ("The answer is about 0.333.", "1/3", 0.0),
        ("The answer is 3√2.", "3\\sqrt{2}", 1.0),
    ],
)
def test_math_corrections_alternatives_and_signs(response, label, expected):
    assert _math(response, label) == expected
