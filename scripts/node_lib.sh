# Shared by the scripts/node_*.sh runners (source it; needs $root): progress lines and one job per session.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
log() { echo "$(date +%T) $*" >> "$root/progress.txt"; }

# run_in_session NAME CMD...: run CMD in a session of its own, its console in $root/NAME.console.log, then stop
# whatever it left in that session by id (a name pattern would also match any shell whose command line
# contains it). The rlkit launchers stop verl's own session (Ray, vLLM workers) themselves.
run_in_session() {
  local name=$1; shift
  log "$name start"
  setsid "$@" > "$root/$name.console.log" 2>&1 &
  local pid=$!
  wait $pid
  local status=$?
  log "$name exit $status"
  pkill -9 -s "$pid"
}
