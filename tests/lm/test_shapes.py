"""What ``check`` reads of a model without torch (grpo_core.lm.shapes): a folder it can tell is
loadable from its files alone, and the folders it leaves to the full check through transformers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_saved_causal_lm_is_told_loadable_and_a_broken_one_is_left_to_the_full_check(tmp_path, tiny_model_dir):
    from grpo_core.lm.shapes import looks_loadable

    assert looks_loadable(tiny_model_dir)
    for name, damage in (
        ("tokenizer", lambda d: (d / "tokenizer.json").write_text("{not json")),
        ("config", lambda d: (d / "config.json").unlink()),
        (
            "classifier",
            lambda d: (d / "config.json").write_text(
                json.dumps(
                    json.loads((d / "config.json").read_text()) | {"architectures": ["LlamaForTokenClassification"]}
                )
            ),
        ),
    ):
        folder = Path(shutil.copytree(tiny_model_dir, tmp_path / name))
        damage(folder)
        assert not looks_loadable(folder), name
    assert not looks_loadable(tmp_path / "missing")


def test_check_of_a_recipe_on_a_model_folder_imports_neither_torch_nor_transformers(tmp_path, tiny_model_dir):
    script = (
        "import sys; from flows.cli import main\n"
        "try:\n    main(sys.argv[1:])\nfinally:\n"
        "    print('imported', 'torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            "check",
            str(ROOT / "configs" / "minute.yaml"),
            "--set",
            "model.init=pretrained",
            "--set",
            f"model.path={tiny_model_dir}",
            "--set",
            f"output_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"ok": true' in done.stdout and "imported False False" in done.stderr
