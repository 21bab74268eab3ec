#!/usr/bin/env bash
# erinfer serve against real clients on localhost: the official OpenAI Node client (npm `openai`,
# pinned, installed into build/npm-openai like the other node packages of the tests), curl for the raw
# SSE format and the HTTP errors, the queue's 503, a client hang-up, then the bounded load test
# (scripts/serve_load.mjs). The server runs the tiny base (models/tiny-base) on a free port; the queue and
# hang-up checks use a random configs/tiny.json model (ertrain init), whose answers run to max_tokens. Each
# server must stop cleanly on SIGTERM (under ASan: no leak report).
#   scripts/serve_check.sh            run (exit 77, loudly, where node / npm are missing or the install fails)
#   scripts/serve_check.sh --install  only install (CI: fails where the test would skip)
# Env: ER_BUILD (dir of erinfer, default build; ertrain from there too when built, else from build),
#      LOAD_CLIENTS (64), LOAD_ROUNDS (20), TOOL_MODEL (a model that always calls add(4, 9), made by
#      tests/infer/test_server.c: the openai client's tool round trip runs against it, on a server with a memory
#      store: the client's tools work beside the memory tools), MEMORY_MODEL (a model that always calls
#      memory_search, made there too: the openai client sees the server run it). The load test runs on a server
#      with a memory store, every request saving its conversation: no saved entry may be missing afterwards.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. scripts/serve_port.sh
B=${ER_BUILD:-build}
pkg=openai@5.23.2
prefix=build/npm-openai

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
  echo "!!!!!! serve_check: node, npm or curl is not installed: erinfer serve is NOT TESTED with real clients !!!!!!" >&2
  [ "${1:-}" = --install ] && exit 1
  exit 77
fi
if ! grep -qs '"version": "5.23.2"' $prefix/node_modules/openai/package.json; then
  echo "serve_check: installing $pkg into $prefix" >&2
  mkdir -p $prefix
  if ! flock build/.npm-openai.lock npm install --prefix $prefix --no-save --no-audit --no-fund --ignore-scripts \
       "$pkg" >build/npm-openai.log 2>&1; then
    echo "!!!!!! serve_check: npm could not install $pkg (see build/npm-openai.log): serve NOT TESTED !!!!!!" >&2
    [ "${1:-}" = --install ] && exit 1
    exit 77
  fi
fi
[ "${1:-}" = --install ] && exit 0
if ! "$B/erinfer" serve --help >/dev/null 2>&1; then
  echo "!!!!!! serve_check: $B/erinfer has no serve command: erinfer serve is NOT TESTED !!!!!!" >&2
  exit 77
fi

