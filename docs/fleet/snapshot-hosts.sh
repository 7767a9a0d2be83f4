#!/bin/sh
# Apply one experiment on every host of HOSTS over ssh, snapshot each into OUTDIR/<host>.json and
# compare them: `envbuild verify --fleet` prints only what differs between machines. See
# docs/fleet.md.
#
#   docs/fleet/snapshot-hosts.sh HOSTS OUTDIR [SPEC]
#
# HOSTS: a file, one host a line: `NAME [ROOT]` (ROOT: default /, a folder for a rehearsal root,
# as `envbuild apply --root`). SPEC: a path on the hosts; without it nothing is applied.
# $ENVBUILD: the command on the hosts (default envbuild); $SNAPSHOT_ARGS: more snapshot options.
# Paths are put in single quotes on the remote command line: none may hold a single quote.
set -eu
hosts=$1 out=$2 spec=${3:-}
envbuild=${ENVBUILD:-envbuild}
mkdir -p "$out"
names=
while read -r name root <&3 || [ -n "${name:-}" ]; do  # (a last line without newline)
    case $name in '' | '#'*) continue ;; esac
    state="${root:-/}"
    state="${state%/}/var/lib/envbuild"
    if [ -n "$spec" ]; then
        ssh -n "$name" "$envbuild apply '$spec' --root '${root:-/}' --yes"
    fi
    # the snapshot comes back on stdout: nothing to copy afterwards
    ssh -n "$name" "$envbuild snapshot --python '$state/current/venv'" \
        "--hf-cache '$state/huggingface/hub' ${SNAPSHOT_ARGS:-}" > "$out/$name.json.part"
    mv "$out/$name.json.part" "$out/$name.json"
    names="$names $out/$name.json"
done 3< "$hosts"
# shellcheck disable=SC2086  # one word a snapshot (no spaces in OUTDIR or host names)
exec $envbuild verify --fleet $names
