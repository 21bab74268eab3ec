// erinfer memory's store (erinfer/memory.h, part of the erinfer program like serve, whose tests live here too):
// files created, reopened and refused; entries added, read, listed with filters and deleted; BM25 against SQLite's
// own bm25() ordering; the vector scan against a brute-force reference (scripts/memory_ref.py, numpy) and its SIMD
// kernels against the portable one; the reciprocal rank fusion on a hand-checked case; a kill during inserts; the
// JSONL import; and the commands end to end through $ER_BUILD/erinfer.
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "erinfer/memory.h"
#include "tests/common/helpers.h"

static char *tmp; // per test

static void setup(void) { tmp = helper_tmpdir("memtest"); }
static void teardown(void) {
    helper_rmdir(tmp);
    er_free(tmp);
}

TestSuite(memory, .init = setup, .fini = teardown);

static char *tpath(const char *name) {
    char *p = path_join(tmp, name);
    cr_assert(p);
    return p;
}

static MemStore *open_ok(const char *path, int create, int dim, MemVecType t) {
    MemStore *s = NULL;
    cr_assert_eq(mem_open(&s, path, create, dim, t), ER_OK, "%s", er_last_error());
    return s;
}

static void expect_open_error(const char *path, const char *needle) {
    MemStore *s = NULL;
    cr_assert_lt(mem_open(&s, path, 0, 0, MEM_VEC_INT8), 0, "%s opened", path);
    cr_assert_null(s);
    const char *e = er_last_error();
    cr_assert(strstr(e, path), "error \"%s\" does not name %s", e, path);
    cr_assert(strstr(e, needle), "error \"%s\" does not mention \"%s\"", e, needle);
    cr_assert_null(strchr(e, '\n'), "error \"%s\" is not one line", e);
}

static void random_vec(ErRng *r, float *v, int dim) {
    for (int j = 0; j < dim; j++)
        v[j] = rng_normal(r);
}

static int64_t add_ok(MemStore *s, const char *text, const char *meta, const float *vec) {
    int64_t id = 0;
    cr_assert_eq(mem_add(s, text, meta, vec, &id), ER_OK, "%s", er_last_error());
    return id;
}

// ---- files ----

