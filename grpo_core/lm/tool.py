"""The calculator in the sampler: where a row's line has just reached an arithmetic expression and
``=``, the tokens of the calculator's result (``calculator.line_result``) are forced, then the model
goes on. A logits processor with transformers' interface (``(input_ids, scores) -> scores``), so
``generate`` and our decode loop (``decode.decode``) run it alike; it records the completion
positions it wrote (``written_mask``): those tokens are not the policy's, and the losses leave them
out. Forcing works on any chooser that takes the argmax of its scores (greedy, ``GumbelSampler``):
every score of a forced row but the forced token's is -inf.
"""

from __future__ import annotations

import torch

from grpo_core.calculator import line_result


class CalculatorForcing:
    """For ``rows`` completions whose tokens start at column ``start`` of the ``input_ids`` it is
    called with (the prompt's width for ``generate``, 0 for ``decode``, which passes the completion
    alone). Called once per token, in order, before the token is chosen."""

    def __init__(self, tokenizer, rows: int, start: int) -> None:
        self.tokenizer, self.start = tokenizer, start
        self.queues: list[list[int]] = [[] for _ in range(rows)]  # tokens still to force, per row
        self.line_from = [0] * rows  # the completion token the row's current line starts in
        self.ended = [False] * rows
        self.written: list[list[int]] = [[] for _ in range(rows)]  # forced completion positions
        self.ids: list[list[int]] = [[] for _ in range(rows)]  # each row's completion so far

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1] - self.start  # the position of the token about to be chosen
        if t > 0:  # one new token a row since the last call: read it alone, not the whole completion again
            if self.ids and len(self.ids[0]) != t - 1:
                raise RuntimeError(
                    f"CalculatorForcing is called once per token: at token {t}, it saw {len(self.ids[0])}"
                )
            for ids, token in zip(self.ids, input_ids[:, -1].tolist()):
                ids.append(token)
            self._observe(t)
        forced = [(i, q.pop(0)) for i, q in enumerate(self.queues) if q and not self.ended[i]]
        if not forced:
            return scores
        rows = torch.tensor([i for i, _ in forced], device=scores.device)
        tokens = torch.tensor([k for _, k in forced], device=scores.device)
        scores = scores.clone()
        scores[rows] = -torch.inf
        scores[rows, tokens] = 0.0
        for i, _ in forced:
            self.written[i].append(t)
        return scores

    def _observe(self, t: int) -> None:
        """Each row's line after its token ``t - 1``: a result to force where it ends in ``expr =``."""
        eos = self.tokenizer.eos_token_id
        for i, ids in enumerate(self.ids):
            if self.ended[i] or self.queues[i]:
                continue
            if ids[t - 1] == eos:
                self.ended[i] = True
                continue
            line = self.tokenizer.decode(ids[self.line_from[i] : t])
            if "\n" in line:
                self.line_from[i] = t - 1  # the token holding the newline; line_result reads after it
            if self.written[i] and self.written[i][-1] == t - 1:
                continue  # the result just written ends no expression
            result = line_result(line)
            if result is not None:
                self.queues[i] = self.tokenizer(result, add_special_tokens=False).input_ids  # digits, '.', '-'

    def written_mask(self, width: int) -> torch.Tensor:
        """[rows, width] float: 1 at the completion positions the calculator wrote."""
        mask = torch.zeros(len(self.written), width)
        for i, positions in enumerate(self.written):
            kept = [p for p in positions if p < width]
            mask[i, kept] = 1.0
        return mask
