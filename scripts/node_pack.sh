#!/bin/bash
# The results of scripts/node_session.sh, packed for the device tool's return trip: one ROOT/<job>.tgz per job folder
# in OUT, plus session.tgz with ROOT's own files (progress.txt, DONE). Weights, data and checkpoints stay behind
# (*.safetensors, *.parquet, *.pt, *.bin, global_step_*/: the runs record what they came from). The tool returns at
# most 64 MiB a call, so the sizes are printed and a total over 60 MiB is an error (exit 1; the tarballs stay, to
# fetch in several calls).
# usage: scripts/node_pack.sh ROOT OUT
set -u
root=${1:?give the session root}; out=${2:?give the folder to pack into, e.g. \$OUT}
[ -d "$root" ] || { echo "no session root $root" >&2; exit 2; }
mkdir -p "$out"
excludes=(--exclude='*.safetensors' --exclude='*.parquet' --exclude='*.pt' --exclude='*.bin' --exclude='global_step_*')
for dir in "$root"/*/; do
  job=$(basename "$dir")
  tar czf "$out/$job.tgz" "${excludes[@]}" -C "$root" "$job"
done
find "$root" -maxdepth 1 -type f -printf '%f\n' | tar czf "$out/session.tgz" -C "$root" -T -
du -b "$out"/*.tgz | awk '{printf "%8.1f MiB  %s\n", $1 / 1048576, $2; total += $1}
                          END {printf "%8.1f MiB  total\n", total / 1048576; exit (total > 60 * 1048576)}'
