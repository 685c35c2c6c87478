"""What a stage leaves behind for the next: its ``manifest.json`` (written last: its presence means
the stage finished) and references to the folders it wrote, with their digests. A manifest records
where it was written, so a moved or copied run reads its paths where they are now."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict


class Ref(BaseModel):
    """A folder another stage wrote (a model, a dataset), with the digest of its contents (a stage's
    typed output gives its own: ``outputs.ModelOutput.ref``, ``FolderOutput.ref``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str
    digest: str


def read_manifest(path: Path) -> dict[str, Any]:
    """A manifest, with its paths where its folder is now (``relocated``), or a ValueError naming
    the file when it is not a JSON object (damaged, cut short)."""
    try:
        manifest = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable manifest ({e}); the command that wrote it writes it again") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: not a readable manifest (a JSON {type(manifest).__name__}, not an object)")
    return relocated(manifest, Path(path).parent)


def write_manifest(out_dir: Path, manifest: dict[str, Any], run_folder: Path | None = None) -> dict[str, Any]:
    """Write ``manifest.json`` last, atomically: its presence means the stage finished. It records
    the folder it was written in (``written_in``) and the run folder it belongs to (``run_folder``,
    default: its own folder), so that a copied or moved run reads its paths where they are now."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = manifest | {
        "written_in": str(out_dir.resolve()),
        "run_folder": str(Path(run_folder or out_dir).resolve()),
    }
    tmp = out_dir / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, out_dir / "manifest.json")
    return manifest


def relocated(manifest: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``manifest`` as if written in ``folder``: where it was written elsewhere (its ``written_in``; a
    copied or moved project or run folder), the paths under its run folder move with it
    (``/a/runs/demo/sft/model`` to ``/b/runs/demo/sft/model`` for ``sft/manifest.json`` now under
    ``/b/runs/demo``); every other path is left as it is. A manifest found at another place within
    its run than the one it was written at moves its own folder's paths only."""
    was, now = manifest.get("written_in"), Path(folder).resolve()
    if was is None or Path(was) == now:  # (written before manifests said where, or not moved)
        return manifest
    root = Path(manifest.get("run_folder") or was)
    within = Path(was).relative_to(root).parts if Path(was).is_relative_to(root) else None
    if within is None or now.parts[len(now.parts) - len(within) :] != within:
        root, within = Path(was), ()
    new_root = Path(*now.parts[: len(now.parts) - len(within)])
    return moved(manifest, str(root), str(new_root)) | {"written_in": str(now), "run_folder": str(new_root)}


def moved(value: Any, old: str, new: str) -> Any:
    """``value`` (JSON: strings, lists, dicts) with each path at or under the folder ``old`` put
    under ``new`` instead; other strings as they are."""
    if isinstance(value, str) and (value == old or value.startswith(old.rstrip("/") + "/")):
        return new + value[len(old) :]
    if isinstance(value, dict):
        return {k: moved(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [moved(v, old, new) for v in value]
    return value