Test(memory, create_and_reopen) {
    char *p = tpath("m.db");
    MemStore *s = open_ok(p, 1, 8, MEM_VEC_F16);
    cr_assert_eq(mem_dim(s), 8);
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t id = add_ok(s, "first note", "{\"tag\":\"a\"}", v);
    mem_close(s);
    s = open_ok(p, 0, 0, MEM_VEC_INT8); // an existing store keeps its own type
    cr_assert_eq(mem_dim(s), 8);
    cr_assert_eq(mem_vec_type(s), MEM_VEC_F16);
    MemEntry e;
    cr_assert_eq(mem_get(s, id, &e), ER_OK, "%s", er_last_error());
    cr_assert_str_eq(e.text, "first note");
    cr_assert_str_eq(e.metadata, "{\"tag\":\"a\"}");
    cr_assert(e.has_vec);
    cr_assert(fabs(e.created - (double)time(NULL)) < 60.0);
    mem_entry_free(&e);
    mem_close(s);
    MemStore *bad = NULL;
    cr_assert_eq(mem_open(&bad, p, 0, 16, MEM_VEC_INT8), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "8-dim"), "%s", er_last_error());
    // A store created without a dimension takes its first vector's.
    char *q = tpath("later.db");
    s = open_ok(q, 1, 0, MEM_VEC_INT8);
    add_ok(s, "text only", NULL, NULL);
    MemItem it = {"with a vector", NULL, v, 5, -1.0};
    cr_assert_eq(mem_add_items(s, &it, 1, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(mem_dim(s), 5);
    it.dim = 6;
    cr_assert_eq(mem_add_items(s, &it, 1, NULL), ER_EINVAL);
    mem_close(s);
    s = open_ok(q, 0, 0, MEM_VEC_INT8);
    cr_assert_eq(mem_dim(s), 5);
    mem_close(s);
    er_free(q);
    er_free(p);
}

Test(memory, refuses_missing_foreign_and_corrupt_files) {
    char *missing = tpath("nope.db"), *text = tpath("text.db"), *foreign = tpath("foreign.db");
    char *empty = tpath("empty.db"), *corrupt = tpath("corrupt.db");
    expect_open_error(missing, "no such");
    cr_assert(!path_exists(missing), "opening without create made the file");
    char junk[4096];
    memset(junk, 'x', sizeof junk);
    cr_assert_eq(file_write_atomic(text, junk, sizeof junk), ER_OK);
    expect_open_error(text, "not an erinfer memory store");
    cr_assert_eq(file_write_atomic(empty, "", 0), ER_OK);
    expect_open_error(empty, "not an erinfer memory store");
    // A SQLite database of another program is refused and left as it was (not turned to WAL).
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(foreign, &db), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(db, "CREATE TABLE t(x); INSERT INTO t VALUES (1);", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    char *before, *after;
    size_t nb, na;
    cr_assert_eq(file_read_all(foreign, 1 << 20, &before, &nb), ER_OK);
    expect_open_error(foreign, "application_id");
    cr_assert_eq(file_read_all(foreign, 1 << 20, &after, &na), ER_OK);
    cr_assert(nb == na && !memcmp(before, after, nb), "the foreign file changed");
    er_free(before), er_free(after);
    // A store with a page overwritten in the middle.
    MemStore *s = open_ok(corrupt, 1, 16, MEM_VEC_INT8);
    char t[200];
    for (int i = 0; i < 300; i++) {
        snprintf(t, sizeof t, "entry number %d with some words to fill the pages of the file", i);
        add_ok(s, t, "{\"i\":1}", NULL);
    }
    mem_close(s);
    char *data;
    size_t n;
    cr_assert_eq(file_read_all(corrupt, 64u << 20, &data, &n), ER_OK);
    cr_assert_gt(n, 16384u);
    memset(data + (n / 4096 / 2) * 4096, 0xA5, 4096); // a whole page in the middle, its b-tree header too
    cr_assert_eq(file_write_atomic(corrupt, data, n), ER_OK);
    expect_open_error(corrupt, "corrupt");
    // Its header's magic gone: not SQLite at all.
    memset(data, 0, 16);
    cr_assert_eq(file_write_atomic(corrupt, data, n), ER_OK);
    expect_open_error(corrupt, "not an erinfer memory store");
    er_free(data);
    er_free(missing), er_free(text), er_free(foreign), er_free(empty), er_free(corrupt);
}

// ---- entries ----

static int count_entry(void *ctx, const MemEntry *e) {
    int64_t *ids = ctx;
    ids[++ids[0]] = e->id;
    return ER_OK;
}

static int list_ids(MemStore *s, int64_t off, int64_t lim, const MemFilter *f, int64_t *ids) {
    ids[0] = 0;
    cr_assert_eq(mem_list(s, off, lim, f, count_entry, ids), ER_OK, "%s", er_last_error());
    return (int)ids[0];
}

Test(memory, add_get_delete_list_filters) {
    char *p = tpath("m.db");
    MemStore *s = open_ok(p, 1, 0, MEM_VEC_INT8);
    MemItem items[4] = {
        {"meeting notes about the budget", "{\"tag\":\"work\",\"n\":3}", NULL, 0, 1000.0},
        {"grocery list: milk, eggs", "{\"tag\":\"home\",\"n\":3}", NULL, 0, 2000.0},
        {"the budget for the holidays", "{\"tag\":\"home\",\"ok\":true,\"none\":null}", NULL, 0, 3000.0},
        {"untagged thought", NULL, NULL, 0, 4000.0},
    };
    int64_t ids[4], got[16];
    cr_assert_eq(mem_add_items(s, items, 4, ids), ER_OK, "%s", er_last_error());
    cr_assert(ids[0] < ids[1] && ids[1] < ids[2] && ids[2] < ids[3]);
    int64_t n;
    cr_assert_eq(mem_count(s, &n), ER_OK);
    cr_assert_eq(n, 4);
    cr_assert_eq(list_ids(s, 0, -1, NULL, got), 4);
    cr_assert_eq(list_ids(s, 1, 2, NULL, got), 2);
    cr_assert(got[1] == ids[1] && got[2] == ids[2]);
    MemFilter f;
    mem_filter_init(&f);
    cr_assert_eq(mem_filter_parse(&f, "tag=\"home\""), ER_OK, "%s", er_last_error());
    cr_assert_eq(list_ids(s, 0, -1, &f, got), 2);
    cr_assert(got[1] == ids[1] && got[2] == ids[2]);
    f.since = 2500.0;
    cr_assert_eq(list_ids(s, 0, -1, &f, got), 1);
    cr_assert_eq(got[1], ids[2]);
    mem_filter_free(&f);
    cr_assert_eq(mem_filter_parse(&f, "n=3"), ER_OK);
    f.until = 1500.0;
    cr_assert_eq(list_ids(s, 0, -1, &f, got), 1);
    cr_assert_eq(got[1], ids[0]);
    mem_filter_free(&f);
    // cJSON takes control bytes for white space where SQLite's JSON does not: the value is made canonical.
    cr_assert_eq(mem_filter_parse(&f, "n=3\x0e\x0e"), ER_OK);
    cr_assert_eq(list_ids(s, 0, -1, &f, got), 2, "%s", er_last_error());
    cr_assert(got[1] == ids[0] && got[2] == ids[1]);
    mem_filter_free(&f);
    cr_assert_eq(mem_filter_parse(&f, "ok=true"), ER_OK);
    cr_assert_eq(list_ids(s, 0, -1, &f, got), 1);
    mem_filter_free(&f);
    cr_assert_eq(mem_filter_parse(&f, "none=null"), ER_OK);
    cr_assert_eq(list_ids(s, 0, -1, &f, got), 1);
    cr_assert_eq(got[1], ids[2]);
    mem_filter_free(&f);
    cr_assert_eq(mem_filter_parse(&f, "none= null "), ER_OK);
    cr_assert_eq(list_ids(s, 0, -1, &f, got), 1);
    cr_assert_eq(got[1], ids[2]);
    mem_filter_free(&f);
    // The filters apply to a search too.
    cr_assert_eq(mem_filter_parse(&f, "tag=\"work\""), ER_OK);
    MemHit h[4];
    int nh;
    MemQuery q = {"budget", NULL, 0, &f, 0};
    cr_assert_eq(mem_search(s, &q, h, 4, &nh), ER_OK, "%s", er_last_error());
    cr_assert_eq(nh, 1);
    cr_assert_eq(h[0].id, ids[0]);
    mem_hits_free(h, nh);
    mem_filter_free(&f);
    cr_assert_eq(mem_delete(s, ids[1]), ER_OK, "%s", er_last_error());
    MemEntry e;
    cr_assert_eq(mem_get(s, ids[1], &e), ER_ERANGE);
    cr_assert_eq(mem_delete(s, ids[1]), ER_ERANGE);
    cr_assert(strstr(er_last_error(), p), "%s", er_last_error());
    q.filter = NULL, q.text = "grocery";
    cr_assert_eq(mem_search(s, &q, h, 4, &nh), ER_OK, "%s", er_last_error());
    cr_assert_eq(nh, 0, "a deleted entry is still in the FTS index");
    cr_assert_eq(mem_get(s, ids[3], &e), ER_OK);
    cr_assert_str_eq(e.metadata, "{}");
    cr_assert_eq(e.created, 4000.0);
    mem_entry_free(&e);
    mem_close(s);
    er_free(p);
}

static void expect_error(int rc, const char *needle) {
    cr_assert_lt(rc, 0, "no error (wanted one mentioning \"%s\")", needle);
    cr_assert(strstr(er_last_error(), needle), "error \"%s\" does not mention \"%s\"", er_last_error(), needle);
}

Test(memory, bad_input_is_one_clear_error) {
    char *p = tpath("m.db");
    MemStore *s = open_ok(p, 1, 4, MEM_VEC_INT8);
    float v[4] = {1, 0, 0, 0}, nan4[4] = {1, NAN, 0, 0}, zero[4] = {0};
    expect_error(mem_add(s, "", NULL, NULL, NULL), "empty");
    expect_error(mem_add(s, " \n\t", NULL, NULL, NULL), "empty");
    expect_error(mem_add(s, "x", "{\"a\":", NULL, NULL), "not JSON");
    expect_error(mem_add(s, "x", "[1,2]", NULL, NULL), "JSON object");
    expect_error(mem_add(s, "x", NULL, nan4, NULL), "vector[1]");
    expect_error(mem_add(s, "x", NULL, zero, NULL), "all zeros");
    MemItem it = {"x", NULL, v, 3, -1.0};
    expect_error(mem_add_items(s, &it, 1, NULL), "3-dim");
    // One bad item in a batch: none added.
    MemItem two[2] = {{"good", NULL, v, 4, -1.0}, {"bad", "nope", v, 4, -1.0}};
    expect_error(mem_add_items(s, two, 2, NULL), "not JSON");
    int64_t n;
    cr_assert_eq(mem_count(s, &n), ER_OK);
    cr_assert_eq(n, 0);
    add_ok(s, "a vector entry", NULL, v);
    MemHit h[2];
    int nh;
    MemQuery q = {NULL, v, 3, NULL, 0};
    expect_error(mem_search(s, &q, h, 2, &nh), "3-dim query");
    q.dim = 4, q.vec = nan4;
    expect_error(mem_search(s, &q, h, 2, &nh), "vector[1]");
    q.vec = NULL;
    expect_error(mem_search(s, &q, h, 2, &nh), "needs a text");
    q.text = "x";
    expect_error(mem_search(s, &q, h, 0, &nh), "k = 0");
    MemFilter f;
    mem_filter_init(&f);
    expect_error(mem_filter_parse(&f, "tag=work"), "not a JSON scalar");
    expect_error(mem_filter_parse(&f, "tag=[1]"), "not a JSON scalar");
    expect_error(mem_filter_parse(&f, "=1"), "key");
    expect_error(mem_filter_parse(&f, "a\"b=1"), "quote");
    expect_error(mem_filter_parse(&f, "nothing"), "KEY=VALUE");
    cr_assert_eq(f.n, 0);
    mem_filter_free(&f);
    mem_close(s);
    er_free(p);
}

// ---- BM25 ----

static const char *const WORDS[] = {"apple", "river", "stone", "cloud", "paper", "green", "quick", "silver",
                                    "night", "bread", "tiger", "music", "window", "garden", "light", "storm"};

Test(memory, bm25_ranks_equal_sqlites_own) {
    char *p = tpath("m.db");
    MemStore *s = open_ok(p, 1, 0, MEM_VEC_INT8);
    ErRng r;
    rng_seed(&r, 58);
    char text[512];
    for (int i = 0; i < 60; i++) {
        int len = 0, nw = 3 + (int)rng_below(&r, 12);
        for (int w = 0; w < nw; w++)
            len += snprintf(text + len, sizeof text - (size_t)len, "%s%s", w ? " " : "", WORDS[rng_below(&r, 16)]);
        add_ok(s, text, NULL, NULL);
    }
    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    const char *queries[] = {"apple", "river stone", "tiger music garden", "light", "paper night bread storm"};
    for (int qi = 0; qi < 5; qi++) {
        char *match;
        cr_assert_eq(mem_fts_query(queries[qi], &match), ER_OK);
        sqlite3_stmt *st;
        cr_assert_eq(sqlite3_prepare_v2(db, "SELECT rowid, bm25(entries_fts) FROM entries_fts WHERE entries_fts MATCH ?"
                                            " ORDER BY bm25(entries_fts), rowid LIMIT 10", -1, &st, NULL),
                     SQLITE_OK, "%s", sqlite3_errmsg(db));
        sqlite3_bind_text(st, 1, match, -1, SQLITE_STATIC);
        MemHit h[10];
        int nh, i = 0;
        MemQuery q = {queries[qi], NULL, 0, NULL, 0};
        cr_assert_eq(mem_search(s, &q, h, 10, &nh), ER_OK, "%s", er_last_error());
        cr_assert_gt(nh, 0);
        for (; sqlite3_step(st) == SQLITE_ROW; i++) {
            cr_assert_lt(i, nh, "query \"%s\": SQLite ranks more entries", queries[qi]);
            cr_assert_eq(h[i].id, sqlite3_column_int64(st, 0), "query \"%s\" rank %d", queries[qi], i + 1);
            cr_assert_eq(h[i].bm25, sqlite3_column_double(st, 1));
            cr_assert_eq(h[i].bm25_rank, i + 1);
        }
        cr_assert_eq(i, nh);
        sqlite3_finalize(st);
        mem_hits_free(h, nh);
        er_free(match);
    }
    sqlite3_close(db);
    // FTS5 syntax in a user's text is just text.
    const char *hostile[] = {"\"", "AND OR NOT", "apple*", "(river", "col:stone", "NEAR(a b)", "^x", "a\"\"b", "-", "'"};
    for (int i = 0; i < 10; i++) {
        MemHit h[3];
        int nh;
        MemQuery q = {hostile[i], NULL, 0, NULL, 0};
        cr_assert_eq(mem_search(s, &q, h, 3, &nh), ER_OK, "\"%s\": %s", hostile[i], er_last_error());
        mem_hits_free(h, nh);
    }
    mem_close(s);
    er_free(p);
}

// ---- the vector scan ----

// A store of n random int8 vectors (dim not a multiple of the scan's 64) and its ids.
static MemStore *random_store(const char *p, int n, int dim, MemVecType t, uint64_t seed) {
    MemStore *s = open_ok(p, 1, dim, t);
    ErRng r;
    rng_seed(&r, seed);
    MemItem *it = er_calloc((size_t)n, sizeof *it);
    float *v = er_alloc(sizeof(float) * (size_t)n * (size_t)dim);
    for (int i = 0; i < n; i++) {
        random_vec(&r, v + (size_t)i * (size_t)dim, dim);
        it[i] = (MemItem){i % 7 ? "entry" : "special entry", NULL, v + (size_t)i * (size_t)dim, dim, -1.0};
    }
    cr_assert_eq(mem_add_items(s, it, n, NULL), ER_OK, "%s", er_last_error());
    er_free(it), er_free(v);
    return s;
}

static int have_numpy(void) { return system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0; }

Test(memory, vector_scan_equals_numpy_brute_force) {
    if (!have_numpy())
        cr_skip_test("!!!!!! /usr/bin/python3 has no numpy: the brute-force vector reference is SKIPPED !!!!!!");
    const int n = 3000, dim = 96, k = 25;
    char *p = tpath("v.db"), *qp = tpath("q.json");
    MemStore *s = random_store(p, n, dim, MEM_VEC_INT8, 7);
    ErRng r;
    rng_seed(&r, 99);
    for (int t = 0; t < 4; t++) {
        float v[96], y[96], scale;
        int8_t codes[96];
        random_vec(&r, v, dim);
        cr_assert_eq(mem_vec_normalize(v, dim, y), ER_OK);
        mem_quantize_i8(y, dim, codes, &scale);
        FILE *fp = fopen(qp, "w");
        cr_assert(fp);
        fprintf(fp, "{\"scale\": %.9g, \"codes\": [", (double)scale);
        for (int j = 0; j < dim; j++)
            fprintf(fp, "%s%d", j ? "," : "", codes[j]);
        fputs("]}\n", fp);
        fclose(fp);
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 scripts/memory_ref.py '%s' '%s' %d", p, qp, k);
        FILE *pp = popen(cmd, "r");
        cr_assert(pp);
        int64_t want[25];
        int nw = 0;
        long long id;
        while (nw < k && fscanf(pp, "%lld", &id) == 1)
            want[nw++] = id;
        cr_assert_eq(pclose(pp), 0, "%s failed", cmd);
        cr_assert_eq(nw, k);
        MemHit h[25];
        int nh;
        MemQuery q = {NULL, v, dim, NULL, k};
        cr_assert_eq(mem_search(s, &q, h, k, &nh), ER_OK, "%s", er_last_error());
        cr_assert_eq(nh, k);
        for (int i = 0; i < k; i++) {
            cr_assert_eq(h[i].id, want[i], "query %d rank %d: store %lld, numpy %lld", t, i + 1, (long long)h[i].id,
                         (long long)want[i]);
            cr_assert_eq(h[i].vec_rank, i + 1);
        }
        mem_hits_free(h, nh);
    }
    mem_close(s);
    er_free(p), er_free(qp);
}

// The same ranking in C from the stored blobs, whatever Python has: int8 and fp16 stores, with a filter.
static void check_against_c(MemVecType t) {
    const int n = 2500, dim = 70, k = 10;
    char *p = tpath("c.db");
    MemStore *s = random_store(p, n, dim, t, 11);
    ErRng r;
    rng_seed(&r, 5);
    float v[70], y[70], qs;
    int8_t qc[70];
    random_vec(&r, v, dim);
    cr_assert_eq(mem_vec_normalize(v, dim, y), ER_OK);
    mem_quantize_i8(y, dim, qc, &qs);
    sqlite3 *db;
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(db, "SELECT id, vec FROM entries WHERE text = 'special entry' ORDER BY id", -1,
                                    &st, NULL), SQLITE_OK);
    double best[10];
    int64_t best_id[10];
    int nb = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *b = sqlite3_column_blob(st, 1);
        double sc = 0.0;
        if (t == MEM_VEC_INT8) {
            float scale;
            memcpy(&scale, b, 4);
            int32_t d = 0;
            for (int j = 0; j < dim; j++)
                d += (int8_t)b[4 + j] * qc[j];
            sc = (double)d * (double)scale * (double)qs;
        } else {
            for (int j = 0; j < dim; j++) {
                uint16_t h;
                memcpy(&h, b + 2 * j, 2);
                sc += (double)f16_to_f32(h) * y[j];
            }
        }
        int at = nb < k ? nb++ : k;
        while (at > 0 && best[at - 1] < sc) {
            if (at < k)
                best[at] = best[at - 1], best_id[at] = best_id[at - 1];
            at--;
        }
        if (at < k)
            best[at] = sc, best_id[at] = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    MemFilter f;
    mem_filter_init(&f);
    MemHit h[10];
    int nh;
    MemQuery q = {NULL, v, dim, &f, 0};
    cr_assert_eq(mem_search(s, &q, h, k, &nh), ER_OK, "%s", er_last_error()); // vectors in memory now
    cr_assert_eq(nh, k);
    mem_hits_free(h, nh);
    // Only the "special" entries, marked by another connection: the filter goes through the scan's mask.
    cr_assert_eq(sqlite3_open(p, &db), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(db, "UPDATE entries SET metadata = '{\"special\":true}' WHERE text = 'special entry'",
                              NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    cr_assert_eq(mem_filter_parse(&f, "special=true"), ER_OK);
    cr_assert_eq(mem_search(s, &q, h, k, &nh), ER_OK, "%s", er_last_error());
    cr_assert_eq(nh, k);
    for (int i = 0; i < k; i++) {
        cr_assert_eq(h[i].id, best_id[i], "rank %d: %lld, reference %lld", i + 1, (long long)h[i].id,
                     (long long)best_id[i]);
        cr_assert(fabs(h[i].vec_score - best[i]) <= (t == MEM_VEC_INT8 ? 0.0 : 1e-5), "rank %d: %.9g vs %.9g", i + 1,
                  h[i].vec_score, best[i]);
    }
    mem_hits_free(h, nh);
    mem_filter_free(&f);
    mem_close(s);
    er_free(p);
}

Test(memory, vector_scan_equals_c_reference_int8) { check_against_c(MEM_VEC_INT8); }
Test(memory, vector_scan_equals_c_reference_f16) { check_against_c(MEM_VEC_F16); }

Test(memory, simd_kernels_equal_portable) {
    const int n = 37, dim = 192;
    ErRng r;
    rng_seed(&r, 3);
    int8_t *rows = er_alloc((size_t)n * dim), q[192];
    uint16_t *h = er_alloc(sizeof *h * (size_t)n * dim);
    float qf[192];
    for (int i = 0; i < n * dim; i++) {
        rows[i] = (int8_t)((int)rng_below(&r, 255) - 127);
        h[i] = f32_to_f16(rng_normal(&r));
    }
    rows[0] = rows[1] = 127, rows[2] = -127; // the extremes
    for (int j = 0; j < dim; j++) {
        q[j] = (int8_t)((int)rng_below(&r, 255) - 127);
        qf[j] = rng_normal(&r);
    }
    q[0] = 127, q[1] = -127, q[2] = -127;
    int32_t want[37], got[37];
    float fwant[37], fgot[37];
    const char *picked;
    MemDotI8Fn port = mem_scan_kernel("portable", &picked);
    cr_assert(port);
    port(rows, n, dim, q, want);
    for (int i = 0; i < n; i++) {
        int32_t d = 0;
        for (int j = 0; j < dim; j++)
            d += rows[i * dim + j] * q[j];
        cr_assert_eq(want[i], d);
    }
    mem_scan_kernel_f16("portable", NULL)(h, n, dim, qf, fwant);
    const char *sets[] = {"avx2", "avx512"};
    int ran = 0;
    for (int k = 0; k < 2; k++) {
        MemDotI8Fn fn = mem_scan_kernel(sets[k], &picked);
        if (!fn) {
            cr_log_warn("memory scan: no %s kernel on this CPU: not compared", sets[k]);
            continue;
        }
        fn(rows, n, dim, q, got);
        for (int i = 0; i < n; i++)
            cr_assert_eq(got[i], want[i], "%s row %d: %d vs %d", sets[k], i, got[i], want[i]);
        ran++;
    }
    MemDotF16Fn f16 = mem_scan_kernel_f16("avx2", NULL);
    if (f16) {
        f16(h, n, dim, qf, fgot);
        for (int i = 0; i < n; i++)
            cr_assert(fabsf(fgot[i] - fwant[i]) <= 1e-4f * (1.0f + fabsf(fwant[i])), "f16 row %d", i);
    }
#if defined(__x86_64__)
    cr_assert_gt(ran, 0, "no SIMD kernel ran on an x86-64 CPU");
#endif
    // ER_SIMD=portable is honoured when nothing is named.
    setenv("ER_SIMD", "portable", 1);
    cr_assert_eq(mem_scan_kernel(NULL, &picked), port);
    cr_assert_str_eq(picked, "portable");
    unsetenv("ER_SIMD");
    er_free(rows), er_free(h);
}

// ---- fusion ----

// BM25 for "apple": entry 1 (three apples in four words) before entry 2 (one in two); entry 3 has none. Vectors
// against (1, 0): 1 (cos 1), 3 (0.8), 2 (0.6). Fused: 1: 1/61 + 1/61; 2: 1/62 + 1/63; 3: 1/62.
Test(memory, reciprocal_rank_fusion_by_hand) {
    char *p = tpath("f.db");
    MemStore *s = open_ok(p, 1, 2, MEM_VEC_INT8);
    float a[2] = {1, 0}, b[2] = {0.6f, 0.8f}, c[2] = {0.8f, 0.6f};
    int64_t i1 = add_ok(s, "apple apple apple banana", NULL, a);
    int64_t i2 = add_ok(s, "apple cherry", NULL, b);
    int64_t i3 = add_ok(s, "durian", NULL, c);
    MemHit h[5];
    int nh;
    MemQuery q = {"apple", a, 2, NULL, 0};
    cr_assert_eq(mem_search(s, &q, h, 5, &nh), ER_OK, "%s", er_last_error());
    cr_assert_eq(nh, 3);
    cr_assert_eq(h[0].id, i1);
    cr_assert_eq(h[1].id, i2);
    cr_assert_eq(h[2].id, i3);
    cr_assert(h[0].bm25_rank == 1 && h[0].vec_rank == 1);
    cr_assert(h[1].bm25_rank == 2 && h[1].vec_rank == 3);
    cr_assert(h[2].bm25_rank == 0 && h[2].vec_rank == 2 && isnan(h[2].bm25));
    cr_assert(fabs(h[0].fused - (1.0 / 61 + 1.0 / 61)) < 1e-15);
    cr_assert(fabs(h[1].fused - (1.0 / 62 + 1.0 / 63)) < 1e-15);
    cr_assert(fabs(h[2].fused - 1.0 / 62) < 1e-15);
    cr_assert(fabs(h[0].vec_score - 1.0) < 1e-6 && fabs(h[2].vec_score - 0.8) < 0.01);
    cr_assert_str_eq(h[1].text, "apple cherry");
    mem_hits_free(h, nh);
    // Text alone is BM25 alone; a vector alone, the vectors.
    q.vec = NULL;
    cr_assert_eq(mem_search(s, &q, h, 5, &nh), ER_OK);
    cr_assert(nh == 2 && h[0].id == i1 && h[1].id == i2 && h[1].vec_rank == 0 && isnan(h[1].vec_score));
    mem_hits_free(h, nh);
    q.vec = a, q.text = NULL;
    cr_assert_eq(mem_search(s, &q, h, 2, &nh), ER_OK);
    cr_assert(nh == 2 && h[0].id == i1 && h[1].id == i3 && h[0].bm25_rank == 0);
    mem_hits_free(h, nh);
    // An entry without a vector is found by BM25 and skipped by the scan.
    int64_t i4 = add_ok(s, "apple pie", NULL, NULL);
    q.text = "pie"; // i4 first by BM25 alone, i1 first by the vectors alone: 1/61 each, the smaller id first
    cr_assert_eq(mem_search(s, &q, h, 5, &nh), ER_OK);
    cr_assert(nh == 4 && h[0].id == i1 && h[1].id == i4 && h[1].vec_rank == 0 && h[1].bm25_rank == 1);
    cr_assert(h[0].fused == h[1].fused && h[2].fused < h[1].fused);
    mem_hits_free(h, nh);
    mem_close(s);
    er_free(p);
}

// ---- a kill during inserts ----

Test(memory, kill_during_inserts_loses_nothing_committed) {
    char *p = tpath("k.db");
    mem_close(open_ok(p, 1, 8, MEM_VEC_INT8));
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(fd[0]);
        MemStore *s = NULL;
        if (mem_open(&s, p, 0, 8, MEM_VEC_INT8) < 0)
            _exit(2);
        float v[8];
        char text[64];
        for (int i = 0;; i++) {
            for (int j = 0; j < 8; j++)
                v[j] = (float)((i * 7 + j * 3) % 11) - 5.0f + 0.5f;
            snprintf(text, sizeof text, "entry %d", i);
            int64_t id;
            if (mem_add(s, text, "{\"i\":1}", v, &id) < 0)
                _exit(3);
            if (write(fd[1], &id, sizeof id) != sizeof id) // reported only once committed
                _exit(4);
        }
    }
    close(fd[1]);
    int64_t ids[4096];
    int n = 0;
    while (n < 150 && read(fd[0], &ids[n], sizeof ids[n]) == sizeof ids[n])
        n++;
    cr_assert_eq(n, 150, "the child stopped after %d inserts", n);
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the child was not killed (status %d)", st);
    while (n < 4096 && read(fd[0], &ids[n], sizeof ids[n]) == sizeof ids[n])
        n++;
    close(fd[0]);
    MemStore *s = open_ok(p, 0, 0, MEM_VEC_INT8);
    for (int i = 0; i < n; i++) {
        MemEntry e;
        cr_assert_eq(mem_get(s, ids[i], &e), ER_OK, "id %lld was reported committed: %s", (long long)ids[i],
                     er_last_error());
        cr_assert(e.has_vec);
        mem_entry_free(&e);
    }
    int64_t count;
    cr_assert_eq(mem_count(s, &count), ER_OK);
    cr_assert(count >= n && count <= n + 1, "%lld entries, %d reported", (long long)count, n);
    MemHit h[3];
    int nh;
    MemQuery q = {"entry", NULL, 0, NULL, 0};
    cr_assert_eq(mem_search(s, &q, h, 3, &nh), ER_OK, "%s", er_last_error());
    cr_assert_eq(nh, 3);
    mem_hits_free(h, nh);
    mem_close(s);
    er_free(p);
}

// ---- import ----

static void write_text(const char *path, const char *text) {
    cr_assert_eq(file_write_atomic(path, text, strlen(text)), ER_OK, "%s", er_last_error());
}

Test(memory, import_jsonl_all_or_nothing) {
    char *p = tpath("i.db"), *good = tpath("good.jsonl"), *bad = tpath("bad.jsonl");
    MemStore *s = open_ok(p, 1, 0, MEM_VEC_INT8);
    write_text(good, "{\"text\": \"one\"}\n\n{\"text\": \"two\", \"metadata\": {\"tag\": \"x\"}}\n"
                     "{\"text\": \"three\", \"created\": 1700000000.5, \"metadata\": null}\n");
    int64_t n = 0;
    cr_assert_eq(mem_import(s, good, NULL, NULL, &n), ER_OK, "%s", er_last_error());
    cr_assert_eq(n, 3);
    const char *lines[] = {
        "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": \"broken\"\n",
        "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"metadata\": {}}\n",
        "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": \"x\", \"metadata\": [1]}\n",
        "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": \"x\", \"created\": -1}\n",
        "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": \"x\", \"tags\": 1}\n",
        "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": \"  \"}\n",
        "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n[1, 2]\n",
    };
    const char *needles[] = {"", "text", "metadata", "created", "tags", "empty", "object"};
    char want[600];
    snprintf(want, sizeof want, "%s:3", bad);
    for (int i = 0; i < 7; i++) {
        write_text(bad, lines[i]);
        int rc = mem_import(s, bad, NULL, NULL, &n);
        cr_assert_lt(rc, 0, "case %d imported", i);
        const char *e = er_last_error();
        cr_assert(strstr(e, want) && strstr(e, needles[i]), "case %d: \"%s\" (want %s and \"%s\")", i, e, want,
                  needles[i]);
        int64_t count;
        cr_assert_eq(mem_count(s, &count), ER_OK);
        cr_assert_eq(count, 3, "case %d: half imported (%lld entries)", i, (long long)count);
    }
    MemEntry e;
    int64_t ids[8];
    cr_assert_eq(list_ids(s, 2, 1, NULL, ids), 1);
    cr_assert_eq(mem_get(s, ids[1], &e), ER_OK);
    cr_assert_eq(e.created, 1700000000.5);
    mem_entry_free(&e);
    mem_close(s);
    er_free(p), er_free(good), er_free(bad);
}

// ---- the commands ----

Test(memory, cli_end_to_end) {
    char *prog = helper_program("erinfer");
    helper_need_program(prog, "erinfer", "the erinfer memory command tests are");
    char *db = tpath("cli.db"), *jl = tpath("in.jsonl");
    CmdResult r = helper_run(tmp, "%s memory add --db '%s' --text 'the cat sat on the mat' --metadata "
                                  "'{\"tag\":\"pets\"}' --json", prog, db);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_str_eq(r.out, "{\"id\":1}\n");
    helper_result_free(&r);
    write_text(jl, "{\"text\": \"dogs chase cats\", \"metadata\": {\"tag\": \"pets\"}, \"created\": 100}\n"
                   "{\"text\": \"tax forms are due\", \"metadata\": {\"tag\": \"work\"}}\n");
    r = helper_run(tmp, "%s memory import '%s' --db '%s'", prog, jl, db);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "added 2"), "%s", r.out);
    helper_result_free(&r);
    r = helper_run(tmp, "%s memory search --db '%s' --query 'cat' --json", prog, db);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_eq(helper_count_lines(r.out), 1, "%s", r.out);
    cJSON *j = cJSON_Parse(r.out);
    cr_assert(j);
    cr_assert_eq(cJSON_GetObjectItem(j, "id")->valuedouble, 1);
    cr_assert_eq(cJSON_GetObjectItem(j, "bm25_rank")->valuedouble, 1);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "metadata"), "tag")->valuestring, "pets");
    cJSON_Delete(j);
    helper_result_free(&r);
    r = helper_run(tmp, "%s memory list --db '%s' --where 'tag=\"pets\"' --since 1000 --json", prog, db);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_eq(helper_count_lines(r.out), 1, "%s", r.out);
    helper_result_free(&r);
    r = helper_run(tmp, "%s memory list --db '%s' --where 'tag=\"pets\"' --until 1970-01-01T00:02", prog, db);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(!strncmp(r.out, "2\t100.000\tdogs chase cats", 25), "%s", r.out);
    helper_result_free(&r);
    r = helper_run(tmp, "%s memory delete --db '%s' --id 2", prog, db);
    cr_assert_eq(r.status, 0, "%s", r.err);
    helper_result_free(&r);
    r = helper_run(tmp, "%s memory list --db '%s'", prog, db);
    cr_assert_eq(helper_count_lines(r.out), 2, "%s", r.out);
    helper_result_free(&r);
    r = helper_run(tmp, "%s memory", prog);
    cr_assert(strstr(r.out, "search") || strstr(r.err, "search"), "%s%s", r.out, r.err);
    helper_result_free(&r);
    r = helper_run(tmp, "%s memory search --help", prog);
    cr_assert_eq(r.status, 0);
    cr_assert(strstr(r.out, "--where"), "%s", r.out);
    helper_result_free(&r);
    // Errors: one line each.
    r = helper_run(tmp, "%s memory delete --db '%s' --id 2", prog, db);
    helper_expect_error(&r, "delete twice", "no entry 2");
    r = helper_run(tmp, "%s memory search --db '%s/none.db' --query x", prog, tmp);
    helper_expect_error(&r, "missing store", "no such memory store");
    r = helper_run(tmp, "%s memory add --db '%s' --text x --metadata '[1]'", prog, db);
    helper_expect_error(&r, "bad metadata", "JSON object");
    r = helper_run(tmp, "%s memory list --db '%s' --where tag=pets", prog, db);
    helper_expect_error(&r, "bad filter", "JSON scalar");
    r = helper_run(tmp, "%s memory search --db '%s' --query x --model '%s'", prog, db, tmp);
    helper_expect_error(&r, "--model without a model", "config.json");
    write_text(jl, "{\"text\": \"fine\"}\n{\"txt\": \"typo\"}\n");
    r = helper_run(tmp, "%s memory import '%s' --db '%s'", prog, jl, db);
    helper_expect_error(&r, "bad import", "in.jsonl:2");
    r = helper_run(tmp, "%s memory list --db '%s'", prog, db);
    cr_assert_eq(helper_count_lines(r.out), 2, "a failed import added entries:\n%s", r.out);
    helper_result_free(&r);
    er_free(db), er_free(jl), er_free(prog);
}

