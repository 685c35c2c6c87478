#!/usr/bin/env bash
# Scripted check of prefect.yaml against a local Prefect server, as a user would do it:
# `prefect server start` (127.0.0.1), a process work pool, `prefect deploy --all`, a worker, then
# `prefect deployment run` of the pipeline on a tiny recipe and of `rl-rounds` with `-p rounds=2`.
# Everything lives in a temporary folder (Prefect home, MLflow database, runs). Prints one JSON line;
# exits non-zero if any step fails. About two minutes on 2 cores.
#   bash checks/check_deployments.sh            (PORT=4299 by default; configs/minute.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BIN="$ROOT/.venv/bin"
PORT=${PORT:-4299}
WORK=$(mktemp -d)
export PREFECT_HOME="$WORK/prefect" PREFECT_API_URL="http://127.0.0.1:$PORT/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_TRACKING_URI="sqlite:///$WORK/mlflow.db"
export PREFECT_LOGGING_LEVEL=WARNING
pids=()
cleanup() {
  # Each background process leads its own session (setsid): its children (flow runs) go with it.
  # The worker shuts down gracefully and retries a server that is gone: a few seconds, then KILL.
  for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done
  sleep 3
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "check_deployments: $1 (logs in $WORK; KEEP=1 keeps them)" >&2; KEEP=1; tail -30 "$WORK"/*.log >&2 || true; exit 1; }

setsid "$BIN/prefect" server start --host 127.0.0.1 --port "$PORT" > "$WORK/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 120); do
  kill -0 "${pids[0]}" 2>/dev/null || fail "the Prefect server exited (port $PORT in use?)"
  "$BIN/python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/api/health', timeout=2)" \
    2>/dev/null && break
  sleep 1
done
"$BIN/python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/api/health', timeout=2)" \
  || fail "the Prefect server did not start"

"$BIN/prefect" work-pool create local --type process > "$WORK/pool.log" 2>&1 || fail "work-pool create"
"$BIN/prefect" --no-prompt deploy --all > "$WORK/deploy.log" 2>&1 || fail "prefect deploy --all"
setsid "$BIN/prefect" worker start --pool local > "$WORK/worker.log" 2>&1 &
pids+=($!)

# The shipped one-minute recipe (docs/prefect.md's first run), its runs in the temporary folder.
"$BIN/prefect" deployment run recipe/demo -p recipe=configs/minute.yaml -p "overrides=[\"output_dir=$WORK/runs\"]" \
  --watch --watch-timeout 600 \
  > "$WORK/run-pipeline.log" 2>&1 || fail "deployment run recipe/demo"
"$BIN/prefect" deployment run rl-rounds/demo-rounds -p run_dir="\"$WORK/runs/minute\"" -p rounds=2 \
  --watch --watch-timeout 600 > "$WORK/run-rounds.log" 2>&1 || fail "deployment run rl-rounds/demo-rounds"
# A parameter the flow's signature rejects is refused when the run is created.
if "$BIN/prefect" deployment run rl-rounds/demo-rounds -p run_dir="\"$WORK/runs/minute\"" -p rounds=0 \
    > "$WORK/run-invalid.log" 2>&1; then
  fail "rounds=0 was accepted"
fi

"$BIN/python" - "$WORK/runs/minute/manifest.json" <<'PY' || fail "the run's manifest is not what the runs should give"
import json, sys
m = json.load(open(sys.argv[1]))
rounds = [r["round"] for r in m["rounds"]]
assert rounds == [1, 2, 3], rounds
assert sorted(m["rounds"][0]["cached_stages"]) == ["eval", "grpo"], m["rounds"][0]["cached_stages"]
print(json.dumps({"check": "prefect deployments", "ok": True, "rounds": rounds,
                  "champion": m["champion"], "invalid_rounds_refused": True}))
PY
