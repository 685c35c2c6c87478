"""Model output is hostile: a property-based test feeds random and adversarial completions (code
that would create a canary file, power towers, huge numbers, deep nesting, LaTeX bombs, control
characters) to the answer checker, the calculator and every function the rewards run on completion text, and
asserts that no exception escapes, every call returns within a time bound, and nothing is executed.

Prints the number of examples tried and the slowest call (``pytest -s`` shows it)."""

from __future__ import annotations

import signal
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_core.calculator import evaluate, line_result
from grpo_core.rewards.scorer import rule_reward
from grpo_core.rewards.steps import split_steps
from grpo_core.verify import answers_match, extract_answer, is_correct, to_number

CANARY = Path(tempfile.mkdtemp(prefix="grpo-canary-")) / "canary"
BOUND_S = 1.0  # per call; typical calls take microseconds
HARD_LIMIT_S = 10  # a call still running after this is interrupted, so a hang fails instead of blocking

FRAGMENTS = [
    f"__import__('os').system('touch {CANARY}')",
    f"exec(\"open('{CANARY}', 'w')\")",
    f"eval(compile('open(\\'{CANARY}\\', \\'w\\')', 's', 'exec'))",
    "__import__('subprocess').run(['sh', '-c', 'touch " + str(CANARY) + "'])",
    "9**9**9**9",
    "10**10**10",
    "2^{2^{2^{2^{2}}}}",
    "1e999999999",
    "-1e-999999999",
    "0/0",
    "1/0",
    "\\frac{1}{0}",
    "(",
    ")",
    "{",
    "}",
    "[",
    "]",
    "\\boxed{",
    "\\frac{",
    "\\sqrt{",
    "\\left(",
    "\\right)",
    "$",
    "\\",
    "####",
    "\\def\\a{\\a\\a}\\a",
    "\\newcommand{\\x}{\\x\\x}",
    "\\input{/etc/passwd}",
    "\\text{",
    "%",
    ",",
    ".",
    "-",
    "+",
    "\x00",
    "\x1b[31m",
    "\r",
    "\u202e",
    "\ufeff",
    "\U0001f600",
    "\n",
    "1",
    "3",
    "42",
    "1,000",
    "3.14",
    "22/7",
]


def hostile_text() -> st.SearchStrategy[str]:
    """Random unicode, adversarial fragments, and fragments repeated up to 20,000 times (nesting
    and size bombs), joined in any order."""
    repeated = st.tuples(st.sampled_from(FRAGMENTS), st.integers(1, 20_000)).map(lambda t: t[0] * t[1])
    piece = st.one_of(st.text(max_size=200), st.sampled_from(FRAGMENTS), repeated)
    return st.lists(piece, max_size=6).map("".join)


def _alarm(signum, frame):
    raise TimeoutError(f"a call on model output ran past {HARD_LIMIT_S} s")


def test_hostile_completions_are_parsed_never_run():
    slowest = [0.0, ""]
    examples = [0]

    def timed(fn, *args):
        start = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, HARD_LIMIT_S)
        try:
            out = fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        elapsed = time.perf_counter() - start
        if elapsed > slowest[0]:
            slowest[:] = [elapsed, f"{fn.__name__}({args[0][:60]!r}...)"]
        assert elapsed < BOUND_S, f"{fn.__name__} took {elapsed:.2f}s"
        return out

    @settings(
        max_examples=400,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        text=hostile_text(),
        gold=st.one_of(st.sampled_from(["3", "42", "1/2", "-7", "1,000"]), hostile_text()),
        wrap=st.sampled_from(["{}", "#### {}", "\\boxed{{{}}}", "Step 1\n{}\n#### {}"]),
    )
    def check(text, gold, wrap):
        examples[0] += 1
        completion = wrap.format(text, text)
        answer = timed(extract_answer, completion)
        assert answer is None or isinstance(answer, str)
        timed(to_number, text)
        assert isinstance(timed(answers_match, text, gold), bool)
        assert isinstance(timed(is_correct, completion, gold), bool)
        assert isinstance(timed(is_correct, "#### 3", gold), bool)  # a hostile gold too
        reward = timed(rule_reward, [completion], [gold])
        assert reward.shape == (1,) and reward[0] in (0.0, 1.0)  # never an error (NaN) on our checker
        assert isinstance(timed(split_steps, completion, "\n"), list)
        assert timed(line_result, completion + " =") is None or isinstance(line_result(completion + " ="), str)
        assert timed(evaluate, text) is None or isinstance(evaluate(text), Fraction)
        assert not CANARY.exists(), f"model text was executed: {completion[:200]!r}"

    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        check()
    finally:
        signal.signal(signal.SIGALRM, previous)
    print(f"\nhostile output: {examples[0]} examples, slowest call {slowest[0] * 1000:.1f} ms: {slowest[1]}")
    assert examples[0] >= 400
    assert not CANARY.exists()


@pytest.mark.parametrize("payload", FRAGMENTS[:4])
def test_the_canary_payloads_would_work_if_executed(payload, tmp_path):
    """The payloads above are live: executed, they do create the canary (so the test can fail)."""
    live = payload.replace(str(CANARY), str(tmp_path / "c"))
    exec(live)  # noqa: S102 - our own test string, never model output
    deadline = time.time() + 5
    while not (tmp_path / "c").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "c").exists()
