#!/usr/bin/env bash
# The README's install command, timed: a fresh venv and `.venv/bin/pip install -e '.[all,dev]'` with
# the venv's own pip (as a new user runs it, no pip upgrade), for each git revision given, first
# with an empty pip cache (cold), then with the cache that run filled (warm). Revisions alternate
# within each pass, so both see the same machine load.
#
#   benchmarks/install_time.sh 14da778 HEAD      # before/after the resolver fix
#
# Prints one line per install: revision, cold|warm, exit code, seconds, load average, openai version.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$(mktemp -d)}
revs=("$@"); [ ${#revs[@]} -gt 0 ] || revs=(HEAD)
for rev in "${revs[@]}"; do
  mkdir -p "$work/$rev" && git -C "$repo" archive "$rev" | tar -x -C "$work/$rev"
done
for temp in cold warm; do
  for rev in "${revs[@]}"; do
    tree=$work/$rev cache=$work/cache-$rev
    [ "$temp" = cold ] && rm -rf "$cache"
    rm -rf "$tree/.venv"
    start=$(date +%s.%N)
    (cd "$tree" && python3 -m venv .venv && PIP_CACHE_DIR=$cache .venv/bin/pip install -e '.[all,dev]' >"$work/log-$rev-$temp.txt" 2>&1)
    rc=$?
    end=$(date +%s.%N)
    openai=$("$tree/.venv/bin/pip" list 2>/dev/null | awk 'tolower($1)=="openai"{print $2}')
    printf '%s %s rc=%s %.0f s load=%s openai=%s\n' "$rev" "$temp" "$rc" "$(echo "$end - $start" | bc)" \
      "$(cut -d' ' -f1 /proc/loadavg)" "$openai"
  done
done
echo "logs: $work"
