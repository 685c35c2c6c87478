"""Bit-for-bit results on every CPU: the math libraries' settings (``grpo_core.env.NUMERICS``) are in
effect in this process and in every process the pipeline starts for a stage, a user's own setting
wins, and the manifests say which was used. Without them MKL picks kernels by memory alignment, and
a resumed run drifts from a straight one in the last bits (seen on an AMD EPYC)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_core.env import DEFAULTED, apply_numerics, numerics_settings
from grpo_core.lm.runtime import alignment_mismatches, mkl_mode

ROOT = Path(__file__).resolve().parents[2]
needs_mkl = pytest.mark.skipif(mkl_mode() is None, reason="this torch build has no MKL (its mode cannot be read)")


def test_moved_inputs_give_the_same_bits():
    """Linear layers, causal attention and log-softmax on inputs at other addresses: the same bits.
    Without the setting, 8 linear and 16 attention results of 180 each differed on AMD EPYC
    (2026-11-24); where MKL's kernels do not depend on alignment, this holds either way."""
    assert alignment_mismatches(trials=60) == {"linear": 0, "causal_attention": 0, "log_softmax": 0}


def test_the_project_sets_what_the_user_has_not_and_says_who_set_what(monkeypatch):
    monkeypatch.delenv("MKL_CBWR", raising=False)
    monkeypatch.delenv(DEFAULTED, raising=False)
    apply_numerics()
    assert numerics_settings()["MKL_CBWR"] == {"value": "AUTO", "set_by": "project"}
    apply_numerics()  # again (every entry point applies it): still the project's
    assert numerics_settings()["MKL_CBWR"] == {"value": "AUTO", "set_by": "project"}
    for mine in ("COMPATIBLE", ""):  # another mode, or off (an empty value)
        monkeypatch.setenv("MKL_CBWR", mine)
        apply_numerics()
        assert os.environ["MKL_CBWR"] == mine
        assert numerics_settings()["MKL_CBWR"] == {"value": mine, "set_by": "user"}


@needs_mkl
@pytest.mark.parametrize("user", [None, "COMPATIBLE"])
def test_a_stage_process_computes_in_the_projects_mode_or_the_users(
    user, tiny_cfg, tiny_data_dir, tmp_path, monkeypatch
):
    """A stage started as the pipeline starts one (its own process, ``python -m grpo_core.stages``),
    from an environment without the setting: it applies it itself; with the user's: it keeps it.
    The stage's manifest reports the mode MKL itself says it computes in."""
    from grpo_core.stages.inputs import Ref, SFTInputs
    from tasks.launch import run_launched

    monkeypatch.delenv(DEFAULTED, raising=False)
    if user is None:
        monkeypatch.delenv("MKL_CBWR", raising=False)
    else:
        monkeypatch.setenv("MKL_CBWR", user)
    cfg = tiny_cfg(tmp_path, "launch.own_process=true", sft__max_steps=1, sft__eval_every=1)
    manifest = run_launched(
        "sft", cfg, str(tmp_path / "sft"), SFTInputs(data=Ref(path=str(tiny_data_dir), digest="-")), uri="", run_id=""
    )
    numerics = manifest["numerics"]
    assert numerics["mkl_mode"] == (user or "AUTO")
    assert numerics["settings"]["MKL_CBWR"] == {"value": user or "AUTO", "set_by": "user" if user else "project"}
    assert numerics["cpu_capability"] and numerics["cpu"]


@needs_mkl
def test_torch_computing_before_grpo_core_is_imported_is_a_warning():
    """MKL fixes its mode at its first call: a script that computes before importing grpo_core gets
    MKL's default, and is told so."""
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", DEFAULTED)}
    script = (
        "import torch; torch.ones(4, 4) @ torch.ones(4, 4)\n"
        "from grpo_core.lm.runtime import numerics; print(numerics()['mkl_mode'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["OFF"]
    assert "MKL computes in mode OFF but MKL_CBWR is 'AUTO'" in done.stderr
