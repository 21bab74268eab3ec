#!/usr/bin/env bash
# Recall of erinfer memory's search on the synthetic memory task (docs/memory.md#recall-on-a-synthetic-task):
# `ertrain synth memory` writes facts about made-up people and one paraphrasing question per fact, the facts go into
# a fresh store with vectors (`erinfer memory import --model`), every question is searched, and the question's fact
# counts as found by a method when it is among that method's best K: BM25 alone, the vectors alone, and their
# reciprocal rank fusion (what `erinfer memory search --k K` returns). Prints a table (method, recall@K, n) and exits
# non-zero when a step fails or a result does not add up.
#
#   scripts/memory_recall.sh            (from anywhere; make memory-recall builds the programs first)
# Env: BUILD (dir of ertrain and erinfer, default build), MODEL (the embedding model, default models/tiny-base),
#      N (facts, default 200), SEED (1), FPE (facts per person, 8), K (5), PY (python3), KEEP=1 (keep the scratch
#      dir and say where it is).
#
# One function per section; main runs them in order on one scratch dir ($work, removed on exit by the trap). Each
# section writes what the next reads into $work: task/ (facts.jsonl, questions.jsonl), store.db, lists/ and top/
# (the searches), recall.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BUILD=${BUILD:-build}
MODEL=${MODEL:-models/tiny-base}
N=${N:-200}
SEED=${SEED:-1}
FPE=${FPE:-8}
K=${K:-5}
PY=${PY:-python3}

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

main() {
  setup
  echo "memory_recall: $N facts (seed $SEED, $FPE per person), embeddings from $MODEL, recall@$K" >&2
  make_task
  build_store
  search_questions
  recall_table
}

main "$@"
