#!/usr/bin/env bash
# `make demo`: imageforge's real pipeline end to end against the sample upstream.
# Generates the sample sources, serves them on 127.0.0.1, builds the SMDDP image with
# BuildKit, runs its smoke checks, builds again to show that nothing rebuilds, adds the
# example training code and runs it as a two-host SageMaker training job. The only thing
# fetched from outside is the SageMaker training toolkit, from PyPI (--ca-bundle).
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

step "invoke build --code examples/train --program train.py: the training code, one cheap stage on top"
image=imageforge/sample-smddp:demo-code
$INVOKE build --manifest "$MANIFEST" --locked --progress plain --code examples/train \
    --program train.py --tag "$image"

step "invoke run-local: a two-host SageMaker training job on this machine"
job=cache/run-local/demo-$(date +%Y%m%d-%H%M%S)
$INVOKE run-local --image "$image" --hosts 2 --hp epochs=5 --hp lr=0.1 --output "$job"
echo "model written by algo-1 (it logged in to algo-2 over SSH with the job's key):"
# The gist of model.json (the whole file, and each host's full log, are under $job;
# `invoke run-local --verbose` shows the hosts' output as they run).
.venv/bin/python - "$job/algo-1/model/model.json" <<'PY'
import json, sys
model = json.load(open(sys.argv[1]))
ssh = {host: r["exit"] for host, r in model.get("ssh", {}).items()}
print(f"  argv {' '.join(model['argv'])}; weight {model['weight']}; ssh exit codes {ssh}")
PY
echo "  (full file: $job/algo-1/model/model.json)"
