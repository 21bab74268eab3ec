#!/usr/bin/env bash
# Recall of erinfer memory's search on the synthetic memory task (docs/memory.md#recall-on-a-synthetic-task):
# `ertrain synth memory` writes facts about made-up people and one paraphrasing question per fact, the facts go into
# a fresh store with vectors (`erinfer memory import --model`), every question is searched, and the question's fact
# counts as found by a method when it is among that method's best K: BM25 alone, the vectors alone, and their
# reciprocal rank fusion (what `erinfer memory search --k K` returns). Prints a table (method, recall@K, n). Then
# `erinfer serve --memory` on the store answers every question twice, with the recalled entries in its system message
# and without, and a second table gives the answer accuracy of each (docs/memory.md#recall-on-a-synthetic-task).
# Exits non-zero when a step fails or a result does not add up.
#
#   scripts/memory_recall.sh            (from anywhere; make memory-recall builds the programs first)
# Env: BUILD (dir of ertrain and erinfer, default build), MODEL (the embedding model, default models/tiny-base),
#      N (facts, default 200), SEED (1, also the answers' sampling seed), FPE (facts per person, 8), K (5),
#      PY (python3), KEEP=1 (keep the scratch dir and say where it is), SERVE_FLAGS (more erinfer serve flags for
#      the answers: "--adapter DIR --switcher FILE --verifier FILE" answers through the routed pipeline),
#      MAX_TOKENS (the answers' max_tokens, 32; a reasoning route needs more).
#
# One function per section; main runs them in order on one scratch dir ($work, removed on exit by the trap). Each
# section writes what the next reads into $work: task/ (facts.jsonl, questions.jsonl), store.db, lists/ and top/
# (the searches), recall.json, entries.jsonl, answers.jsonl and accuracy.json (the answers and their grades), serve.log.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. scripts/serve_port.sh
BUILD=${BUILD:-build}
MODEL=${MODEL:-models/tiny-base}
N=${N:-200}
SEED=${SEED:-1}
FPE=${FPE:-8}
K=${K:-5}
PY=${PY:-python3}
SERVE_FLAGS=${SERVE_FLAGS:-}
MAX_TOKENS=${MAX_TOKENS:-32}
# Each of the 400 searches is a process whose OpenMP threads would spin at every barrier: on 2 busy cores (a build
# beside it) that made a search 30 times slower (0.55 s instead of 0.016 s), the run minutes long. Waiting passively
# changes no result.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

fail() {
  echo "memory_recall: FAILED: $*" >&2
  exit 1
}

setup() {
  for p in ertrain erinfer; do
    [ -x "$BUILD/$p" ] || fail "$BUILD/$p is not built (make memory-recall builds it)"
  done
  [ -f "$MODEL/config.json" ] || fail "$MODEL is not a model dir"
  work=$(mktemp -d /tmp/memory_recall.XXXXXX)
  trap cleanup EXIT
}

cleanup() {
  if [ -n "${server_pid:-}" ]; then # a failure while the server runs
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  if [ "${KEEP:-0}" = 1 ]; then
    echo "memory_recall: kept $work" >&2
  else
    rm -rf "$work"
  fi
}

# The task: $work/task/facts.jsonl and questions.jsonl.
make_task() {
  "$BUILD/ertrain" synth memory --n "$N" --seed "$SEED" --facts-per-entity "$FPE" --out "$work/task" >&2 \
    || fail "ertrain synth memory"
}

# The store: every fact with its vector from $MODEL, in one transaction.
build_store() {
  local added
  added=$("$BUILD/erinfer" memory import "$work/task/facts.jsonl" --db "$work/store.db" --model "$MODEL" --json) \
    || fail "erinfer memory import"
  [ "$added" = "{\"added\":$N}" ] || fail "import added $added, expected $N entries"
}

# Two searches per question. lists/<fact>.jsonl: --k is the whole store, so every entry of either list comes back
# with its rank in that list (each list contributes its best max(4 k, 50) to the fusion): a list's rank there is
# the rank a search of that list alone gives. top/<fact>.jsonl: the search a user runs, --k K, ordered by the
# fusion of each list's best max(4 K, 50) (the deeper fusion of the first search orders its top differently).
search_questions() {
  local k_all=$((N < 10000 ? N : 10000)) fact question
  mkdir -p "$work/lists" "$work/top"
  "$PY" -c '
import json, sys
for line in open(sys.argv[1]):
    q = json.loads(line)
    print("%d\t%s" % (q["fact"], q["problem"].replace("\t", " ")))
' "$work/task/questions.jsonl" >"$work/questions.tsv" || fail "reading the questions"
  while IFS=$'\t' read -r fact question; do
    "$BUILD/erinfer" memory search --db "$work/store.db" --query "$question" --model "$MODEL" --k "$k_all" --json \
      >"$work/lists/$fact.jsonl" || fail "erinfer memory search --k $k_all for fact $fact: $question"
    "$BUILD/erinfer" memory search --db "$work/store.db" --query "$question" --model "$MODEL" --k "$K" --json \
      >"$work/top/$fact.jsonl" || fail "erinfer memory search --k $K for fact $fact: $question"
  done <"$work/questions.tsv"
}

