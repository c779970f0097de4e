"""The math graders against careful human verdicts, and the dapo / deepscaler styles.

tests/data/math_cases.jsonl holds hand-labelled (response, label, correct) cases; the verdicts were
written before the grader was run on them (two percent verdicts were later changed to the new
default ``--math-percent-policy value``, see the git log). tests/data/math_cases_v2.jsonl (issue
#19: units, multi-part answers, vectors, intervals, empty set, mixed numbers, percent, thinking
blocks, hedges, candidate lists, truncated responses, rounded decimals, GSM8K/MATH formats) was
written and committed before the new grader existed; tests/data/math_cases_holdout.jsonl after it,
but before it was run on them. tests/data/math_cases_v3.jsonl holds answers that a careful grader
credits in other forms (number words, a unit the label implies, sets in words, another form of an
equation, congruences, repeating decimals with an ellipsis, plain-text expressions, multiple-choice
formats) and their no-credit twins (hedges, wrong values, truncations); its verdicts were committed
before the grader learnt these forms, and tests/data/math_cases_v3_holdout.jsonl after that, before
the grader was run on it. Each v2 / v3 case may carry a ``status`` (``truncated``: cut at the
length limit) and a ``prompt``. The agreement runs happen in a child process with a wall-clock
timeout and a memory cap, so a grader that hangs or explodes on a pathological case fails the
test instead of taking the machine down.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlvr.rewards import REWARDS, score
from rlvr.rewards.dapo import dapo_reward
from rlvr.rewards import deepscaler as _deepscaler  # noqa: F401  (registers "deepscaler")
from rlvr.rewards.math import extract_answer, is_unsafe, math_reward
from rlvr.core.types import Sample, Status

CASES_PATH = Path(__file__).parent / "data" / "math_cases.jsonl"
CASES = [json.loads(line) for line in CASES_PATH.read_text().splitlines() if line.strip()]
V2_PATH = Path(__file__).parent / "data" / "math_cases_v2.jsonl"
HOLDOUT_PATH = Path(__file__).parent / "data" / "math_cases_holdout.jsonl"
V3_PATH = Path(__file__).parent / "data" / "math_cases_v3.jsonl"
V3_HOLDOUT_PATH = Path(__file__).parent / "data" / "math_cases_v3_holdout.jsonl"
V3_GROUPS = {"number_words", "unit_implied", "set_words", "equation_form", "modular", "repeating_ellipsis",
             "plain_expression", "choice_format"}
# Groups where a false positive trains the wrong behaviour (issue #19): none is allowed.
NO_FALSE_POSITIVES = ("hedge", "candidate_list", "truncated", "rounded")


def _load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

# Grades every case in a fresh interpreter; prints one JSON list of [verdict, seconds].
_CHILD = """
import json, sys, time
from rlvr.rewards import score
score("math", "1", "1")  # warm-up: the first read of the registry imports math-verify; time grading only
out = []
for line in open(sys.argv[1]):
    case = json.loads(line)
    t = time.perf_counter()
    got = score("math", case["response"], case["label"]) == 1.0
    out.append([got, time.perf_counter() - t])
print(json.dumps(out))
"""


# Grades v2-style cases (status, prompt) with the registered math reward at its defaults.
_CHILD_V2 = """
import json, sys
from rlvr.rewards import RewardConfig
from rlvr.rewards.grader import build_reward
from rlvr.core.types import Sample, Status
reward = build_reward("math", RewardConfig())
out = []
for line in open(sys.argv[1]):
    c = json.loads(line)
    s = Sample(prompt=c.get("prompt", ""), prompt_ids=[], label=c["label"], response=c["response"],
               status=Status(c.get("status", "completed")))
    out.append(reward(s) == 1.0)