tmp=$(mktemp -d /tmp/serve_check.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "serve_check: FAILED: $*" >&2
  tail -n 5 "$tmp"/*.log >&2
  exit 1
}

T=$B
[ -x "$T/ertrain" ] || T=build
"$T/ertrain" init --config configs/tiny.json --out "$tmp/model" --tokenizer data/tiny_tokenizer --seed 1 --threads 1 \
  >/dev/null || fail "ertrain init"

# start NAME MODEL FLAGS...: a server on a free port; sets port and server_pid.
start() {
  local name=$1 model=$2
  shift 2
  "$B/erinfer" serve --model "$model" --port 0 --threads 1 "$@" 2>"$tmp/$name.log" &
  server_pid=$!
  pids+=("$server_pid")
  port=$(serve_port "$tmp/$name.log" "$server_pid") && return 0
  cat "$tmp/$name.log" >&2
  fail "the $name server did not start"
}
# stop: SIGTERM, a clean exit (status 0: with ASan, no leak or error report).
stop() {
  kill -TERM "$server_pid"
  wait "$server_pid" || { cat "$tmp/$1.log" >&2; fail "the $1 server exited with status $?"; }
}

key=serve-check-key
json=(-H "Content-Type: application/json")   # a POST body must say it is JSON (else 415)
start main models/tiny-base --parallel 2 --max-n 4 --max-tokens 64 --api-key $key
base=http://127.0.0.1:$port
auth=(-H "Authorization: Bearer $key")

# A memory store of three notes (text only; erinfer memory is absent where serve is).
notes() {
  for t in "Zorblat Quenn works as a glassblower in Veltrin." "The wifi password is tangerine42." \
           "Mira keeps a glassblower pipe on the shelf."; do
    "$B/erinfer" memory add --db "$1" --text "$t" >/dev/null || fail "erinfer memory add"
  done
}
tool_url=none
memory_url=none
main_pid=$server_pid
if [ -n "${TOOL_MODEL:-}" ]; then
  start tools "$TOOL_MODEL" --memory "$tmp/tools.db"
  tool_url=http://127.0.0.1:$port/v1
  tools_pid=$server_pid
else
  echo "serve_check: no TOOL_MODEL: the tool call round trip with the openai client is left out" >&2
fi
if [ -n "${MEMORY_MODEL:-}" ]; then
  notes "$tmp/memory.db"
  start memory "$MEMORY_MODEL" --memory "$tmp/memory.db" --memory-rounds 1 --context 4096
  memory_url=http://127.0.0.1:$port/v1
else
  echo "serve_check: no MEMORY_MODEL: the memory_search call with the openai client is left out" >&2
fi
node scripts/serve_check.mjs $prefix "$base/v1" $key $tool_url $memory_url || fail "the openai client checks"
[ "$memory_url" != none ] && stop memory
[ "$tool_url" != none ] && server_pid=$tools_pid && stop tools
server_pid=$main_pid

# Raw SSE: "data: {json}" events separated by blank lines, ending in "data: [DONE]".
curl -sN "${auth[@]}" "$base/v1/chat/completions" -o "$tmp/sse" \
  "${json[@]}" -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"stream":true}' || fail "curl stream"
python3 - "$tmp/sse" <<'EOF' || fail "the raw SSE format"
import json, sys
raw = open(sys.argv[1], encoding="utf-8").read()
assert raw.endswith("data: [DONE]\n\n"), raw[-80:]
events = raw.split("\n\n")[:-1]
assert all(e.startswith("data: ") and "\n" not in e for e in events), events
chunks = [json.loads(e[6:]) for e in events[:-1]]
assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
assert all(c["object"] == "chat.completion.chunk" for c in chunks)
assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
EOF
# HTTP statuses of bad requests, each with an OpenAI error body.
code() { curl -s -o "$tmp/body" -w '%{http_code}' "$@"; }
expect() {
  local want=$1
  shift
  local got
  got=$(code "$@")
  [ "$got" = "$want" ] || fail "$* -> $got, expected $want"
  [ "$want" = 200 ] || python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["error"]["message"]' "$tmp/body" ||
    fail "$* -> no OpenAI error body"
}
expect 401 "$base/v1/chat/completions" "${json[@]}" -d '{"messages":[{"role":"user","content":"Hi"}]}'
expect 401 -H "Authorization: Bearer nope" "$base/v1/models"
expect 200 -H "Authorization: bearer $key" "$base/v1/models"   # the scheme is case-insensitive
# Without the key, a large body is refused before it is read (401, not 413).
head -c 2000000 /dev/zero | tr '\0' 'a' >"$tmp/huge"
expect 401 "$base/v1/chat/completions" "${json[@]}" --data-binary @"$tmp/huge"
expect 200 "$base/health"
expect 404 "${auth[@]}" "$base/v1/moderations" "${json[@]}" -d '{}'
expect 400 "${auth[@]}" "$base/v1/embeddings" "${json[@]}" -d '{}'
expect 405 "${auth[@]}" "$base/v1/chat/completions"
expect 400 "${auth[@]}" "$base/v1/chat/completions" "${json[@]}" -d '{"messages":'
expect 400 "${auth[@]}" "$base/v1/chat/completions" "${json[@]}" -d '[1,2]'
expect 400 "${auth[@]}" "$base/v1/chat/completions" "${json[@]}" -d '{"messages":[{"role":"wizard","content":"Hi"}]}'
# A body not declared JSON (curl -d alone sends a form's type) and a foreign Host are refused.
expect 415 "${auth[@]}" "$base/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Hi"}]}'
expect 403 -H "Host: rebound.example" "$base/health"
# max_tokens beyond the server's cap (--max-tokens 64 here) is cut to the cap.
expect 200 "${auth[@]}" "$base/v1/chat/completions" "${json[@]}" \
  -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":100000000}'
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["usage"]["completion_tokens"] <= 64' "$tmp/body" ||
  fail "max_tokens is not capped"
expect 413 "${auth[@]}" "$base/v1/chat/completions" "${json[@]}" --data-binary @"$tmp/huge"
grep -q "/tmp\|\.c:\|$tmp" "$tmp/body" && fail "an error message shows internals: $(cat "$tmp/body")"

stop main
LOAD_CLIENTS=${LOAD_CLIENTS:-64} LOAD_ROUNDS=${LOAD_ROUNDS:-20}
# Under ASan the quarantine keeps freed memory resident: RSS says nothing there, LeakSanitizer at exit does.
growth=8
ldd "$B/erinfer" | grep -q libasan && growth=off
# The load test with a memory store: recall and the memory tools in every prompt, every conversation saved.
notes "$tmp/load.db"
start load models/tiny-base --parallel 2 --max-n 4 --max-tokens 64 --api-key $key --memory "$tmp/load.db"
SAVED_IDS=$tmp/saved node scripts/serve_load.mjs "http://127.0.0.1:$port" "$server_pid" "$LOAD_CLIENTS" \
  "$LOAD_ROUNDS" $key $growth || fail "the load test"
stop load
"$B/erinfer" memory list --db "$tmp/load.db" --json >"$tmp/entries" || fail "erinfer memory list after the load test"
python3 - "$tmp/saved" "$tmp/entries" <<'EOF' || fail "saved conversations missing from the store"
import json, sys
saved = [int(x) for x in open(sys.argv[1]).read().split()]
entries = {e["id"]: e for e in map(json.loads, open(sys.argv[2]))}
missing = [i for i in saved if i not in entries or not entries[i]["text"].startswith("user: ")]
assert not missing and len(entries) == 3 + len(saved), (len(missing), len(entries), len(saved))
print(f"serve_check: the {len(saved)} saved conversations are all in the store", file=sys.stderr)
EOF
# An empty --api-key is refused at start (it would let an empty Bearer through).
timeout 20 "$B/erinfer" serve --model models/tiny-base --port 0 --api-key "" 2>"$tmp/empty.log" &&
  fail "--api-key \"\" was accepted"
grep -q "must not be empty" "$tmp/empty.log" || fail "--api-key \"\": $(cat "$tmp/empty.log")"

# A full queue answers 503 and the server goes on: one worker, a queue of one, eight clients at once.
start queue "$tmp/model" --parallel 1 --queue 1 --max-tokens 2000 --context 2048
curls=()
for i in $(seq 8); do
  curl -s -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$port/v1/chat/completions" \
    "${json[@]}" -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":200,"temperature":0}' >>"$tmp/codes" &
  curls+=($!)
done
wait "${curls[@]}"
sort "$tmp/codes" | uniq -c | tr '\n' ' ' >&2
echo >&2
grep -q '^503$' "$tmp/codes" || fail "no 503 from a full queue"
[ "$(grep -cv '^\(200\|503\)$' "$tmp/codes")" = 0 ] || fail "statuses other than 200 and 503"
expect 200 "http://127.0.0.1:$port/health"
# Idle connections (100, more than this server's queue and workers) do not lock other clients out.
python3 - "$port" <<'EOF' || fail "idle connections locked the server out"
import socket, sys, urllib.request
idle = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(100)]
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=10) as r:
    assert r.status == 200
EOF
# A client that hangs up, streaming or not, cancels its job (logged), and the server keeps serving. The
# hang-up comes 0.2 s in: the tiny base decodes 2000 tokens on one thread in about half a second here.
for stream in true false; do
  curl -sN --max-time 0.2 "http://127.0.0.1:$port/v1/chat/completions" "${json[@]}" \
    -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2000,"temperature":0,"stream":'$stream'}' >/dev/null
  expect 200 "http://127.0.0.1:$port/v1/completions" "${json[@]}" -d '{"prompt":"Hi","max_tokens":4}'
done
# A client that half-closes (shuts its sending side) is taken as gone: it reads an error, not a
# finish_reason that would say its text is complete.
python3 - "$port" <<'EOF' || fail "a half-closed client's cancelled request"
import json, socket, sys
body = b'{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2000,"temperature":0}'
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n" % len(body) + body)
s.shutdown(socket.SHUT_WR)
raw = b""
while chunk := s.recv(65536):
    raw += chunk
head, _, rest = raw.partition(b"\r\n\r\n")
assert head.split()[1] == b"499", head
assert json.loads(rest)["error"]["code"] == "request_cancelled", rest
EOF
grep "cancelled: the client went away" "$tmp/queue.log" >&2
[ "$(grep -c "cancelled: the client went away" "$tmp/queue.log")" = 3 ] || fail "a hang-up did not cancel its job"
stop queue
# --queue 0: a request that an idle worker takes at once does not wait, so it is served.
start queue0 "$tmp/model" --parallel 1 --queue 0 --max-tokens 8
expect 200 "http://127.0.0.1:$port/v1/completions" "${json[@]}" -d '{"prompt":"Hi","max_tokens":4}'
stop queue0
# A queued client that hangs up gives its slot back; SIGTERM answers every job still open with a 503
# error (a stream: an error event, then [DONE]), running or queued. A model slow enough that the first
# request A still decodes while the rest happens: one row, a queue of two.
sed 's/"hidden_size": 128/"hidden_size": 256/; s/"num_hidden_layers": 4/"num_hidden_layers": 8/' configs/tiny.json \
  >"$tmp/slow.json"
"$T/ertrain" init --config "$tmp/slow.json" --out "$tmp/slow" --tokenizer data/tiny_tokenizer --seed 1 --threads 1 \
  >/dev/null || fail "ertrain init (slow)"
start stop "$tmp/slow" --parallel 1 --max-n 1 --queue 2 --max-tokens 2000 --context 2048
url=http://127.0.0.1:$port/v1/chat/completions
long='{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2000,"temperature":0'
curl -sN "$url" "${json[@]}" -d "$long"',"stream":true}' >"$tmp/a.sse" &
a_pid=$!
for _ in $(seq 200); do [ -s "$tmp/a.sse" ] && break; sleep 0.05; done
[ -s "$tmp/a.sse" ] || fail "the first stream did not start"
curl -sN --max-time 0.3 "$url" "${json[@]}" -d "$long"',"stream":true}' >/dev/null   # B: queued, then gone
for _ in $(seq 200); do grep -q "left the queue: the client went away" "$tmp/stop.log" && break; sleep 0.05; done
grep -q "left the queue: the client went away" "$tmp/stop.log" || fail "a queued client that hung up kept its slot"
curl -s -o "$tmp/c.json" -w '%{http_code}' "$url" "${json[@]}" -d "$long}" >"$tmp/c.code" &
c_pid=$!
curl -sN "$url" "${json[@]}" -d "$long"',"stream":true}' >"$tmp/d.sse" &
d_pid=$!
sleep 0.5
expect 503 "$url" "${json[@]}" -d "$long}"   # A decodes, C and D fill the queue
grep -q queue_full "$tmp/body" || fail "a full queue's 503 is not queue_full: $(cat "$tmp/body")"
stop stop
wait "$a_pid" "$c_pid" "$d_pid"
[ "$(cat "$tmp/c.code")" = 503 ] && grep -q server_shutting_down "$tmp/c.json" ||
  fail "a queued request at shutdown got $(cat "$tmp/c.code") $(cat "$tmp/c.json")"
for s in a d; do
  grep -q server_shutting_down "$tmp/$s.sse" && [ "$(tail -n 2 "$tmp/$s.sse")" = "data: [DONE]" ] ||
    fail "stream $s at shutdown: $(tail -c 300 "$tmp/$s.sse")"
done
echo "serve_check: all checks passed"
