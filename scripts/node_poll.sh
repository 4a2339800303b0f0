#!/bin/bash
# One poll of scripts/node_session.sh, in one device call: wait until ROOT/DONE or SECONDS have passed (default 540,
# under the tool's 600 s a call), print where the session is, then always pack what it has into OUT. A poll that only
# waits loses everything if the machine goes back before the next call (session 16 lost a seed run that way).
# usage: scripts/node_poll.sh ROOT OUT [SECONDS]
set -u
root=${1:?give the session root}; out=${2:?give the folder to pack into, e.g. \$OUT}; seconds=${3:-540}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "SECONDS must be a whole number of seconds, not '$seconds'" >&2; exit 2; }
# One wait serves both: the call that starts the driver may poll before the driver has made ROOT (session 16's first
# poll did), and DONE lies inside ROOT.
deadline=$((SECONDS + seconds))
while [ ! -e "$root/DONE" ] && [ $SECONDS -lt $deadline ]; do sleep 2; done
[ -d "$root" ] || { echo "no session root $root after ${seconds}s: start scripts/node_session.sh first" >&2; exit 2; }
cat "$root/progress.txt" 2>/dev/null
for job in "$root"/*/; do tail -n 2 "$job/progress.txt" 2>/dev/null; done
if [ -e "$root/DONE" ]; then echo "session ended"; else echo "session still running after ${seconds}s"; fi
exec "$(dirname "$0")/node_pack.sh" "$root" "$out"
