#!/usr/bin/env bash
# One device call of the GPU run (`make gpu-pack` prints them; docs/gpu.md):
#   bash experiments/gpu_call.sh stash .gpu/call-K          leave this call's part of the pack in /tmp
#   bash experiments/gpu_call.sh run .gpu/call-N [ARGS...]  join every part, check the md5, install the wheels,
#                                                           convert SmolLM2, run experiments/gpu_run.py ARGS into $OUT
# Runs on the device's python3 (torch with CUDA), where no package index is reachable.
set -uo pipefail
mode=$1 part=$2
shift 2
stash=/tmp/gpu-pack
mkdir -p "$stash" && cp "$part"/* "$stash"/ || exit 1
if [ "$mode" = stash ]; then ls -l "$stash"; exit 0; fi

out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
log="$out/run.log"
{
  echo "[gpu_call] $(date -u +%FT%TZ) parts: $(ls "$stash" | tr '\n' ' ')"
  # The parts in their order (pack.tar.1, .2, ...), then the md5 of the whole.
  ls "$stash"/pack.tar.* | sort -t. -k3 -n | xargs cat > /tmp/pack.tar || exit 1
  (cd /tmp && md5sum -c "$stash/pack.md5") || { echo "[gpu_call] md5 differs: a part is missing or damaged"; exit 1; }
  mkdir -p /tmp/wheels && tar -xf /tmp/pack.tar -C /tmp/wheels || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    /tmp/wheels/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  t0=$(date +%s)
  python3 -m grpo_core.lm.convert --out /tmp/smollm2 || exit 1
  echo "[gpu_call] converted SmolLM2 in $(( $(date +%s) - t0 )) s"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 experiments/gpu_run.py --model /tmp/smollm2 --out "$out" --work /tmp/gpu-work "$@"
} 2>&1 | tee "$log"
