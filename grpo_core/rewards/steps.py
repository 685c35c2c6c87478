"""Solutions as steps: splitting, the token where each step ends, and the arithmetic step checker.

A step is one line by default (``separator="\\n"``); the process reward model reads its score at
the token that holds a step's last character. Completions are untrusted text: nothing here
evaluates them, the checker only parses integers with a regex and compares.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from grpo_core.verify import answers_match, extract_answer

if TYPE_CHECKING:
    from grpo_core.lm.policy import Rollout


def split_steps(text: str, separator: str = "\n") -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the non-blank steps of ``text``.

    >>> split_steps("1 + 2 = 3\\n\\n#### 3")
    [(0, 9), (11, 17)]
    """
    if not separator:
        raise ValueError("step separator must be non-empty")
    spans, start = [], 0
    while start <= len(text):
        stop = text.find(separator, start)
        stop = len(text) if stop < 0 else stop
        piece = text[start:stop]
        if piece.strip():
            left = start + len(piece) - len(piece.lstrip())
            right = start + len(piece.rstrip())
            spans.append((left, right))
        start = stop + len(separator)
    return spans


def step_texts(text: str, separator: str = "\n") -> list[str]:
    return [text[a:b] for a, b in split_steps(text, separator)]


class char_ends_of_tokens(Sequence[int]):
    """[T] number of characters decoded from tokens ``0..t``, computed on demand.

    Decoding prefixes is exact for any tokenizer (byte-level BPE included) where per-token strings
    are not; computing an entry only when ``step_end_tokens``' binary search asks for it costs
    O(K log T) decodes per completion instead of T.
    """

    def __init__(self, tokenizer, token_ids: list[int]) -> None:
        self.tokenizer, self.ids, self.cache = tokenizer, list(token_ids), {}

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, t):  # type: ignore[override]
        if isinstance(t, slice):
            return [self[i] for i in range(*t.indices(len(self)))]
        t = range(len(self))[t]
        if t not in self.cache:
            self.cache[t] = len(self.tokenizer.decode(self.ids[: t + 1], skip_special_tokens=True))
        return self.cache[t]


def step_end_tokens(char_ends: Sequence[int], spans: list[tuple[int, int]]) -> list[int]:
    """Token index holding the last character of each step.

    char_ends: [T] non-decreasing (``char_ends_of_tokens``); spans: [K] from ``split_steps``.
    Returns [K] indices in ``0..T-1`` (a step cut off by truncation maps to the last token).
    """
    if len(char_ends) == 0:
        return []
    last = len(char_ends) - 1
    return [min(bisect_left(char_ends, end), last) for _, end in spans]


# ------------------------------------------------------------------------- the arithmetic task

_EQUATION = re.compile(r"^\s*(-?\d{1,12})\s*([+-])\s*(-?\d{1,12})\s*=\s*(-?\d{1,12})\s*$")
_QUESTION = re.compile(r"What is (-?\s*\d{1,12}(?:\s*[+-]\s*\d{1,12})+)\?")


def reference_steps(question: str) -> list[tuple[int, str, int, int]] | None:
    """The left-to-right chain ``(a, op, b, a op b)`` of an arithmetic question, or None (another
    task, or operands over 12 digits)."""
    m = _QUESTION.search(question)
    if not m:
        return None
    tokens = re.findall(r"\d+|[+-]", m.group(1))  # unsigned: in "7-5" the "-" is the operator
    if tokens[0] == "-":
        tokens = [str(-int(tokens[1]))] + tokens[2:]
    value, out = int(tokens[0]), []
    for op, x in zip(tokens[1::2], tokens[2::2]):
        new = value + int(x) if op == "+" else value - int(x)
        out.append((value, op, int(x), new))
        value = new
    return out


def exact_step_labels(question: str, steps: list[str], gold: str) -> list[bool] | None:
    """Exact labels for the arithmetic task: step k is right while every line so far is the next
    line of the reference chain and a final ``#### v`` line has v = gold. None for another task.
    The last step of a solution that never states an answer is wrong (as its Monte-Carlo label is:
    the whole solution is checked, not continued).

    A Math-Shepherd hard label asks instead whether *some* continuation reaches the gold answer;
    the two differ when a later error cancels an earlier one.
    """
    chain = reference_steps(question)
    if chain is None:
        return None
    labels, ok, k = [], True, 0
    for line in steps:
        m = _EQUATION.match(line)
        if m:
            a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
            ok = ok and k < len(chain) and (a, op, b, c) == chain[k]
            k += 1
        else:
            answer = extract_answer(line)
            ok = ok and answer is not None and k == len(chain) and answers_match(answer, gold)
        labels.append(ok)
    if labels and extract_answer(steps[-1]) is None:
        labels[-1] = False
    return labels


def planted_error(question: str, rng) -> str | None:
    """A worked solution of an arithmetic ``question`` with one planted error, carried on to the
    end: at a random step either the result is off by 1-3 or the operand is miscopied by 1-2 (and
    the result computed from it); every later step starts from the wrong value, so the final answer
    is wrong too. None for another task. Reward-model training data: a negative that differs from
    the right solution only where it goes wrong (``exact_step_labels`` labels it)."""
    chain = reference_steps(question)
    if chain is None:
        return None
    at, delta = rng.randrange(len(chain)), rng.choice((-3, -2, -1, 1, 2, 3))
    miscopy = rng.random() < 0.5 and abs(delta) <= 2 and 1 <= chain[at][2] + delta <= 9  # a digit still
    value, lines = chain[0][0], []
    for k, (_, op, b, _) in enumerate(chain):
        b = b + delta if k == at and miscopy else b
        new = value + b if op == "+" else value - b
        new = new + delta if k == at and not miscopy else new
        lines.append(f"{value} {op} {b} = {new}")
        value = new
    return "\n".join(lines + [f"#### {value}"])


def rollout_step_ends(tokenizer, rollout: Rollout, separator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, K] token index where each step of each completion ends, and [B, K] bool mask of real
    steps (a row with no step is all False)."""
    per_row = []
    for i, text in enumerate(rollout.texts):
        n = int(rollout.completion_mask[i].sum()) - (0 if bool(rollout.truncated[i]) else 1)
        char_ends = char_ends_of_tokens(tokenizer, rollout.completion_ids[i, : max(n, 0)].tolist())
        per_row.append(step_end_tokens(char_ends, split_steps(text, separator)))
    k = max([1, *map(len, per_row)])
    ends = torch.zeros(len(per_row), k, dtype=torch.long)
    mask = torch.zeros(len(per_row), k, dtype=torch.bool)
    for i, idx in enumerate(per_row):
        ends[i, : len(idx)] = torch.tensor(idx, dtype=torch.long)
        mask[i, : len(idx)] = True
    return ends, mask
