"""The reward models' replay buffer for iterative RL (DeepSeekMath §4.2: "continue training the
reward model with a replay mechanism that incorporates 10% of historical data").

No framework ships this, so it is ours. The buffer is versioned on disk: version ``k`` is a Hugging
Face dataset per kind (``pairs``, ``steps`` rows, checked ``solutions``) holding the training rows of rounds
1..k, each tagged with ``origin_round``. Round k retrains on its fresh rows plus a sample of
version k-1, drawn reproducibly from (seed, round). A version is written to a temporary folder and
renamed, and never changed afterwards, so a crashed round loses nothing already in the buffer.
"""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

ORIGIN = "origin_round"


def replay_size(n_fresh: int, fraction: float) -> int:
    """How many historical rows make ``fraction`` of a retraining set with ``n_fresh`` new rows:
    n / (n_fresh + n) = fraction, so n = n_fresh * fraction / (1 - fraction), rounded."""
    if not 0 <= fraction < 1:
        raise ValueError(f"replay fraction must be in [0, 1), got {fraction}")
    return round(n_fresh * fraction / (1 - fraction))


def draw_replay(history: list[dict], n: int, seed: int, round_: int) -> list[dict]:
    """``n`` rows of ``history`` drawn uniformly without replacement, the same for the same
    (seed, round); all of it when it holds fewer than ``n`` rows. Keeps history's order."""
    if n >= len(history):
        return list(history)
    rng = random.Random(f"replay-{seed}-{round_}")  # a str seed is hashed with sha512: stable across runs
    return [history[i] for i in sorted(rng.sample(range(len(history)), n))]


def retraining_set(
    fresh: list[dict], history: list[dict], fraction: float, seed: int, round_: int
) -> tuple[list[dict], dict[str, Any]]:
    """Round ``round_``'s training rows (fresh, then the replay sample) and what they are made of.

    ``history`` must come only from rounds before ``round_`` (checked: a row of this round or a
    later one in it is a bug upstream). Stats: fresh / replay / wanted counts, the replay's share
    of the set, and rows per round of origin.
    """
    late = sorted({r[ORIGIN] for r in history if r[ORIGIN] >= round_})
    if late:
        raise ValueError(
            f"round {round_}: the replay history holds rows of rounds {late}; only earlier rounds may be replayed"
        )
    wanted = replay_size(len(fresh), fraction) if history else 0
    replay = draw_replay(history, wanted, seed, round_)
    by_round = Counter(r[ORIGIN] for r in replay)
    stats = {
        "fresh": len(fresh),
        "replay": len(replay),
        "replay_wanted": wanted,
        "share": len(replay) / max(1, len(fresh) + len(replay)),
        "by_round": {int(k): by_round[k] for k in sorted(by_round)},
    }
    return fresh + replay, stats


def tag_rows(rows: list[dict], round_: int) -> list[dict]:
    """Rows tagged with their round of origin: ``round_``, unless a row already names an earlier one
    (GRPO's rollouts of round k enter round k+1's reward data as samples of round k)."""
    return [{**r, ORIGIN: r.get(ORIGIN) or round_} for r in rows]


def load_version(version_dir: str | Path | None, kind: str) -> list[dict]:
    """The rows of one kind in a buffer version (none for ``None``: round 1 has no history)."""
    if version_dir is None:
        return []
    path = Path(version_dir) / kind
    if kind == "pairs" and not path.exists() and (Path(version_dir) / "outcome").exists():
        raise ValueError(
            f"{Path(version_dir) / 'outcome'}: a replay buffer version of an older layout, whose "
            f"pairs this version reads as {path}: rename the folder, or start the rounds again"
        )
    if not path.exists():  # a version older than the kind
        return []
    from datasets import load_from_disk

    return load_from_disk(str(path)).to_list()


def write_version(
    previous: str | Path | None,
    fresh: dict[str, list[dict]],
    round_: int,
    out_dir: Path,
    columns: dict[str, tuple[str, ...]],
) -> dict[str, Any]:
    """Version ``round_`` = ``previous`` + this round's ``fresh`` training rows (tagged), written to a
        temporary folder and renamed into ``out_dir``: one dataset per kind of ``columns`` (its column
    names, for an empty one). Returns rows per kind and per round of origin."""
    from datasets import Dataset

    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    summary: dict[str, Any] = {}
    for kind in columns:
        rows = load_version(previous, kind) + tag_rows(fresh.get(kind, []), round_)
        data = Dataset.from_list(rows) if rows else Dataset.from_dict({c: [] for c in (*columns[kind], ORIGIN)})
        data.save_to_disk(str(tmp / kind), num_shards=1)  # datasets cannot reload an empty dataset saved in 0 shards
        origin = Counter(r[ORIGIN] for r in rows)
        summary[kind] = {"rows": len(rows), "by_round": {int(k): origin[k] for k in sorted(origin)}}
    for kind in columns:  # fsync the data before the rename makes the version visible
        for f in (tmp / kind).glob("*.arrow"):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return summary