print(json.dumps(out))
"""


def _cap_memory() -> None:
    limit = 4 << 30  # 4 GiB of address space: a sympy blow-up dies with MemoryError, not the host
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_case_set_is_large_varied_and_not_mostly_right():
    assert len(CASES) >= 300
    for case in CASES:
        assert set(case) == {"response", "label", "correct", "kind"}, case
        assert isinstance(case["correct"], bool) and isinstance(case["label"], str), case
    kinds = Counter(c["kind"] for c in CASES)
    assert len(kinds) >= 15 and min(kinds.values()) >= 8, kinds
    wrong = sum(not c["correct"] for c in CASES) / len(CASES)
    assert 0.35 <= wrong <= 0.5, f"{wrong:.0%} wrong: an always-yes grader must score badly"


def test_math_grader_agrees_with_human_verdicts():
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(CASES_PATH)],
        capture_output=True, text=True, timeout=600, preexec_fn=_cap_memory,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(CASES)
    disagreements = [(c, got) for c, (got, _) in zip(CASES, results) if got != c["correct"]]
    agreement = 1 - len(disagreements) / len(CASES)
    print(f"\nmath grader agrees with the human verdict on {len(CASES) - len(disagreements)}/{len(CASES)}"
          f" = {agreement:.2%} of cases")
    for case, got in disagreements:
        print(f"  DISAGREE [{case['kind']}] human={case['correct']} grader={got} "
              f"response={case['response'][:120]!r} label={case['label']!r}")
    slow = [(c["kind"], c["response"][:60], round(dt, 2)) for c, (_, dt) in zip(CASES, results) if dt > 3.0]
    assert not slow, f"cases slower than 3 s: {slow}"
    assert not [c for c, got in disagreements if got], "false positives"
    assert len(disagreements) <= 2  # 474/476 before issue #19: no regression (>= 99.5%)


def test_v2_case_set_is_large_and_covers_the_issue_groups():
    cases = _load(V2_PATH)
    assert len(cases) >= 200
    for case in cases:
        assert {"response", "label", "correct", "group"} <= set(case) <= {
            "response", "label", "correct", "group", "status", "prompt"}, case
        assert isinstance(case["correct"], bool) and case.get("status", "truncated") in ("truncated", "completed")
    groups = Counter(c["group"] for c in cases)
    assert all(groups[g] >= 15 for g in NO_FALSE_POSITIVES), groups
    wrong = Counter(c["group"] for c in cases if not c["correct"])
    assert all(wrong[g] >= 12 for g in NO_FALSE_POSITIVES), wrong  # mostly cases that must get 0
    assert len(groups) >= 12


def test_v3_case_set_covers_every_kind_on_both_sides():
    cases = _load(V3_PATH)
    for case in cases:
        assert {"response", "label", "correct", "group"} <= set(case) <= {
            "response", "label", "correct", "group", "status", "prompt"}, case
    assert {c["group"] for c in cases} == V3_GROUPS
    right = Counter(c["group"] for c in cases if c["correct"])
    wrong = Counter(c["group"] for c in cases if not c["correct"])
    assert all(right[g] + wrong[g] >= 20 and right[g] >= 10 and wrong[g] >= 9 for g in V3_GROUPS), (right, wrong)
    assert sum(c.get("status") == "truncated" for c in cases) >= len(V3_GROUPS)  # one cut response per kind
    assert {c["group"] for c in _load(V3_HOLDOUT_PATH)} == V3_GROUPS


@pytest.mark.parametrize(
    "path,threshold",
    [(V2_PATH, 0.995), (HOLDOUT_PATH, 0.995), (V3_PATH, 0.995), (V3_HOLDOUT_PATH, 0.995)],
    ids=["v2", "holdout", "v3", "v3_holdout"],
)
def test_math_grader_agrees_on_realistic_cases(path, threshold):
    cases = _load(path)
    proc = subprocess.run([sys.executable, "-c", _CHILD_V2, str(path)], capture_output=True, text=True,
                          timeout=600, preexec_fn=_cap_memory)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(got) == len(cases)
    disagreements = [(c, g) for c, g in zip(cases, got) if g != c["correct"]]
    for case, g in disagreements:
        print(f"  DISAGREE [{case['group']}] human={case['correct']} grader={g} "
              f"response={case['response'][-120:]!r} label={case['label']!r}")
    false_positives = Counter(c["group"] for c, g in disagreements if g)
    assert not false_positives, f"credited wrong answers (hedges, truncations, other values): {false_positives}"
    assert 1 - len(disagreements) / len(cases) >= threshold


@pytest.mark.parametrize(
    "response,label,expected",
    [
        ("The answer is twelve.", "12", 1.0),
        ("So the answer is twelve or thirteen.", "12", 0.0),  # a hedge in words
        ("Each one of them gets an equal share.", "1", 0.0),  # the pronoun is no answer
        ("\\boxed{125 \\text{ cents}}", "\\$1.25", 1.0),
        ("\\boxed{125}", "\\$1.25", 0.0),  # a bare number is not converted
        ("\\boxed{2.5 \\text{ kg}}", "2.5 \\text{ g}", 0.0),
        ("The angle is $\\boxed{60^\\circ}$.", "\\frac{\\pi}{3}", 1.0),
        ("So the domain is all real numbers except $x = 2$.", "(-\\infty,2)\\cup(2,\\infty)", 1.0),
        ("So the domain is all real numbers except $x = 2$.", "(-\\infty,\\infty)", 0.0),
        ("So the line is x + 2y = 6.", "y = -\\frac{x}{2} + 3", 1.0),
        ("So the line is x + 2y = 8.", "y = -\\frac{x}{2} + 3", 0.0),
        ("So x ≡ 3 (mod 7).", "3", 1.0),
        ("So x ≡ 3 (mod 7).", "7", 0.0),  # the modulus is not the answer
        ("\\boxed{4 \\pmod 9}", "4", 1.0),  # \pmod is not \pm
        ("The answer is 0.1666...", "0.1\\overline{6}", 1.0),
        ("The answer is approximately 0.1666.", "0.1\\overline{6}", 0.0),
        ("The answer is 0.16...", "\\frac{1}{6}", 0.0),  # no repetition shown
        ("It simplifies to (x + 1)/x.", "1 + \\frac{1}{x}", 1.0),
        ("So the simplified form is 2*sqrt(3).", "3", 0.0),  # not the last number
        ("The area is 24.\n\n**C**", "C", 1.0),
        ("The area is 24.\n\nOption C: 24", "(C) 24", 1.0),
        ("The area is 24.\n\nOption B: 24", "(C) 24", 0.0),
        ("The options are:\n(A) 12\n(B) 18\n(C) 24\n(D) 30", "D", 0.0),  # a list commits to nothing
        ("The answer is **B**, though D is also possible.", "B", 0.0),
        ("Option B: 4\nOption C: 5", "C", 0.0),  # a list in "Option X:" lines
        ("Let me check option C: 4 x 6 = 24", "C", 0.0),  # examining an option is not choosing it
        ("So I would pick option D.", "D", 1.0),
        ("The answer is twenty or so.", "20", 0.0),
    ],
)
def test_answer_forms(response, label, expected):
    assert score("math", response, label) == expected


# Answers in words and decorated answers: each form credited, and its hedged, listed, negated,
# truncated, wrong-unit and letter/value-disagreeing twins given 0. The last field is the status.
@pytest.mark.parametrize(
    "response,label,expected,status",
    [
        # words
        ("Since the discriminant is zero, the curve is a parabola.", "parabola", 1, None),
        ("The conic is an **ellipse**.", "\\text{ellipse}", 1, None),
        ("So the quadrilateral is a rhombus.", "rhombus", 1, None),
        ("So the triangle is a right triangle.", "right triangle", 1, None),
        ("Since B^2 - 4AC = 0, the curve is a parabola.", "\\text{(C) parabola}", 1, None),
        ("The curve is a parabola.", "(C) parabola", 1, None),
        ("The curve is a hyperbola.", "(C) parabola", 0, None),
        ("It is a circle, ellipse, or parabola.", "parabola", 0, None),
        ("The possible curves are circle, ellipse, parabola.", "parabola", 0, None),
        ("The curve is either an ellipse or a parabola.", "parabola", 0, None),
        ("The curve is not a parabola.", "parabola", 0, None),
        ("Let me check whether the curve is a parabola.", "parabola", 0, None),  # a question, not an answer
        ("If B^2 = 4AC, the curve is a parabola.", "parabola", 0, None),  # a condition
        ("I think it could be a parabola.", "parabola", 0, None),
        ("The curve is probably a parabola.", "parabola", 0, None),
        ("The curve is a parabola", "parabola", 0, "truncated"),
        ("Let me check whether the curve is a parabola. The discriminant is", "parabola", 0, "truncated"),
        ("The curve is a parabola.", "parabola", 0, "truncated"),
        ("So the curve is a hyperbola.", "parabola", 0, None),
        ("So the answer is yes.", "yes", 1, None),
        ("\\boxed{\\text{No}}", "no", 1, None),
        ("So the answer is yes or no, depending on n.", "yes", 0, None),
        ("It is either yes or no.", "yes", 0, None),
        ("The answer is **Yes**", "yes", 0, "truncated"),
        ("The answer is yes.", "no", 0, None),
        ("Yes, no, maybe.", "yes", 0, None),
        # units / degrees in bold or box
        ("So the angle is **45°**.", "45", 1, None),
        ("\\boxed{45^\\circ}", "45^\\circ", 1, None),
        ("\\boxed{\\frac{\\pi}{4}}", "45^\\circ", 1, None),
        ("The answer is **12 cm**.", "12", 1, None),
        ("\\boxed{12\\text{ cm}}", "12 \\text{ cm}", 1, None),
        ("\\boxed{12\\text{ cm}}", "12 \\text{ m}", 0, None),
        ("\\boxed{12\\text{ kg}}", "12 \\text{ cm}", 0, None),
        ("So the angle is **45° or 135°**.", "45", 0, None),
        ("So the angle is 45° or 135°.", "45^\\circ", 0, None),
        ("The answer is **45°", "45", 0, "truncated"),
        ("\\boxed{46^\\circ}", "45", 0, None),
        # implied units
        ("The total is **350 cents**.", "\\$3.50", 1, None),
        ("\\boxed{350 \\text{ cents}}", "\\$3.50", 1, None),
        ("\\boxed{150 \\text{ minutes}}", "2.5 \\text{ hours}", 1, None),
        ("\\boxed{350}", "\\$3.50", 0, None),
        ("\\boxed{350 \\text{ dollars}}", "\\$3.50", 0, None),
        ("The total is 350 cents or 3 dollars.", "\\$3.50", 0, None),
        ("\\boxed{350 \\text{ cents}}", "3.50", 0, None),
        ("The total is 350 cents", "\\$3.50", 0, "truncated"),
        ("\\boxed{3.5 \\text{ kg}}", "\\$3.50", 0, None),
        # letter + value
        ("The answer is (C) 24.", "24", 1, None),
        ("\\boxed{(C) 24}", "24", 1, None),
        ("The answer is **(C) 24**.", "24", 1, None),
        ("The answer is (C) 24.", "(C) 24", 1, None),
        ("The answer is (C) 24.", "C", 1, None),
        ("The answer is (B) 24.", "(C) 24", 0, None),
        ("The answer is (C) 18.", "(C) 24", 0, None),
        ("The answer is (C) 18.", "24", 0, None),
        ("The answer is (A) 24 or (C) 18.", "24", 0, None),
        ("\\boxed{(A) 12, (C) 24}", "24", 0, None),
        ("The answer is (C) 24", "24", 0, "truncated"),
        ("\\boxed{C}", "24", 0, None),
        ("The answer is 24, which is option C.", "C", 1, None),
        ("So the answer is 24 (option C).", "(C) 24", 1, None),
        ("The answer is 24, which is option B.", "(C) 24", 0, None),  # the value and the letter disagree
        ("The answer is 24, which is option B.", "C", 0, None),
        ("The answer is 24, which is option C or D.", "C", 0, None),
        ("The answer is 24, which is option C", "C", 0, "truncated"),
    ],
)
def test_words_and_decorated_answers(response, label, expected, status):
    sample = Sample(prompt="", prompt_ids=[], label=label, response=response, status=Status(status or "completed"))
    assert math_reward(sample) == expected


# Replies that end on a bare yes/no, a value with a degree sign after "=", or an amount in cents (a
# user's report, with a careful grader's verdict on each): the nine reported replies are credited.
REPORTED = [
    ("No.", "no"),
    ("Removing them leaves unequal colors.\n\nNo, it cannot be done.", "\\text{no}"),
    ("No, it is impossible.", "no"),
    ("Yes, it is possible.", "\\text{yes}"),
    ("So x = 90°", "90"),
    ("Each exterior angle is 360° / 4 = **90°**", "90"),
    ("x = 90°", "90^\\circ"),
    ("Each pencil costs **40 cents**.", "0.4"),
    ("The total is 40 cents.", "$0.40"),
]


@pytest.mark.parametrize("response,label", REPORTED)
def test_reported_yes_no_degree_and_cents_replies_are_credited(response, label):
    assert score("math", response, label) == 1.0


# Each form of the reported replies credited beside its hedged, listed, questioning, truncated and
# wrong-value twins, which get 0. Fields: response, label, expected, status, prompt.
@pytest.mark.parametrize(
    "response,label,expected,status,prompt",
    [
        # a last sentence that opens with yes or no, against every label form of the answer
        ("No.", "No", 1, None, ""),
        ("So the colours cannot be balanced.\n\n**No**, it cannot be done.", "\\text{No}", 1, None, ""),
        ("Yes!", "\\text{Yes}", 1, None, ""),
        ("Yes: every such graph has a cycle.", "yes", 1, None, ""),
        ("No, it is not possible.", "no", 1, None, ""),  # "not" restates the no
        ("No, it cannot be done.", "False", 1, None, "Can the board be tiled with these pieces?"),
        ("Yes, 91 = 7 * 13 is composite.", "True", 1, None, "If n = 91, is n composite? Explain."),
        ("So the answer is yes.", "True", 1, None, "Is 91 composite?"),  # a marker's yes for a True label
        ("No, it cannot be done.", "False", 0, None, ""),  # no prompt: True/False is not read as yes/no
        ("No, it cannot be done.", "False", 0, None, "How many tilings are there?"),
        ("Yes, it is.", "True", 0, None, "Is 91 prime or composite?"),  # the question offers alternatives
        ("No, or maybe yes.", "no", 0, None, ""),  # hedged
        ("No, but it depends on n.", "no", 0, None, ""),
        ("Yes, if n is even.", "yes", 0, None, ""),  # a condition
        ("No, wait, it can be done.", "no", 0, None, ""),  # withdrawn
        ("Yes or no.", "yes", 0, None, ""),  # listed
        ("yes, no", "yes", 0, None, ""),
        ("Yes, no.", "no", 0, None, ""),
        ("No?", "no", 0, None, ""),  # a question
        ("Is it possible? No?", "no", 0, None, ""),
        ("No, it cannot be done.", "no", 0, "truncated", ""),  # cut: the reply never committed
        ("No, it cannot", "no", 0, "truncated", ""),
        ("No.", "yes", 0, None, ""),  # wrong answer
        ("Yes, it is possible.", "no", 0, None, ""),
        ("No.", "0", 0, None, ""),  # a yes/no reply against a numeric label
        ("Yes, it is possible.", "1", 0, None, ""),
        ("No one can do it.", "no", 0, None, ""),  # "No one" is no answer
        ("The answer is 5.\n\nNo, it cannot be done.", "no", 0, None, ""),  # a marker committed to 5
        # a degree sign after "=" or "is", bold or not, against labels with or without the unit
        ("So x = 90°.", "90", 1, None, ""),
        ("So x = 90^\\circ", "90", 1, None, ""),
        ("So x = 90\\degree.", "90^\\circ", 1, None, ""),
        ("So x = **90 degrees**.", "90", 1, None, ""),
        ("The angle is **90°**", "90^\\circ", 1, None, ""),
        ("So x = 90°", "\\frac{\\pi}{2}", 1, None, ""),  # a degree mark is pi/180
        ("So x = 80° or 90°.", "90", 0, None, ""),  # hedged
        ("So x = 90° or maybe 80°.", "90", 0, None, ""),
        ("The angles are 60°, 90° and 90°.", "90", 0, None, ""),  # listed
        ("So x = 90°?", "90", 0, None, ""),  # a question
        ("So x = 90°", "90", 0, "truncated", ""),  # cut before it commits: "90°" may have gone on
        ("Each exterior angle is 360° / 4 = **90°**", "90", 0, "truncated", ""),
        ("So x = 80°", "90", 0, None, ""),  # wrong value
        ("So x = 80°", "90^\\circ", 0, None, ""),
        ("So the temperature is 90°C.", "\\frac{\\pi}{2}", 0, None, ""),  # a temperature is no angle
        # an amount in cents against the dollar label it names, and dollars against cents
        ("Each pencil costs **40 cents**.", "\\$0.40", 1, None, ""),
        ("So each pencil costs 40¢.", "0.4", 1, None, ""),
        ("\\boxed{40 \\text{ cents}}", "0.40", 1, None, ""),
        ("The total is $0.40.", "40 \\text{ cents}", 1, None, ""),  # dollars for a label in cents
        ("The answer is \\$0.40.", "40 \\text{ cents}", 1, None, ""),
        ("The total is 40 cents.", "40", 1, None, ""),  # a bare 40 counts cents: the unit is presentation
        ("The total is $0.40.", "40", 0, None, ""),  # a bare label is never read as cents
        ("\\boxed{40}", "0.4", 0, None, ""),  # a bare number is never converted
        ("The total is 150 minutes.", "2.5", 0, None, ""),  # other units convert only where the label names one
        ("So the total is 250 cents.", "2.5", 0, None, ""),  # a dollar or more: the label does not say dollars
        ("Each pencil costs 40 cents or 50 cents.", "0.4", 0, None, ""),  # hedged
        ("Each pencil costs 50 cents or 40 cents.", "0.4", 0, None, ""),
        ("The pencils cost 30 cents, 50 cents and 40 cents.", "0.4", 0, None, ""),  # listed
        ("Each pencil costs 40 cents?", "0.4", 0, None, ""),  # a question
        ("Each pencil costs **40 cents**.", "0.4", 0, "truncated", ""),  # cut: no final statement
        ("The total is 40 cents", "$0.40", 0, "truncated", ""),
        ("Each pencil costs **50 cents**.", "0.4", 0, None, ""),  # wrong value
        ("The total is 4 cents.", "$0.40", 0, None, ""),
        ("The total is 40 cents.", "4", 0, None, ""),
        ("The total is 40 kg.", "0.4", 0, None, ""),  # not money
    ],
)
def test_yes_no_degree_and_cents_forms(response, label, expected, status, prompt):
    sample = Sample(prompt=prompt, prompt_ids=[], label=label, response=response, status=Status(status or "completed"))
    assert math_reward(sample) == expected


def test_pathological_cases_are_graded_fast():
    import time

    # CPU time of this thread (grading runs on it), not wall-clock time, which a loaded machine stretches
    for case in (c for c in CASES if c["kind"] == "pathological"):
        t = time.thread_time()
        score("math", case["response"], case["label"])
        assert time.thread_time() - t < 2.0, case["response"][:80]
    assert is_unsafe("9^{9^{9^{9}}}") and is_unsafe("2^{1000000}") and not is_unsafe("2^{10}")


_ADVERSARIAL = """
import time
from rlvr.rewards import score
inputs = ["$" * 20000, "\\\\(" * 10000, "\\\\frac{" * 3000, "[" * 5000, "The answer is " * 2000,
          "9" * 20000, "\\\\boxed{1 " + "a" * 5000 + "!", "Answer: 1 " + "ab " * 3000 + "!",
          "\\\\boxed{" + "\\\\sqrt{" * 300 + "2" + "}" * 301, "\\\\boxed{x = " + "y = " * 2000 + "1}",
          "\\\\boxed{9^9^9}", "The answer is 2^2^2^2^2^2.", "\\\\boxed{10^{10^{10}}!}"]
