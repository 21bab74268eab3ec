// fuzz_memory: erinfer memory's store inputs (erinfer/memory.h). The input is FILTERS FUZZ_SEP JSONL (no separator:
// all JSONL): each line of FILTERS is a --where spec for mem_filter_parse and, as it is, a search text; JSONL is
// imported by mem_import into a fresh in-memory store. An import adds every line or none (a refused one names
// in.jsonl:LINE); the filters and texts then run through list and search, which may refuse nothing but out of
// memory once the filter parsed.
#include "tests/fuzz/fuzz_common.h"

#include <math.h>

#include "core/alloc.h"
#include "core/error.h"
#include "erinfer/memory.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_root_dir("memory");
    return 0;
}

static int count_cb(void *ctx, const MemEntry *e) {
    FUZZ_CHECK(e->text && e->text[0] && e->metadata && e->metadata[0] == '{', "entry %lld", (long long)e->id);
    (*(int64_t *)ctx)++;
    return ER_OK;
}

static void check_import(MemStore *s, const char *path) {
    int64_t added = -1, n = 0;
    int rc = mem_import(s, path, NULL, NULL, &added);
    FUZZ_CHECK(mem_count(s, &n) == ER_OK, "count: %s", er_last_error());
    if (rc < 0) {
        FUZZ_CHECK(n == 0, "a refused import left %lld entries", (long long)n);
        FUZZ_CHECK(rc == ER_ENOMEM || strstr(er_last_error(), "in.jsonl:"), "error without file:line: %s",
                   er_last_error());
        fuzz_refused("import");
        return;
    }
    FUZZ_CHECK(added == n, "import said %lld, the store has %lld", (long long)added, (long long)n);
}

// One filter line: parsed (or refused with a message), then listed and searched with.
static void check_filter(MemStore *s, const char *line) {
    MemFilter f;
    mem_filter_init(&f);
    if (mem_filter_parse(&f, line) < 0) {
        FUZZ_CHECK(er_last_error()[0], "a refused filter without a message");
        fuzz_refused("filter");
    }
    int64_t listed = 0, all = 0;
    int rc = mem_list(s, 0, -1, &f, count_cb, &listed);
    FUZZ_CHECK(rc == ER_OK || rc == ER_ENOMEM, "list: %s", er_last_error());
    FUZZ_CHECK(mem_count(s, &all) == ER_OK && listed <= all, "listed %lld of %lld", (long long)listed,
               (long long)all);
    MemHit hits[4];
    int n = 0;
    MemQuery q = {line, NULL, 0, &f, 0};
    rc = mem_search(s, &q, hits, 4, &n);
    FUZZ_CHECK(rc == ER_OK || rc == ER_ENOMEM || !line[0], "search \"%s\": %s", line, er_last_error());
    for (int i = 0; i < n; i++)
        FUZZ_CHECK(hits[i].bm25_rank == i + 1 && hits[i].text, "hit %d", i);
    mem_hits_free(hits, n);
    mem_filter_free(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *parts[2];
    size_t lens[2];
    int found = fuzz_split(data, size, parts, lens, 2);
    const uint8_t *jl = found == 2 ? parts[1] : parts[0];
    size_t jn = found == 2 ? lens[1] : lens[0];
    fuzz_write("in.jsonl", jl, jn);
    char path[FUZZ_PATH_MAX];
    fuzz_path(path, "in.jsonl");
    MemStore *s = NULL;
    FUZZ_CHECK(mem_open(&s, ":memory:", 1, 0, MEM_VEC_INT8) == ER_OK, "open: %s", er_last_error());
    check_import(s, path);
    if (found == 2) {
        char *filters = fuzz_strndup(parts[0], lens[0]);
        for (char *line = filters, *next; line && *line; line = next) {
            next = strchr(line, '\n');
            if (next)
                *next++ = 0;
            check_filter(s, line);
        }
        free(filters);
    }
    mem_close(s);
    return 0;
}
