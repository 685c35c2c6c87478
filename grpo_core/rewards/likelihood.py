"""The zero-training verifier: a causal LM read through the probabilities it gives the tokens of a
solution. A step is as sure as the least likely token so far: a miscopied operand or a
wrong sum is a token the model that learnt the task finds improbable, and nothing after it can be
right. On the demo's SFT model it ranked right above wrong solutions of one question where the first
trained ORM and PRM were at chance (docs/reward-models.md). Every trained reward model must beat
this baseline, read from the model it was initialised from.
"""

from __future__ import annotations

import torch

from grpo_core.lm.policy import CompletionLogprobs, Rollout, position_ids, token_logprobs
from grpo_core.rewards.steps import rollout_step_ends


def step_lowest_logprobs(logp: torch.Tensor, ends: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, K] the lowest log-probability of any token up to the end of each step (the lowest so far).

    logp: [B, T] log-probability of each completion token; ends: [B, K] long, the token where each
    step ends (0-based, inclusive; ``steps.rollout_step_ends``); mask: [B, K] bool, real steps.
    Step k holds tokens ``ends[k-1] + 1 .. ends[k]`` (step 0 from token 0), so the separator before
    a step counts with it. A step's score is the lowest over its tokens *and those of every step
    before it*: a step label says whether the solution so far can still reach the answer (nothing
    after a wrong step can), and ``13 - 9 = 4`` after a wrong ``7 + 5 = 13`` is locally likely but
    labelled wrong (read so far, the step AUC on hand-built solutions rose from 0.70 to 0.99:
    docs/reward-models.md). Padding steps (mask False) are 0 (log 1).
    """
    t = torch.arange(logp.shape[1], device=logp.device)
    starts = torch.cat([torch.full_like(ends[:, :1], -1), ends[:, :-1]], dim=1)  # [B, K] previous end
    inside = (t[None, None, :] > starts[:, :, None]) & (t[None, None, :] <= ends[:, :, None])  # [B, K, T]
    lowest = torch.where(inside, logp[:, None, :], torch.inf).amin(dim=-1).cummin(dim=1).values
    return torch.where(mask & torch.isfinite(lowest), lowest, 0.0)


def lowest_logprob(logp: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """[B] the lowest log-probability of any token of each completion (EOS included: ending there is
    part of the solution); logp and completion_mask [B, T]. 0 (log 1) for a row with no token."""
    lowest = torch.where(completion_mask.bool(), logp, torch.inf).amin(dim=1)
    return torch.where(torch.isfinite(lowest), lowest, 0.0)


@torch.no_grad()
def likelihood_scores(model, tokenizer, rollout: Rollout, separator: str):
    """The causal LM ``model`` as a verifier of ``rollout``'s completions: [B] solution scores (the
    lowest token probability of the completion), [B, K] step scores (of each step, so far) and the [B, K]
    bool mask of real steps."""
    ends, mask = rollout_step_ends(tokenizer, rollout, separator)
    logp = token_logprobs(model, rollout).float()
    return (lowest_logprob(logp, rollout.completion_mask).exp(), step_lowest_logprobs(logp, ends, mask).exp(), mask)


def lm_verdicts(
    lm,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    at: torch.Tensor,
    tokens: tuple[int, int],
) -> torch.Tensor:
    """[B, K] the Math-Shepherd reading of a causal LM: the logit of the "good" token minus that of
    the "bad" one, as the LM predicts the token after completion token ``at`` ([B, K] long, 0-based).
    Only the two output rows are computed, not the whole vocabulary."""
    hidden = lm.base_model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask)
    ).last_hidden_state[:, prompt_len:]  # [B, T, H]
    at = at.clamp(0, hidden.shape[1] - 1)
    picked = hidden.gather(1, at[..., None].expand(-1, -1, hidden.shape[-1]))  # [B, K, H]
    good, bad = (picked @ lm.get_output_embeddings().weight[list(tokens)].T).float().unbind(-1)
    return good - bad


class VerifierHead(torch.nn.Module):
    """A reward model that keeps what the SFT model knows (``orm.head`` / ``prm.head``): the causal LM
    itself, read one of two ways, with a calibration ``logit = scale * reading + bias``:

    - ``likelihood``: the lowest log-probability it gives a written token (of the solution; of a step
      and those before it), as the zero-training verifier reads it; it beat a fresh linear head
      trained on the same data (``experiments/verifier_designs.py``, docs/reward-models.md).
    - ``lm`` (Math-Shepherd's format, for models trained to verify): the logit of ``lm_tokens[0]``
      ("+") minus that of ``lm_tokens[1]`` ("-") as the next token after a step's last token (the
      solution's last token for an ORM); with the initial calibration (1, 0) exactly Math-Shepherd's
      P(+) / (P(+) + P(-)).

    Training moves the model's own weights and the two numbers, not a fresh head on its hidden
    states. Saved as a causal-LM folder whose config holds ``reward_head`` (kind, reading, scale,
    bias, tokens); ``grpo-pipeline score`` reads it as an ORM or PRM."""

    # Initial (scale, bias). likelihood: sigmoid(log p + 2) for a step whose least likely token has
    # probability p; fitted on the demo's round-1 labels the two numbers came out near 1.3-1.5 and
    # 1.5-1.7. lm: Math-Shepherd's probability.
    START = {"likelihood": (1.0, 2.0), "lm": (1.0, 0.0)}
    # Adam moves a parameter about lr per step: the LM's weights must move by little, the two
    # calibration numbers by about 1 within the ~100 steps of a demo round (at the LM's lr they barely
    # moved), so they learn 100x faster, without decay.
    CALIBRATION_LR_SCALE = 100.0

    def __init__(
        self,
        lm,
        kind: str,
        reading: str = "likelihood",
        scale: float | None = None,
        bias: float | None = None,
        tokens: tuple[str, str] = ("+", "-"),
        token_ids: tuple[int, int] = (-1, -1),
    ):
        super().__init__()
        if reading not in self.START:
            raise ValueError(f"reward head reading {reading!r}: choose from {', '.join(self.START)}")
        self.lm, self.kind, self.reading, self.tokens, self.token_ids = (
            lm,
            kind,
            reading,
            tuple(tokens),
            tuple(token_ids),
        )
        start = self.START[reading]
        # One-element vectors, not scalars: FSDP shards every parameter along its first dimension.
        self.scale = torch.nn.Parameter(torch.tensor([float(start[0] if scale is None else scale)]))
        self.bias = torch.nn.Parameter(torch.tensor([float(start[1] if bias is None else bias)]))

    def optimizer_groups(self, weight_decay: float) -> list[dict]:
        """The trainer's AdamW groups: the LM's weights, and the calibration at its own pace."""
        return [
            {"params": list(self.lm.parameters()), "weight_decay": weight_decay},
            {"params": [self.scale, self.bias], "weight_decay": 0.0, "lr_scale": self.CALIBRATION_LR_SCALE},
        ]

    @property
    def config(self):
        return self.lm.config

    def activation_checkpointing_enable(self) -> None:
        self.lm.activation_checkpointing_enable()

    def set_attn_implementation(self, name: str) -> None:
        """The language model's attention (``runtime.place`` sets grouped-query attention here)."""
        self.lm.set_attn_implementation(name)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_len: int,
        completion_mask: torch.Tensor,
        ends: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[B] solution logits, or with ``ends`` ([B, K] long, step ends; padding: any index) [B, K]
        step logits, on the model's device."""
        device = self.scale.device
        completion_mask = completion_mask.to(device)
        if self.reading == "lm":
            at = ends if ends is not None else (completion_mask.sum(1).long() - 1).clamp(min=0)[:, None]
            reading = lm_verdicts(
                self.lm, input_ids.to(device), attention_mask.to(device), prompt_len, at.to(device), self.token_ids
            )
            reading = reading if ends is not None else reading[:, 0]
        else:
            logp = CompletionLogprobs(self.lm)(input_ids, attention_mask, prompt_len)[0].float()
            reading = (
                lowest_logprob(logp, completion_mask)
                if ends is None
                else step_lowest_logprobs(logp, ends.to(device), torch.ones_like(ends, dtype=torch.bool, device=device))
            )
        return self.scale * reading + self.bias

    def save_pretrained(self, path, state_dict: dict | None = None) -> None:
        """The language model's folder with the head in its config; ``state_dict``: the head's whole
        state where it is sharded (FSDP)."""
        whole = state_dict or {"scale": self.scale, "bias": self.bias}
        self.lm.config.reward_head = {
            "kind": self.kind,
            "reading": self.reading,
            "scale": whole["scale"].detach().item(),
            "bias": whole["bias"].detach().item(),
            **({"tokens": list(self.tokens)} if self.reading == "lm" else {}),
        }
        self.lm.save_pretrained(
            path,
            state_dict=state_dict and {k.removeprefix("lm."): v for k, v in state_dict.items() if k.startswith("lm.")},
        )

    @classmethod
    def from_folder(
        cls, path, kind: str, reading: str = "likelihood", tokens: tuple[str, str] = ("+", "-")
    ) -> "VerifierHead":
        """From a causal-LM folder: its saved reading and calibration when it is one of ours, else a
        fresh ``reading`` (``lm``: ``tokens`` must each be one token of the folder's tokenizer)."""
        from grpo_core.lm.modeling import ModelError, load_model  # deferred: transformers, only to load a folder

        lm, tokenizer = load_model(path)
        saved = getattr(lm.config, "reward_head", None) or {}
        reading, tokens = saved.get("reading", "likelihood") if saved else reading, tuple(saved.get("tokens", tokens))
        ids = []
        for t in tokens if reading == "lm" else ():
            encoded = tokenizer(t, add_special_tokens=False).input_ids
            if len(encoded) != 1:
                raise ModelError(
                    f"{path}: the reward head's token {t!r} is {len(encoded)} tokens of this tokenizer; "
                    f"<kind>.lm_tokens must name two single tokens (Math-Shepherd: '+' and '-')"
                )
            ids += encoded
        return cls(lm, kind, reading, saved.get("scale"), saved.get("bias"), tokens, tuple(ids) or (-1, -1))


def reward_head_kind(config: dict) -> str | None:
    """``orm`` / ``prm`` for a causal-LM folder's config that holds a trained ``VerifierHead``."""
    head = config.get("reward_head")
    return head.get("kind") if isinstance(head, dict) else None
