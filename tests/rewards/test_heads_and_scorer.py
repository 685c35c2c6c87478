"""Reward models and GRPO's reward sources (grpo_core.rewards.heads, grpo_core.rewards.scorer).

Losses and AUC are checked against hand-computed values (arithmetic in comments) and, for the AUC,
against its O(n^2) pairwise definition with hypothesis. ``RewardScorer`` is run on a tiny ORM and
PRM loaded from the session's freshly initialised tiny Llama (random score heads): its outputs are
compared with ``orm_logits`` / ``prm_step_logits`` read directly at hand-computed step ends, and
fed through the advantage functions to check that completions without a verdict (no step, or a
NaN score) get zero advantage. Step ends use the character tokenizer, where token t holds
character t of the completion.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo_core.rewards.heads as rm
from grpo_core.advantages import outcome_advantages, process_advantages
from grpo_core.data import prompt_text
from grpo_core.lm.modeling import char_tokenizer
from grpo_core.lm.policy import encode
from grpo_core.rewards.heads import bradley_terry_loss, first_wrong_step, pointwise_bce_loss, roc_auc, step_bce_loss
from grpo_core.rewards.scorer import RewardScorer, rule_reward
from grpo_core.rewards.steps import rollout_step_ends
from grpo_core.advantages import paper_step_rewards, rollout_advantages
from grpo_core.stages.reward_model import step_batch
from grpo_core.verify import is_correct

FAST = settings(max_examples=80, deadline=None)  # per test: no global hypothesis profile

QUESTION, GOLD = "What is 7 + 5 - 9?", "3"
PROMPT = prompt_text(QUESTION)
# One group of G = 3 completions of QUESTION; character offsets in comments.
RIGHT = "7 + 5 = 12\n12 - 9 = 3\n#### 3"  # steps at chars 0..9, 11..20, 22..27; EOS is token 28
WRONG = "7 + 5 = 13\n#### 4"  # steps at chars 0..9, 11..16; EOS is token 17
EMPTY = ""  # no step at all: only the EOS token
GROUP = [RIGHT, WRONG, EMPTY]
ENDS = [[9, 20, 27], [9, 16, 0], [0, 0, 0]]  # the token of each step's last character (0: padding)
MASK = [[True, True, True], [True, True, False], [False, False, False]]

SOFTPLUS2 = math.log1p(math.exp(2.0))  # BCE(logit 2, label 0) = log(1 + e^2)    = 2.126928...
SOFTPLUS_M1 = math.log1p(math.exp(-1.0))  # BCE(logit -1, label 0) = log(1 + e^-1) = 0.313262...
LN2 = math.log(2.0)


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


@pytest.fixture(scope="module")
def reward_models(tiny_model_dir):
    """(orm, prm) read from the tiny causal LM folder; their score heads are freshly (seeded) drawn."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        orm = rm.load_reward_model(tiny_model_dir, "orm").eval()
        prm = rm.load_reward_model(tiny_model_dir, "prm").eval()
    return orm, prm


def group_rollout(tok, completions=GROUP, **kw):
    return encode(tok, [PROMPT] * len(completions), completions, **kw)


# ---------------------------------------------------------------------------- Bradley-Terry


def test_bradley_terry_hand_values():
    # r_c = 2, r_r = 0: -log sigmoid(2) = log(1 + e^-2) = 0.126928...
    loss = bradley_terry_loss(torch.tensor([2.0]), torch.tensor([0.0]))
    assert loss.item() == pytest.approx(math.log1p(math.exp(-2.0))) == pytest.approx(0.12692801104297263)
    # Equal scores: log 2.  Batch mean: (0.126928 + log 2) / 2.
    assert bradley_terry_loss(torch.tensor([0.5]), torch.tensor([0.5])).item() == pytest.approx(LN2)
    batch = bradley_terry_loss(torch.tensor([2.0, 1.0]), torch.tensor([0.0, 1.0]))
    assert batch.item() == pytest.approx((math.log1p(math.exp(-2.0)) + LN2) / 2)


