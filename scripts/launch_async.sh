#!/usr/bin/env bash
# The seed article's two-step launch: start the gateway (port 9000, the router config), wait until
# it answers, then start the asynchronous training run; the gateway is stopped when the run ends.
#
#   scripts/launch_async.sh [--set key=value ...]    # extra arguments go to the training run
#
# configs/agent_async_train.yaml is the article's file as written; its header lists the --sets
# that make it a run this machine can do (no model or dataset is in it).
#   PYTHON=.venv/bin/python scripts/launch_async.sh  # the interpreter that has areal
#
# AREAL_ADMIN_TOKEN (the gateway's session and engine APIs) is generated when it is not set;
# GATEWAY_WAIT_S (default 60) is how long to wait for the gateway.
set -euo pipefail

PYTHON="${PYTHON:-python}"
GATEWAY_URL="http://127.0.0.1:9000/gateway/v1/models"
GATEWAY_WAIT_S="${GATEWAY_WAIT_S:-60}"
cd "$(dirname "$0")/.."  # the paths below are the repository's

if [[ -z "${AREAL_ADMIN_TOKEN:-}" ]]; then
  AREAL_ADMIN_TOKEN="$("$PYTHON" -c 'import secrets;print(secrets.token_hex(16))')"
fi
export AREAL_ADMIN_TOKEN

# Step 1: the gateway.
"$PYTHON" -m areal.gateway.server --config configs/taotoken_router.yaml --port 9000 --log-level info &
GATEWAY_PID=$!
stop_gateway() {
  kill "$GATEWAY_PID" 2>/dev/null || true
  wait "$GATEWAY_PID" 2>/dev/null || true
}
trap stop_gateway EXIT

# Any HTTP answer will do (without the gateway key it is a 401): the gateway is listening.
deadline=$((SECONDS + GATEWAY_WAIT_S))
until curl -s -o /dev/null --max-time 2 "$GATEWAY_URL"; do
  if ! kill -0 "$GATEWAY_PID" 2>/dev/null; then
    echo "error: the gateway exited before answering at $GATEWAY_URL (its output is above)" >&2
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    echo "error: the gateway did not answer at $GATEWAY_URL within ${GATEWAY_WAIT_S}s;" \
      "raise GATEWAY_WAIT_S or read its output above" >&2
    exit 1
  fi
  sleep 1
done
if ! kill -0 "$GATEWAY_PID" 2>/dev/null; then  # something else answers on port 9000
  echo "error: the gateway exited and another process answers at $GATEWAY_URL;" \
    "free port 9000" >&2
  exit 1
fi

# Step 2: the training run.
"$PYTHON" -m areal.train --config configs/agent_async_train.yaml --agent-config agent_config.py --output-dir ./checkpoints/run_001 "$@"
