#!/usr/bin/env bash
# Install the official reference MCP server, @modelcontextprotocol/server-everything, into .cache/server-everything
# (with the machine's Node.js and npm; network needed once) and print the path of its entry point.
#
#   node "$(scripts/server_everything.sh)" stdio              # over stdio
#   PORT=3001 node "$(scripts/server_everything.sh)" streamableHttp   # Streamable HTTP at http://127.0.0.1:3001/mcp
#
# The tests of classic elicitation drive it through the whole stack (tests/test_held_questions.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="2026.8.31"
CACHE="$ROOT/.cache/server-everything"
PACKAGE="$CACHE/node_modules/@modelcontextprotocol/server-everything"
ENTRY="$PACKAGE/dist/index.js"

installed_version() {
  node -p "require('$PACKAGE/package.json').version" 2>/dev/null || true
}

if [[ ! -f "$ENTRY" || "$(installed_version)" != "$VERSION" ]]; then
  echo "server-everything: installing $VERSION into $CACHE" >&2
  mkdir -p "$CACHE"
  npm install --prefix "$CACHE" --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/server-everything@$VERSION" >&2
fi
echo "$ENTRY"
