# Sourced by the scripts that start `erinfer serve --port 0` (serve_check.sh, memory_recall.sh,
# cuda_emu_programs.sh): serve_port LOG PID prints the port the server wrote into its log (stderr) once it
# listens, waiting up to 30 s; nothing, and status 1, when the server exits first or never says.
serve_port() {
  local log=$1 pid=$2 port=
  for _ in $(seq 300); do
    port=$(sed -n 's/.*http:\/\/127.0.0.1:\([0-9]*\)\/v1.*/\1/p' "$log")
    [ -n "$port" ] && { echo "$port"; return 0; }
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
