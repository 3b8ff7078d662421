#!/usr/bin/env bash
# `make demo`: imageforge's real pipeline end to end, offline, against the sample upstream.
# Generates the sample sources, serves them on 127.0.0.1, builds the SMDDP image with
# BuildKit, runs its smoke checks, then builds again to show that nothing rebuilds.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=8741   # manifests/sample.toml points here
UPSTREAM=cache/sample-upstream
MANIFEST=manifests/sample.toml
INVOKE=.venv/bin/invoke

step() { printf '\n== %s\n' "$*"; }

if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    echo "demo: port $PORT is already in use; stop whatever listens there (an earlier demo?)" >&2
    exit 1
fi

step "generating the sample upstream in $UPSTREAM"
.venv/bin/python -m sample generate --out "$UPSTREAM"

step "serving it on http://127.0.0.1:$PORT"
.venv/bin/python -m sample serve --dir "$UPSTREAM" --port "$PORT" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.1
done

step "invoke lock (resolves NCCL \"auto\" from the pinned PyTorch)"
$INVOKE lock --manifest "$MANIFEST"

step "invoke check"
$INVOKE check --manifest "$MANIFEST" --locked

step "invoke plan --target smddp"
$INVOKE plan --target smddp --manifest "$MANIFEST"

step "invoke build --target smddp (then its smoke checks, test-image)"
$INVOKE build --target smddp --manifest "$MANIFEST" --locked --progress plain

step "invoke build --target smddp, again: nothing should rebuild"
$INVOKE build --target smddp --manifest "$MANIFEST" --locked --progress plain --no-test