def test_pointwise_bce_hand_values():
    # logits 0 and ln 3, correct 1 and 0: sigmoid = 1/2 and 3/4.
    # -log(1/2) = ln 2;  -log(1 - 3/4) = ln 4 = 2 ln 2;  mean = 1.5 ln 2 = 1.0397...
    loss = pointwise_bce_loss(torch.tensor([0.0, math.log(3.0)]), torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx(1.5 * LN2)
    # Booleans are accepted as labels; a confident right answer costs log(1 + e^-4) = 0.018149...
    assert pointwise_bce_loss(torch.tensor([4.0]), torch.tensor([True])).item() == pytest.approx(
        math.log1p(math.exp(-4))
    )


def test_pointwise_bce_gradient_is_sigmoid_minus_label():
    # d/dz BCE(sigmoid(z), y) = sigmoid(z) - y, divided by B = 2 for the mean.
    z = torch.tensor([0.0, math.log(3.0)], requires_grad=True)
    pointwise_bce_loss(z, torch.tensor([1.0, 0.0])).backward()
    assert z.grad.tolist() == pytest.approx([(0.5 - 1) / 2, (0.75 - 0) / 2])


@FAST
@given(a=st.floats(-20, 20), b=st.floats(-20, 20))
def test_bradley_terry_swap_changes_loss_by_the_margin(a, b):
    """softplus(-d) - softplus(d) = -d: swapping chosen and rejected adds exactly the margin."""
    ta, tb = torch.tensor([a], dtype=torch.float64), torch.tensor([b], dtype=torch.float64)
    diff = bradley_terry_loss(ta, tb) - bradley_terry_loss(tb, ta)
    assert diff.item() == pytest.approx(-(a - b), abs=1e-9)


def test_bradley_terry_gradient_raises_chosen_lowers_rejected():
    # d/dr_c [-log sigmoid(r_c - r_r)] = -sigmoid(r_r - r_c) = -sigmoid(-2) = -0.119203; d/dr_r = +0.119203
    rc = torch.tensor([2.0], requires_grad=True)
    rr = torch.tensor([0.0], requires_grad=True)
    bradley_terry_loss(rc, rr).backward()
    assert rc.grad.item() == pytest.approx(-1 / (1 + math.exp(2.0)))
    assert rr.grad.item() == pytest.approx(1 / (1 + math.exp(2.0)))


# ---------------------------------------------------------------------------- step BCE


def test_step_bce_hand_computed_with_mask():
    # Real steps: (logit 0, label 1) -> log 2; (2, 0) -> log(1 + e^2); (-1, 0) -> log(1 + e^-1).
    # The masked step (5, label 1) is ignored: mean over 3 steps.
    logits = torch.tensor([[0.0, 2.0], [-1.0, 5.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    loss = step_bce_loss(logits, torch.tensor([[1, 0], [0, 1]]), mask)
    assert loss.item() == pytest.approx((LN2 + SOFTPLUS2 + SOFTPLUS_M1) / 3)  # = 1.044446...
    # Whatever the masked step's label, the loss is the same and its logit gets no gradient.
    other = step_bce_loss(logits, torch.tensor([[1, 0], [0, 0]]), mask)
    assert other.item() == loss.item()
    loss.backward()
    assert logits.grad[1, 1].item() == 0.0
    # Real steps: d/dx = (sigmoid(x) - y) / 3, e.g. (0.5 - 1) / 3 for the first.
    assert logits.grad[0, 0].item() == pytest.approx(-0.5 / 3)


def test_step_bce_soft_labels():
    # BCE with logits = softplus(x) - y x:
    #   (x = 2, y = 0.25):  2.126928 - 0.5 = 1.626928;  (x = -1, y = 0.5): 0.313262 + 0.5 = 0.813262
    logits = torch.tensor([[2.0, -1.0]])
    loss = step_bce_loss(logits, torch.tensor([[0.25, 0.5]]), torch.ones(1, 2, dtype=torch.bool))
    assert loss.item() == pytest.approx((SOFTPLUS2 - 0.5 + SOFTPLUS_M1 + 0.5) / 2)


def test_step_bce_all_masked_is_zero():
    loss = step_bce_loss(torch.tensor([[3.0, -2.0]]), torch.tensor([[1.0, 1.0]]), torch.zeros(1, 2))
    assert loss.item() == 0.0


# ---------------------------------------------------------------------------- AUC, first wrong step


def pairwise_auc(scores, labels) -> float:
    """The definition: P(score of a positive > score of a negative) over all pairs, ties 1/2."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


@pytest.mark.parametrize(
    "scores, labels, expected",
    [
        # negatives 0.1, 0.4; positives 0.35, 0.8: pairs (.35>.1) (.35<.4) (.8>.1) (.8>.4) -> 3/4
        ([0.1, 0.4, 0.35, 0.8], [False, False, True, True], 0.75),
        ([0.1, 0.2], [False, True], 1.0),  # perfect
        ([0.1, 0.2], [True, False], 0.0),  # reversed
        ([0.5, 0.5], [True, False], 0.5),  # a tie counts 1/2
        # positives {2, 3}, negatives {1, 2}: 2>1 (1), 2=2 (1/2), 3>1 (1), 3>2 (1) -> 3.5 / 4
        ([1.0, 2.0, 2.0, 3.0], [False, True, False, True], 0.875),
        # all tied: 1/2 whatever the labels
        ([7.0, 7.0, 7.0], [True, False, False], 0.5),
    ],
)
def test_roc_auc_hand_values(scores, labels, expected):
    assert roc_auc(scores, labels) == pytest.approx(expected)


@pytest.mark.parametrize("labels", [[True, True], [False, False, False], []])
def test_roc_auc_single_class_is_nan(labels):
    assert math.isnan(roc_auc([0.3] * len(labels), labels))


@FAST
@given(
    st.lists(st.tuples(st.integers(-3, 3), st.booleans()), min_size=2, max_size=30).filter(
        lambda xs: 0 < sum(y for _, y in xs) < len(xs)
    )
)
def test_roc_auc_equals_pairwise_definition(pairs):
    """Small integer scores make ties frequent: the average-rank form equals the O(n^2) count."""
    scores = [float(s) for s, _ in pairs]
    labels = [y for _, y in pairs]
    assert roc_auc(scores, labels) == pytest.approx(pairwise_auc(scores, labels))


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], None),
        ([True, True], None),
        ([False], 0),
        ([True, False, True], 1),
        ([True, True, False, False], 2),
    ],
)
def test_first_wrong_step(flags, expected):
    assert first_wrong_step(flags) == expected


# ---------------------------------------------------------------------------- rewards: helpers


def test_invalid_rewards_get_zero_advantage_and_leave_the_group_statistics():
    """A NaN/inf reward gets zero advantage; mean and std come from the valid rewards only."""
    nan, inf = float("nan"), float("inf")
    rewards = torch.tensor(
        [
            [1.0, nan, 0.0, inf],  # valid {1, 0}: mean 0.5, std 0.5 -> +1, -1
            [nan, nan, nan, nan],  # nothing valid: all zero
            [0.2, 0.4, -inf, 0.6],
        ]
    )  # valid mean 0.4, std sqrt(0.08/3)
    adv = outcome_advantages(rewards, torch.isfinite(rewards))
    std = math.sqrt(0.08 / 3)
    torch.testing.assert_close(adv, torch.tensor([[1.0, 0.0, -1.0, 0.0], [0.0] * 4, [-0.2 / std, 0.0, 0.0, 0.2 / std]]))
    # All valid: the same as without a mask.
    clean = torch.tensor([[0.0, 1.0, 1.0]])
    torch.testing.assert_close(
        outcome_advantages(clean, torch.ones_like(clean, dtype=torch.bool)), outcome_advantages(clean)
    )


def test_rollout_step_ends_finished_rows(tok):
    """Finished rows end in EOS, which is never a step end; an empty completion has no step."""
    rollout = group_rollout(tok)
    assert rollout.completion_mask.sum(dim=1).tolist() == [29.0, 18.0, 1.0]  # text + EOS
    ends, mask = rollout_step_ends(tok, rollout, "\n")
    assert ends.tolist() == ENDS
    assert mask.tolist() == MASK
    # The tokens at the step ends are the steps' last characters: "2", "3", "3" and "3", "4".
    ids = rollout.completion_ids
    assert [tok.decode([ids[0, t]]) for t in ENDS[0]] == ["2", "3", "3"]
    assert [tok.decode([ids[1, t]]) for t in ENDS[1][:2]] == ["3", "4"]


def test_rollout_step_ends_truncated_row(tok):
    # No EOS (cut off at max_new_tokens): all 17 tokens are text, "7 + 5 = 12" ends at 9 and the
    # cut "12 - 9" (chars 11..16) at 16, the very last token.
    rollout = group_rollout(tok, ["7 + 5 = 12\n12 - 9"], add_eos=False)
    assert rollout.truncated.tolist() == [True] and rollout.completion_mask.sum().item() == 17
    ends, mask = rollout_step_ends(tok, rollout, "\n")
    assert ends.tolist() == [[9, 16]] and mask.tolist() == [[True, True]]


def test_rollout_step_ends_no_steps_anywhere(tok):
    ends, mask = rollout_step_ends(tok, group_rollout(tok, ["", "\n\n"]), "\n")
    assert ends.shape == mask.shape == (2, 1) and not mask.any()


# ---------------------------------------------------------------------------- RewardScorer


def test_rule_only_scoring_is_the_answer_checker(tok):
    completions = [RIGHT, WRONG, EMPTY, "#### 3.0", "\\boxed{3}"]
    rollout = group_rollout(tok, completions)
    expected = torch.tensor([float(is_correct(c, GOLD)) for c in completions])  # [1, 0, 0, 1, 1]
    assert expected.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    scored = RewardScorer({"rule": 1.0}, "outcome", tok)(rollout, [GOLD] * 5)
    assert torch.equal(scored.outcome, expected) and torch.equal(scored.correct, expected)
    assert torch.equal(rule_reward(completions, [GOLD] * 5), expected)
    assert scored.step_scores is None
    # A weight scales the rule reward; a zero weight on a model needs no model.
    scored2 = RewardScorer({"rule": 2.0, "orm": 0.0}, "outcome", tok)(rollout, [GOLD] * 5)
    assert torch.equal(scored2.outcome, 2 * expected)


@pytest.mark.parametrize("kind", ["orm", "prm"])
def test_scorer_needs_the_models_it_weights(tok, kind):
    with pytest.raises(ValueError, match=kind):
        RewardScorer({"rule": 1.0, kind: 0.5}, "outcome", tok)


def direct_step_probs(prm, rollout) -> torch.Tensor:
    """[B, K] sigmoid of the PRM read at the hand-computed step ends (no rollout_step_ends)."""
    with torch.no_grad():
        return torch.sigmoid(rm.prm_step_logits(prm, rollout, torch.tensor(ENDS)))


def test_outcome_with_prm_is_lowest_step_probability(tok, reward_models):
    _, prm = reward_models
    rollout = group_rollout(tok)
    p = direct_step_probs(prm, rollout)
    scored = RewardScorer({"rule": 1.0, "prm": 0.5}, "outcome", tok, prm=prm)(rollout, [GOLD] * 3)
    # rule [1, 0, 0] + 0.5 * min over real steps; the empty completion has no PRM verdict: NaN.
    torch.testing.assert_close(scored.outcome[:2], torch.stack([1 + 0.5 * p[0].min(), 0.5 * p[1, :2].min()]))
    assert math.isnan(scored.outcome[2].item())
    assert scored.step_scores is None
    assert scored.stats["reward/no_step_completions"] == 1.0
    assert scored.stats["reward/steps_per_completion"] == pytest.approx(5 / 3)  # (3 + 2 + 0) / 3
    # The learned reward logged beside the checker's accuracy: the mean lowest step of those with one.
    assert scored.stats["reward/prm_lowest_mean"] == pytest.approx(float((p[0].min() + p[1, :2].min()) / 2))
    # The NaN is neutralised downstream: the empty completion gets zero advantage, and is counted.
    adv = rollout_advantages(scored, 1, 3, rollout.completion_mask.shape[1])
    assert scored.stats["reward/nonfinite_completions"] == 1.0
    assert adv[2].abs().max().item() < 1e-6 and (adv[0] > 0).all()  # at the group mean (float32)


def test_process_supervision_step_rewards(tok, reward_models):
    _, prm = reward_models
    rollout = group_rollout(tok)
    p = direct_step_probs(prm, rollout)
    scored = RewardScorer({"rule": 1.0, "prm": 0.5}, "process", tok, prm=prm)(rollout, [GOLD] * 3)
    # The last step's advantage region runs to the last token (EOS): stopping is rewarded too.
    last_tokens = rollout.completion_mask.sum(1).long() - 1
    expected_ends = [row[:] for row in ENDS]
    for i, n in enumerate(MASK):
        if any(n):
            expected_ends[i][sum(n) - 1] = int(last_tokens[i])
    assert scored.step_ends.tolist() == expected_ends and scored.step_mask.tolist() == MASK
    # The PRM's step probabilities beside the outcome sources' reward (the rule: 1, 0, 0).
    torch.testing.assert_close(scored.step_scores[0], p[0])
    torch.testing.assert_close(scored.step_scores[1, :2], p[1, :2])
    assert scored.step_scores[1, 2].isnan() and scored.step_scores[2].isnan().all()  # padding, no step
    assert scored.base.tolist() == [1.0, 0.0, 0.0] and scored.prm_weight == 0.5 and scored.by_checker
    # The paper's step rewards: 0.5 * P(step k right), the rule reward added to each last step.
    r = paper_step_rewards(scored)
    torch.testing.assert_close(r[0], 0.5 * p[0] + torch.tensor([0.0, 0.0, 1.0]))
    torch.testing.assert_close(r[1, :2], 0.5 * p[1, :2])
    # The solution's reward, as under outcome supervision: the rule plus 0.5 x the lowest step.
    torch.testing.assert_close(scored.outcome[:2], torch.stack([1 + 0.5 * p[0].min(), 0.5 * p[1, :2].min()]))
    assert scored.supervision == "process" and scored.outcome[2].isnan()
    assert scored.stats["reward/nonfinite_completions"] == 0.0  # padding NaN is not a non-finite score
    # Advantages: the empty completion (no step) gets zero on every token, the others do not.
    t = rollout.completion_mask.shape[1]
    adv = process_advantages(r.view(1, 3, 3), scored.step_ends.view(1, 3, 3), scored.step_mask.view(1, 3, 3), t)[0]
    assert torch.equal(adv[2], torch.zeros(t))
    assert adv[0, 0] != 0 and adv[1, 0] != 0
    # GRPO's own path gives the same advantages under the paper's credit.
    torch.testing.assert_close(rollout_advantages(scored, 1, 3, t, "sum"), adv)
    # The default (centred): the checker's z-score over the completions with a step (+1, -1; the
    # step-less one takes no part, as under the paper's form) plus 0.5 x the step probability
    # centred within the checker's class: each class has one completion, so nothing to add.
    centred = rollout_advantages(scored, 1, 3, t)
    assert torch.equal(centred[2], torch.zeros(t))
    torch.testing.assert_close(centred[0], torch.ones(t))
    torch.testing.assert_close(centred[1, : int(last_tokens[1]) + 1], -torch.ones(int(last_tokens[1]) + 1))


def test_nan_orm_score_gets_zero_advantage_and_is_counted(tok, reward_models, monkeypatch):
    orm, _ = reward_models
    real = rm.orm_logits

    def orm_with_nan(model, rollout):
        out = real(model, rollout).clone()
        out[1] = float("nan")
        return out

    monkeypatch.setattr(rm, "orm_logits", orm_with_nan)
    rollout = group_rollout(tok)
    scored = RewardScorer({"rule": 1.0, "orm": 1.0}, "outcome", tok, orm=orm)(rollout, [GOLD] * 3)
    with torch.no_grad():
        s = torch.sigmoid(real(orm, rollout))
    assert math.isnan(scored.outcome[1].item())
    torch.testing.assert_close(scored.outcome[[0, 2]], torch.stack([1 + s[0], s[2]]))
    assert scored.stats["reward/orm_mean"] == pytest.approx(float((s[0] + s[2]) / 2))  # finite ones only
    t = rollout.completion_mask.shape[1]
    adv = rollout_advantages(scored, 1, 3, t)
    assert scored.stats["reward/nonfinite_completions"] == 1.0
    assert adv.shape == (3, t) and torch.isfinite(adv).all()
    assert adv[1].abs().max().item() == 0.0  # the NaN sample: no advantage
    # The others are z-scored between themselves: +1 and -1 for two distinct rewards.
    torch.testing.assert_close(adv[[0, 2], 0], torch.tensor([1.0, -1.0]))


def test_orm_reads_the_last_real_token(tok, reward_models):
    """orm_logits = the score head at the EOS of a finished row (not at the right padding)."""
    orm, _ = reward_models
    rollout = group_rollout(tok)
    with torch.no_grad():
        per_token = rm.token_scores(orm, rollout)
        out = rm.orm_logits(orm, rollout)
    # EOS tokens at 28, 17 and 0 (text lengths 28, 17, 0)
    torch.testing.assert_close(out, per_token[[0, 1, 2], [28, 17, 0]])


# ---------------------------------------------------------------------------- PRM training batch


def step_row(steps, labels, soft):
    return {"prompt": PROMPT, "completions": steps, "labels": labels, "soft_labels": soft}


def test_step_batch_ends_point_at_last_characters(tok):
    rows = [
        step_row(["7 + 5 = 12", "12 - 9 = 3", "#### 3"], [True, True, True], [1.0, 0.75, 1.0]),
        step_row(["7 + 5 = 13", "#### 4"], [False, False], [0.25, 0.0]),
    ]
    rollout, ends, labels, mask = step_batch(tok, rows, "\n", "hard")
    assert rollout.texts == [RIGHT, WRONG]
    assert ends.tolist() == ENDS[:2] and mask.tolist() == MASK[:2]
    assert labels.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    for i, row in enumerate(rows):  # the token at each end decodes to the step's last character
        assert [tok.decode([rollout.completion_ids[i, t]]) for t in ends[i, : len(row["completions"])]] == [
            s[-1] for s in row["completions"]
        ]
    _, _, soft, _ = step_batch(tok, rows, "\n", "soft")
    assert soft.tolist() == [[1.0, 0.75, 1.0], [0.25, 0.0, 0.0]]


def test_step_batch_double_newline_separator(tok):
    # "7 + 5 = 12\n\n12 - 9 = 3\n\n#### 3": steps at chars 0..9, 12..21, 24..29.
    rows = [step_row(["7 + 5 = 12", "12 - 9 = 3", "#### 3"], [True] * 3, [1.0] * 3)]
    rollout, ends, _, mask = step_batch(tok, rows, "\n\n", "hard")
    assert rollout.texts == ["7 + 5 = 12\n\n12 - 9 = 3\n\n#### 3"]
    assert ends.tolist() == [[9, 21, 29]] and mask.all()


def test_step_bce_padding_with_nan_labels_has_finite_gradients():
    """Masked steps contribute nothing to the loss *and* to the gradient, whatever their label."""
    logits = torch.tensor([[0.0, 1.0]], requires_grad=True)
    loss = step_bce_loss(logits, torch.tensor([[1.0, float("nan")]]), torch.tensor([[True, False]]))
    loss.backward()
    assert loss.item() == pytest.approx(math.log(2))  # BCE(0, 1) = log(1 + e^0)
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 1] == 0


def test_process_nonfinite_step_drops_the_whole_completion(tok, reward_models, monkeypatch):
    """A NaN PRM score on one step: that completion gets zero advantage on every token, counted."""
    _, prm = reward_models
    real = rm.prm_step_logits

    def prm_with_nan(model, rollout, ends):
        out = real(model, rollout, ends).clone()
        out[0, 1] = float("nan")
        return out

    monkeypatch.setattr(rm, "prm_step_logits", prm_with_nan)
    rollout = group_rollout(tok)
    scored = RewardScorer({"prm": 1.0}, "process", tok, prm=prm)(rollout, [GOLD] * 3)
    assert scored.stats["reward/nonfinite_completions"] == 1.0
    assert not scored.step_mask[0].any()
    # Under the paper's credit the one completion left still has steps with spread; under the
    # centred form it has no other completion to be compared with: zero too.
    for credit in ("sum", "centred"):
        adv = rollout_advantages(scored, 1, 3, rollout.completion_mask.shape[1], credit)
        assert torch.equal(adv[0], torch.zeros_like(adv[0]))
    assert rollout_advantages(scored, 1, 3, rollout.completion_mask.shape[1], "sum")[1].abs().sum() > 0


@pytest.mark.parametrize("supervision", ["outcome", "process"])
def test_repeated_completions_are_scored_once_and_alike(tok, reward_models, supervision, monkeypatch):
    """A group that repeats its solutions is read once per distinct solution: the reward models see
    the distinct rows only, and every row gets what scoring it alone gives."""
    orm, prm = reward_models
    seen = []
    real = rm.token_scores
    monkeypatch.setattr(
        rm, "token_scores", lambda model, rollout: seen.append(len(rollout.texts)) or real(model, rollout)
    )
    rows = [RIGHT, WRONG, RIGHT, RIGHT, WRONG, EMPTY]
    scorer = RewardScorer({"rule": 1.0, "orm": 0.5, "prm": 1.0}, supervision, tok, orm=orm, prm=prm)
    together = scorer(group_rollout(tok, rows), [GOLD] * 6)
    assert seen == [3, 3]  # ORM and PRM, 3 distinct solutions each
    for i, text in enumerate(rows):
        alone = scorer(group_rollout(tok, [text]), [GOLD])
        torch.testing.assert_close(together.outcome[i : i + 1], alone.outcome, equal_nan=True)
        if supervision == "process":
            k = alone.step_mask.shape[1]
            torch.testing.assert_close(together.step_scores[i : i + 1, :k], alone.step_scores, equal_nan=True)
            assert together.step_mask[i : i + 1, :k].tolist() == alone.step_mask.tolist()


def test_oracle_prm_scores_each_step_by_the_exact_checker_through_repeated_rows(tok):
    """``grpo.prm_oracle``: step k scores 1 while every line so far is the reference chain's. RIGHT
    (7 + 5 = 12, 12 - 9 = 3, #### 3) scores [1, 1, 1]; a miscopied second step [1, 0, 0]; WRONG
    (7 + 5 = 13, #### 4) [0, 0]; a repeated row gets its first occurrence's scores; no learned model."""
    from grpo_core.rewards.scorer import ORACLE

    slip = "7 + 5 = 12\n12 - 8 = 4\n#### 4"
    rows = [RIGHT, WRONG, RIGHT, slip, EMPTY]
    scored = RewardScorer({"rule": 1.0, "prm": 1.0}, "process", tok, prm=ORACLE)(
        group_rollout(tok, rows), [GOLD] * 5, [QUESTION] * 5
    )
    steps = [scored.step_scores[i, : int(scored.step_mask[i].sum())].tolist() for i in range(5)]
    assert steps == [[1.0, 1.0, 1.0], [0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], []]
    assert "prm" not in scored.learned  # the oracle is no learned model: no staleness is measured on it
    with pytest.raises(ValueError, match="questions"):
        RewardScorer({"prm": 1.0}, "process", tok, prm=ORACLE)(group_rollout(tok, rows), [GOLD] * 5)
