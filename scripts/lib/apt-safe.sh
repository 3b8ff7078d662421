# Sourced by the host set-up scripts: install Debian packages without changing any package the
# machine already has.
#
#   apt_safe_install PKG...      PKG may name a release per package (docker.io/trixie).
#
# Before installing, the same `apt-get install` is simulated (`apt-get -s`). If it would upgrade,
# downgrade or remove any installed package, nothing is installed: the packages are listed and
# the script stops. With APT_SAFE_SIMULATE=1 only the simulation runs: it prints one line per
# package it would install ("new NAME VERSION RELEASE") or change ("changes NAME OLD -> NEW"),
# and returns 1 when anything installed would change. Tests run that mode in a bookworm
# container, through this very function.
#
# Never `apt-get install -t RELEASE`: -t makes RELEASE the default for every dependency, which
# is a partial dist-upgrade of the host.

apt_safe_install() {
    local sim changed
    export DEBIAN_FRONTEND=noninteractive
    sim=$(apt-get -s -y install --no-install-recommends "$@" 2>&1) || {
        echo "$sim" >&2
        echo "apt-safe: error: apt-get cannot install $*; see the lines above" >&2
        return 1
    }
    # `Inst NAME [OLD] (NEW RELEASE...)` is an upgrade or downgrade; `Remv NAME` a removal.
    changed=$(awk '$1 == "Inst" && $3 ~ /^\[/ { gsub(/[][]/, "", $3); sub(/^\(/, "", $4)
                                                 print "changes " $2 " " $3 " -> " $4 }
                   $1 == "Remv" { print "removes " $2 }' <<<"$sim")
    if [ "${APT_SAFE_SIMULATE:-0}" = 1 ]; then
        awk '$1 == "Inst" && $3 !~ /^\[/ { sub(/^\(/, "", $3); r = $4; sub(/^\[?/, "", r)
                                           print "new " $2 " " $3 " " r }' <<<"$sim"
        [ -z "$changed" ] && return 0
        echo "$changed"
        return 1
    fi
    if [ -n "$changed" ]; then
        echo "apt-safe: error: installing $* would change packages this machine already has:" >&2
        sed 's/^/  /' <<<"$changed" >&2
        echo "apt-safe: nothing was installed; install the packages yourself or upgrade the host first" >&2
        return 1
    fi
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
