#!/usr/bin/env bash
# The README's install command, timed: for each git revision given, that revision's own command (the
# first README line `python -m venv .venv && ...`, up to the run of the demo) in a fresh venv, first
# with an empty pip cache (cold), then with the cache that run filled (warm). Revisions alternate
# within each pass, so both see the same machine load.
#
#   benchmarks/install_time.sh 6213094 HEAD      # before/after pip upgraded first
#
# Prints one line per install: revision, cold|warm, exit code, seconds, CPU seconds (user+sys of pip
# and its children), load average before and after, pip and openai versions.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$(mktemp -d)}
revs=("$@"); [ ${#revs[@]} -gt 0 ] || revs=(HEAD)
for rev in "${revs[@]}"; do
  mkdir -p "$work/$rev" && git -C "$repo" archive "$rev" | tar -x -C "$work/$rev"
  cmd=$(grep -m1 '^python -m venv .venv && ' "$work/$rev/README.md" | sed 's/ && \.venv\/bin\/python -m apps_bench$//')
  [ -n "$cmd" ] || { echo "$rev: no 'python -m venv .venv && ...' line in its README" >&2; exit 2; }
  printf '%s\n' "$cmd" >"$work/cmd-$rev.txt"
  echo "$rev: $cmd"
done
python=$(command -v python3)
for temp in cold warm; do
  for rev in "${revs[@]}"; do
    tree=$work/$rev cache=$work/cache-$rev
    [ "$temp" = cold ] && rm -rf "$cache"
    rm -rf "$tree/.venv"
    load0=$(cut -d' ' -f1 /proc/loadavg)
    # `python` in the README is this machine's python3; PIP_CACHE_DIR keeps each revision's cache apart
    (cd "$tree" && PATH="$(dirname "$python"):$PATH" PIP_CACHE_DIR=$cache \
      /usr/bin/time -f '%e %U %S' -o "$work/time-$rev-$temp.txt" bash -c "$(cat "$work/cmd-$rev.txt")" \
      >"$work/log-$rev-$temp.txt" 2>&1)
    rc=$?
    read -r wall user sys < <(tail -1 "$work/time-$rev-$temp.txt")
    pip=$("$tree/.venv/bin/pip" --version 2>/dev/null | cut -d' ' -f2)
    openai=$("$tree/.venv/bin/pip" list 2>/dev/null | awk 'tolower($1)=="openai"{print $2}')
    printf '%s %s rc=%s %.0f s cpu=%.0f s load=%s..%s pip=%s openai=%s\n' "$rev" "$temp" "$rc" "$wall" \
      "$(echo "$user + $sys" | bc)" "$load0" "$(cut -d' ' -f1 /proc/loadavg)" "$pip" "$openai"
  done
done
echo "logs: $work"