# recall@K per method: the question's fact among BM25's best K (bm25_rank), the vectors' best K (vector_rank), and
# the K a search returns (the fusion). Also $work/recall.json for a later section or a caller.
recall_table() {
  "$PY" - "$work" "$K" "$N" <<'PYEOF' || fail "recall arithmetic"
import json, os, sys

work, K, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def hits(kind, fact):
    return [json.loads(line) for line in open(os.path.join(work, kind, "%d.jsonl" % fact))]


questions = [json.loads(line) for line in open(os.path.join(work, "task", "questions.jsonl"))]
assert len(questions) == N, "%d questions, expected %d" % (len(questions), N)
found = {"bm25": 0, "vector": 0, "fused": 0}
for q in questions:
    lists, top = hits("lists", q["fact"]), hits("top", q["fact"])
    assert lists and len(top) == min(K, N), "fact %d: %d and %d hits" % (q["fact"], len(lists), len(top))
    mine = [h for h in lists if h["metadata"]["fact"] == q["fact"]]
    assert len(mine) <= 1, "fact %d stored twice" % q["fact"]
    if mine:  # else in neither list: missed by both
        found["bm25"] += 0 < mine[0].get("bm25_rank", 0) <= K
        found["vector"] += 0 < mine[0].get("vector_rank", 0) <= K
    found["fused"] += any(h["metadata"]["fact"] == q["fact"] for h in top)
print("| method | recall@%d | n |" % K)
print("|---|---|---|")
for name, key in [("BM25 alone", "bm25"), ("vectors alone", "vector"), ("reciprocal rank fusion", "fused")]:
    print("| %s | %.3f (%d/%d) | %d |" % (name, found[key] / N, found[key], N, N))
json.dump({"k": K, "n": N, "found": found}, open(os.path.join(work, "recall.json"), "w"))
PYEOF
}

