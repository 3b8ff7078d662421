"""Runs inside a Debian bookworm container (python3 + apt): prints, as JSON, the .debs that
`apt-get install --no-install-recommends PACKAGES` installs on Debian 12 with build-essential
(package, version, architecture, pool path, size and sha256 from Debian's signed index).

The baseline is built from the container's own dpkg status, cut down to the essential,
required and important packages, apt and build-essential with their dependencies, so the
closure does not depend on whatever else the container's image happens to carry.
"""

import json
import re
import subprocess
import sys

BASELINE = ["apt", "build-essential"]


def stanzas() -> dict[str, str]:
    with open("/var/lib/dpkg/status") as status:
        parts = [s for s in status.read().split("\n\n") if s.strip()]
    return {re.search(r"^Package: (\S+)", s, re.M).group(1): s for s in parts}  # type: ignore[union-attr]


def depends(stanza: str, installed: dict[str, str]) -> list[str]:
    found = []
    for field in ("Pre-Depends", "Depends"):
        match = re.search(rf"^{field}: (.*)$", stanza, re.M)
        for group in match.group(1).split(",") if match else []:
            for alternative in group.split("|"):
                name = alternative.strip().split()[0].split(":")[0]
                if name in installed:
                    found.append(name)
                    break
    return found


def main() -> None:
    installed = stanzas()
    todo = [name for name, s in installed.items()
            if re.search(r"^(Essential: yes|Priority: (required|important))$", s, re.M)]
    todo += BASELINE
    keep: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in keep and name in installed:
            keep.add(name)
            todo += depends(installed[name], installed)
    with open("/tmp/baseline-status", "w") as out:
        out.write("\n\n".join(installed[name] for name in sorted(keep)) + "\n")
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    plan = subprocess.run(
        ["apt-get", "install", "-s", "-y", "--no-install-recommends",
         "-o", "Dir::State::status=/tmp/baseline-status", *sys.argv[1:]],
        check=True, capture_output=True, text=True).stdout
    debs = []
    for name, version in re.findall(r"^Inst (\S+) \((\S+) ", plan, re.M):
        record = subprocess.run(["apt-cache", "show", f"{name}={version}"], check=True,
                                capture_output=True, text=True).stdout.split("\n\n")[0]
        fields = dict(re.findall(r"^(Architecture|Filename|Size|SHA256): (\S+)$", record, re.M))
        debs.append({"package": name, "version": version, "architecture": fields["Architecture"],
                     "path": fields["Filename"], "size": int(fields["Size"]),
                     "sha256": fields["SHA256"]})
    json.dump(sorted(debs, key=lambda deb: deb["package"]), sys.stdout, indent=1)

main()