score("math", "1", "1")  # warm-up: importing math-verify is not grading
for text in inputs:  # CPU seconds of the grading thread: a loaded machine does not stretch them
    t = time.thread_time()
    score("math", text, "1")
    assert time.thread_time() - t < 2.0, text[:40]
print("ok")
"""


def test_adversarial_responses_end_fast():
    # Regex backtracking or a sympy blow-up would hang here: the child is fenced by a timeout.
    proc = subprocess.run([sys.executable, "-c", _ADVERSARIAL], capture_output=True, text=True,
                          timeout=120, preexec_fn=_cap_memory)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]


def test_math_reward_works_from_worker_threads():
    # math-verify's signal.alarm timeouts only work in the main thread; elsewhere we turn them
    # off. Same verdicts either way.
    cases = [c for c in CASES if c["kind"] != "pathological"][::5]
    main = [score("math", c["response"], c["label"]) for c in cases]

    def grade(case):
        assert threading.current_thread() is not threading.main_thread()
        return math_reward(Sample("", [], label=case["label"], response=case["response"]))

    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(grade, cases))
    assert threaded == main


@pytest.mark.parametrize(
    "response,expected",
    [
        ("The answer is 3. Check: \\boxed{4} and 5", "4"),  # the box wins over the marker
        ("I think 3. The answer is 5. Check: 2 + 3 = 5, in 2 steps", "5"),  # marker over last number
        ("It is $\\frac{5}{36}$.", "\\frac{5}{36}"),  # math span over the number inside it
        ("$x = 3$ so 7 people", "7"),  # a later number beats an earlier math span
        ("x" * 50_000 + " so the total is 12", "12"),  # long responses: only the tail is read
        ("Check the answer: it must be even. So 4.", "4"),  # prose after a marker is no answer
        ("The answer is Monday.", "Monday"),
    ],
)
def test_extraction_order(response, expected):
    assert extract_answer(response) == expected


def test_math_reward_rejects_missing_label():
    with pytest.raises(ValueError, match="label"):
        math_reward(Sample("", [], label=None, response="\\boxed{1}"))


# --- dapo ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response,label,score_,pred",
    [
        ("Let me compute.\nAnswer: 42", "42", 1.0, "42"),
        ("answer: 42", "42", 1.0, "42"),  # any case
        ("Answer: $1,000$", "1000", 1.0, "1000"),
        ("Answer: x = 7", "7", 1.0, "7"),
        ("Answer: 5 dollars", "5", 1.0, "5"),
        ("Answer: \\boxed{12}", "12", 1.0, "12"),
        ("Answer: 41", "42", -1.0, "41"),
        ("Answer: 42.", "42", -1.0, "42."),  # the trailing period stays, as in slime
        ("\\boxed{42}", "42", -1.0, "[INVALID]"),  # no Answer: line
        ("Answer: 3\nThen I changed my mind.\nAnswer: 4", "4", 1.0, "4"),  # the last one counts
        ("Answer: 42\n" + "more words " * 40, "42", -1.0, "[INVALID]"),  # outside the last 300 chars
        ("Answer: 42", "42.0", 1.0, "42"),  # labels compare as int(float(label))
    ],
)
def test_dapo(response, label, score_, pred):
    result = dapo_reward(Sample("", [], label=label, response=response))
    assert result == {"score": score_, "acc": 1.0 if score_ > 0 else 0.0, "pred": pred}
    assert score("dapo", response, label) == score_


def test_dapo_rejects_non_integer_labels():
    with pytest.raises(ValueError, match="integer labels.*--rm-type math"):
        dapo_reward(Sample("", [], label="1/2", response="Answer: 1/2"))


# --- deepscaler ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response,label,expected",
    [
        ("<think>3+4</think>So \\boxed{7}.", "7", 1.0),
        ("<think>3+4</think>So \\boxed{8}.", "7", 0.0),
        ("<think>a \\boxed{7}</think> b \\boxed{7}", "7", 1.0),
        ("<think>still thinking \\boxed{7}", "7", 0.0),  # no </think>: nothing to grade
        ("prompt ###Response the sum is \\boxed{7}", "7", 1.0),
        ("<think>x</think> The answer is 7.", "7", 0.0),  # the box is required
        ("<think>x</think> \\fbox{7}", "7", 0.0),
        ("<think>x</think> \\boxed{7", "7", 0.0),  # an unclosed box does not count
        ("<think>x</think> \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("<think>x</think> \\boxed{0.5}", "\\boxed{\\frac12}", 1.0),  # boxed labels are unboxed
        ("<think>x</think> \\boxed{7}", "", 0.0),
    ],
)
def test_deepscaler(response, label, expected):
    result = REWARDS["deepscaler"](Sample("", [], label=label, response=response))
    assert result == expected and isinstance(result, float)