# Answer accuracy with and without memory. erinfer serve on $MODEL with the store and --memory-rounds 0 (the recalled
# entries only, no memory tools) answers every question as a chat request twice: with the default recall (the best
# --memory-k 4 entries for the question join the system message) and with "memory": {"recall": false}; greedy
# (temperature 0, seed $SEED), at most 32 tokens, one request at a time. A reply is graded by the project's rule
# (data/grade.h, ported in scripts/grade_ref.py: the answer after "Answer:" / "####" / \boxed{}, equal to the gold
# answer after normalisation, case-sensitive), and more loosely by whether the gold answer appears in it as a word
# (case-insensitive). "fact recalled": the question's own fact among the entries recalled for it
# (erinfer.memory.recalled). The server must stop with status 0 on SIGTERM.
answer_accuracy() {
  local log=$work/serve.log port='' rc=0
  "$BUILD/erinfer" memory list --db "$work/store.db" --limit "$N" --json >"$work/entries.jsonl" \
    || fail "erinfer memory list"
  # shellcheck disable=SC2086 # SERVE_FLAGS: words
  "$BUILD/erinfer" serve --model "$MODEL" --memory "$work/store.db" --memory-rounds 0 --port 0 --threads 2 \
    $SERVE_FLAGS 2>"$log" &
  server_pid=$!
  port=$(serve_port "$log" "$server_pid") || { cat "$log" >&2; fail "erinfer serve did not start"; }
  grep -q "memory $work/store.db: $N entries, searched by BM25 and vectors" "$log" \
    || { cat "$log" >&2; fail "erinfer serve does not search the $N entries by BM25 and vectors"; }
  "$PY" - "$work" "http://127.0.0.1:$port/v1" "$SEED" "$N" "$root/scripts" "$MAX_TOKENS" <<'PYEOF' || fail "answer accuracy"
import json, os, re, sys, urllib.error, urllib.request

work, base, seed, N = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
import grade_ref  # noqa: E402  (scripts/grade_ref.py: data/grade.c's rule)

MEMORY_K, MAX_TOKENS = 4, int(sys.argv[6])  # erinfer serve's default --memory-k; the answer's length
questions = [json.loads(line) for line in open(os.path.join(work, "task", "questions.jsonl"))]
fact_of = {}  # entry id -> its fact
for line in open(os.path.join(work, "entries.jsonl")):
    e = json.loads(line)
    fact_of[e["id"]] = e["metadata"]["fact"]
assert len(questions) == N and len(fact_of) == N, "%d questions, %d entries" % (len(questions), len(fact_of))


def ask(question, recall):
    body = {"messages": [{"role": "user", "content": question}], "temperature": 0, "seed": seed,
            "max_tokens": MAX_TOKENS}
    if not recall:
        body["memory"] = {"recall": False}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.load(r)
    except urllib.error.HTTPError as err:
        sys.exit("HTTP %d for %r: %s" % (err.code, question, err.read().decode(errors="replace")))


def contains(reply, gold):
    return re.search(r"(?<![0-9A-Za-z])%s(?![0-9A-Za-z])" % re.escape(gold), reply, re.I) is not None


conditions = [("with memory (best 4 recalled)", True), ("without memory (\"recall\": false)", False)]
stats = {name: {"strict": 0, "contains": 0, "answered": 0, "recalled": 0, "answers": {}} for name, _ in conditions}
with open(os.path.join(work, "answers.jsonl"), "w") as out:
    for q in questions:
        prompt_tokens = {}
        for name, recall in conditions:
            r = ask(q["problem"], recall)
            choice = r["choices"][0]
            reply = choice["message"]["content"] or ""
            assert choice["finish_reason"] in ("stop", "length"), choice
            ids = r.get("erinfer", {}).get("memory", {}).get("recalled")
            if recall:  # the best 4 of the search the first table's fusion column counts (all 4 fit the budget)
                top = [json.loads(line)["id"] for line in open(os.path.join(work, "top", "%d.jsonl" % q["fact"]))]
                assert ids == top[:MEMORY_K], (q, ids, top)
            else:
                assert ids is None, (q, r["erinfer"])
            prompt_tokens[recall] = r["usage"]["prompt_tokens"]
            ans = grade_ref.answer(reply)
            strict, loose = grade_ref.answer_correct(ans, q["answer"]), contains(reply, q["answer"])
            found = recall and q["fact"] in [fact_of[i] for i in ids]
            s = stats[name]
            s["strict"] += strict
            s["contains"] += loose
            s["answered"] += ans is not None
            s["recalled"] += found
            key = "(none)" if ans is None else ans.decode(errors="replace")
            s["answers"][key] = s["answers"].get(key, 0) + 1
            out.write(json.dumps({"fact": q["fact"], "memory": recall, "reply": reply, "answer": q["answer"],
                                  "strict": strict, "contains": loose, "recalled": ids, "fact_recalled": found,
                                  "prompt_tokens": r["usage"]["prompt_tokens"]}) + "\n")
        assert prompt_tokens[True] > prompt_tokens[False], (q, prompt_tokens)  # the entries were in the prompt


def rate(x):
    return "%.3f (%d/%d)" % (x / N, x, N)


print()
print("| condition | accuracy (grade.h: Answer: X) | accuracy (gold word in the reply) | n | fact recalled@%d |"
      % MEMORY_K)
print("|---|---|---|---|---|")
for name, recall in conditions:
    s = stats[name]
    print("| %s | %s | %s | %d | %s |" % (name, rate(s["strict"]), rate(s["contains"]), N,
                                          rate(s["recalled"]) if recall else "- (none recalled)"))
for name, _ in conditions:
    s = stats[name]
    common = sorted(s["answers"].items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    print("%s: an answer read in %d/%d replies; most read: %s" % (
        name.split(" (")[0], s["answered"], N, ", ".join("%s %d" % kv for kv in common)))
json.dump({"n": N, "memory_k": MEMORY_K, "max_tokens": MAX_TOKENS, "seed": seed,
           "conditions": {name: {k: v for k, v in stats[name].items() if k != "answers"} for name, _ in conditions}},
          open(os.path.join(work, "accuracy.json"), "w"))
PYEOF
  kill -TERM "$server_pid"
  wait "$server_pid" || rc=$?
  server_pid=
  [ "$rc" = 0 ] || { cat "$log" >&2; fail "erinfer serve exited with status $rc on SIGTERM"; }
}

main() {
  setup
  echo "memory_recall: $N facts (seed $SEED, $FPE per person), embeddings from $MODEL, recall@$K" >&2
  make_task
  build_store
  search_questions
  recall_table
  echo "memory_recall: answers by erinfer serve --memory $work/store.db --memory-rounds 0 on $MODEL${SERVE_FLAGS:+ $SERVE_FLAGS}," \
    "every question with and without the recall (greedy, at most $MAX_TOKENS tokens)" >&2
  answer_accuracy
}

main "$@"
