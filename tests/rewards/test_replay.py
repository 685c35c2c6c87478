"""The replay buffer of iterative RL: the retraining set's replay share, where replayed rows come from,
reproducibility, and versions on disk."""

from __future__ import annotations

import pytest

from grpo_core.rewards.replay import (
    ORIGIN,
    draw_replay,
    load_version,
    replay_size,
    retraining_set,
    tag_rows,
    write_version,
)


def _rows(n: int, round_: int, kind: str = "p") -> list[dict]:
    return tag_rows([{"prompt": f"{kind}{round_}-{i}"} for i in range(n)], round_)


@pytest.mark.parametrize(
    "n_fresh, fraction, expected",
    [
        (90, 0.1, 10),  # 10 / (90 + 10) = 10%
        (900, 0.1, 100),
        (100, 0.1, 11),  # 100 * 0.1 / 0.9 = 11.1 -> 11; 11 / 111 = 9.9%
        (50, 0.5, 50),
        (7, 0.0, 0),
        (0, 0.1, 0),
    ],
)
def test_replay_size_makes_the_fraction_of_the_set(n_fresh, fraction, expected):
    assert replay_size(n_fresh, fraction) == expected


def test_replay_size_rejects_a_fraction_of_one():
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        replay_size(10, 1.0)


@pytest.mark.parametrize("n_fresh", [90, 100, 250, 1000, 1234])
def test_replay_share_equals_the_configured_fraction(n_fresh):
    history = _rows(3000, 1) + _rows(3000, 2)
    rows, stats = retraining_set(_rows(n_fresh, 3), history, 0.1, seed=0, round_=3)
    assert len(rows) == n_fresh + stats["replay"]
    # Within the rounding of one row.
    assert abs(stats["share"] - 0.1) <= 1 / len(rows)
    assert sum(r[ORIGIN] != 3 for r in rows) == stats["replay"]


def test_round_one_has_no_replay():
    rows, stats = retraining_set(_rows(90, 1), [], 0.1, seed=0, round_=1)
    assert stats["replay"] == 0 and stats["share"] == 0.0 and stats["by_round"] == {}
    assert rows == _rows(90, 1)


def test_replay_comes_only_from_earlier_rounds():
    history = _rows(500, 1) + _rows(500, 2)
    rows, stats = retraining_set(_rows(450, 3), history, 0.1, seed=0, round_=3)
    assert set(stats["by_round"]) <= {1, 2} and sum(stats["by_round"].values()) == 50
    assert all(r in history for r in rows[450:])
    with pytest.raises(ValueError, match=r"rows of rounds \[3\]"):
        retraining_set(_rows(10, 3), history + _rows(5, 3), 0.1, seed=0, round_=3)


def test_replay_is_reproducible_and_differs_by_round_and_seed():
    history = _rows(1000, 1)
    first = draw_replay(history, 50, seed=0, round_=2)
    assert first == draw_replay(list(history), 50, seed=0, round_=2)
    assert first != draw_replay(history, 50, seed=0, round_=3)
    assert first != draw_replay(history, 50, seed=1, round_=2)
    assert len({r["prompt"] for r in first}) == 50  # without replacement


def test_a_short_history_is_replayed_whole_and_the_shortfall_reported():
    rows, stats = retraining_set(_rows(900, 2), _rows(40, 1), 0.1, seed=0, round_=2)
    assert stats["replay_wanted"] == 100 and stats["replay"] == 40
    assert stats["share"] == pytest.approx(40 / 940)


COLUMNS = {"pairs": ("prompt",), "steps": ("prompt",)}


def test_versions_accumulate_rounds_and_are_never_changed(tmp_path):
    v1 = write_version(None, {"pairs": _rows(3, 1, "o"), "steps": _rows(2, 1, "s")}, 1, tmp_path / "v1", COLUMNS)
    assert v1 == {"pairs": {"rows": 3, "by_round": {1: 3}}, "steps": {"rows": 2, "by_round": {1: 2}}}
    # Fresh rows arrive untagged from the reward-data stage; the version tags them.
    fresh = {"pairs": [{"prompt": "o2-0"}], "steps": []}
    v2 = write_version(tmp_path / "v1", fresh, 2, tmp_path / "v2", COLUMNS)
    assert v2["pairs"] == {"rows": 4, "by_round": {1: 3, 2: 1}}
    assert v2["steps"] == {"rows": 2, "by_round": {1: 2}}
    assert load_version(tmp_path / "v2", "pairs")[-1] == {"prompt": "o2-0", ORIGIN: 2}
    assert len(load_version(tmp_path / "v1", "pairs")) == 3  # version 1 untouched
    assert not (tmp_path / "v2.tmp").exists()
    empty = write_version(None, {}, 1, tmp_path / "e1", COLUMNS)
    assert empty["pairs"]["rows"] == 0 and load_version(tmp_path / "e1", "steps") == []
    assert load_version(None, "pairs") == []
    # A version written before the pairs were named so (``outcome``) is refused, naming the folder, not
    # read as a version without pairs (which would train the next reward model with no replay).
    (tmp_path / "v1" / "pairs").rename(tmp_path / "v1" / "outcome")
    with pytest.raises(ValueError, match="outcome: a replay buffer version of an older layout"):
        load_version(tmp_path / "v1", "pairs")