// With --model the entries and the query are embedded (er_embed): an entry whose text is the query is the vector
// scan's first hit, with a cosine of 1 (int8 rounding apart).
Test(memory, cli_with_embeddings) {
    char *prog = helper_program("erinfer");
    helper_need_program(prog, "erinfer", "the erinfer memory command tests are");
    char *db = tpath("vec.db"), *model = tpath("model");
    helper_make_model(model);
    static const char *const texts[3] = {"the cat sat on the mat", "tax forms are due", "dogs chase cats"};
    for (int i = 0; i < 3; i++) {
        CmdResult r = helper_run(tmp, "%s memory add --db '%s' --text '%s' --model '%s'", prog, db, texts[i], model);
        cr_assert_eq(r.status, 0, "%s", r.err);
        helper_result_free(&r);
    }
    CmdResult r = helper_run(tmp, "%s memory search --db '%s' --query 'tax forms are due' --model '%s' --json", prog,
                             db, model);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cJSON *j = cJSON_Parse(r.out); // the first line: the best fused hit
    cr_assert(j, "%s", r.out);
    cr_expect_eq(cJSON_GetObjectItem(j, "id")->valuedouble, 2, "%s", r.out);
    cr_expect_eq(cJSON_GetObjectItem(j, "vector_rank")->valuedouble, 1, "%s", r.out);
    cr_expect_float_eq(cJSON_GetObjectItem(j, "vector_score")->valuedouble, 1.0, 0.02, "%s", r.out);
    cJSON_Delete(j);
    helper_result_free(&r);
    er_free(db), er_free(model), er_free(prog);
}
