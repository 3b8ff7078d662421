#!/usr/bin/env bash
# Host tools the unit tests use: autotools (the sample's aws-ofi-nccl is built on the host),
# gnupg (signature tests), graphviz (plan --graph). Installed from the machine's own release,
# and only when missing; no installed package changes version (scripts/lib/apt-safe.sh).
#
# Usage: scripts/host-tools.sh        APT_SAFE_SIMULATE=1 scripts/host-tools.sh (simulation only)
set -euo pipefail
# shellcheck source=lib/apt-safe.sh
. "$(dirname "$0")/lib/apt-safe.sh"

PACKAGES=(autoconf automake libtool gnupg graphviz)
SIMULATE=${APT_SAFE_SIMULATE:-0}

if [ "$SIMULATE" != 1 ] && command -v autoreconf >/dev/null && command -v libtoolize >/dev/null \
        && command -v gpg >/dev/null && command -v dot >/dev/null; then
    exit 0
fi
echo "host-tools: installing ${PACKAGES[*]} from this machine's release (no installed package changes)"
apt-get update -qq
apt_safe_install "${PACKAGES[@]}" || { echo "host-tools: error: nothing was installed (see above)" >&2; exit 1; }
