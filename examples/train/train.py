"""A tiny training job that needs no GPU: what `make demo` and the tests run through `train`.

It fits w in (w - 3)^2 by gradient descent for --epochs steps at --lr, and saves the result
and what it was given to $SM_MODEL_DIR/model.json, as SageMaker's contract promises. On a
job with several hosts the first host also logs in to every other one over SSH (keys are
made when the job starts) the way MPI does, and records what it saw there.
"""

import argparse
import json
import os
import subprocess
import sys
import time


def fit(epochs: int, lr: float) -> float:
    w = 0.0
    for _ in range(epochs):
        w -= lr * 2 * (w - 3)
    return w


def reach(peer: str) -> dict:
    """Run a command on `peer` over SSH, retrying while its sshd starts."""
    command = "hostname && cat /opt/ml/input/config/resourceconfig.json && touch /tmp/reached"
    for _ in range(60):
        done = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", peer,
                               command], capture_output=True, text=True)
        if done.returncode == 0:
            break
        time.sleep(1)
    return {"exit": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-400:]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    args, _ = parser.parse_known_args()
    env = json.loads(os.environ["SM_TRAINING_ENV"])
    me, hosts = env["current_host"], env["hosts"]
    with open("/opt/ml/input/config/resourceconfig.json") as handle:
        resources = json.load(handle)
    result = {"host": me, "hosts": hosts, "resourceconfig": resources, "argv": sys.argv[1:],
              "hyperparameters": json.loads(os.environ["SM_HPS"]),
              "weight": fit(args.epochs, args.lr)}
    key = "/etc/ssh/ssh_host_ed25519_key.pub"
    if os.path.exists(key):
        with open(key) as handle:
            result["host_key"] = handle.read().split()[1]
    if len(hosts) > 1:
        # As the toolkit's MPI runner does on every host before mpirun.
        subprocess.run(["/usr/sbin/sshd"], check=True)
        if me == hosts[0]:
            result["ssh"] = {peer: reach(peer) for peer in hosts[1:]}
        else:
            # Stay up until the first host has been here, like an MPI worker.
            for _ in range(240):
                if os.path.exists("/tmp/reached"):
                    break
                time.sleep(0.5)
            result["reached_by"] = hosts[0] if os.path.exists("/tmp/reached") else None
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.json"), "w") as handle:
        json.dump(result, handle, indent=2)
    print(f"{me}: w = {result['weight']:.4f} after {args.epochs} epochs")


if __name__ == "__main__":
    main()
