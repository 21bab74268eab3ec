// The memory store's search (erinfer/memory.h): BM25 from FTS5, the exact vector scan over the vectors held in
// memory, and reciprocal rank fusion of the two lists.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "erinfer/memory_impl.h"

// ---- the vectors in memory ----

void mem_cache_free(MemStore *s) {
    er_free(s->ids);
    er_free(s->rows);
    er_free(s->scales);
    s->ids = NULL, s->rows = NULL, s->scales = NULL;
    s->n = s->cap = 0;
    s->cache_ok = 0;
}

static size_t row_bytes(const MemStore *s) { return (size_t)s->dpad * (s->type == MEM_VEC_INT8 ? 1 : 2); }

static int cache_reserve(MemStore *s, int need) {
    if (need <= s->cap)
        return ER_OK;
    int cap = s->cap ? s->cap : 256;
    while (cap < need)
        cap = cap > (1 << 29) ? need : 2 * cap;
    int64_t *ids = er_calloc((size_t)cap, sizeof *ids);
    void *rows = er_calloc((size_t)cap, row_bytes(s));
    float *scales = er_calloc((size_t)cap, sizeof *scales);
    if (!ids || !rows || !scales) {
        er_free(ids), er_free(rows), er_free(scales);
        return er_error(ER_ENOMEM, "%s: no memory for %d vectors of %d dims", s->path, cap, s->dim);
    }
    if (s->n) {
        memcpy(ids, s->ids, sizeof *ids * (size_t)s->n);
        memcpy(rows, s->rows, row_bytes(s) * (size_t)s->n);
        memcpy(scales, s->scales, sizeof *scales * (size_t)s->n);
    }
    er_free(s->ids), er_free(s->rows), er_free(s->scales);
    s->ids = ids, s->rows = rows, s->scales = scales, s->cap = cap;
    return ER_OK;
}

// Row n from a stored blob: codes (or fp16 bits) then zeros to dpad.
static void cache_put(MemStore *s, int i, int64_t id, const void *blob) {
    char *row = (char *)s->rows + row_bytes(s) * (size_t)i;
    memset(row, 0, row_bytes(s));
    if (s->type == MEM_VEC_INT8) {
        memcpy(&s->scales[i], blob, 4);
        memcpy(row, (const char *)blob + 4, (size_t)s->dim);
    } else {
        memcpy(row, blob, 2 * (size_t)s->dim);
    }
    s->ids[i] = id;
}

int mem_cache_append(MemStore *s, int64_t id, const void *blob) {
    if (!s->cache_ok)
        return ER_OK;
    if (s->dpad == 0 || (s->n && s->ids[s->n - 1] >= id)) {
        s->cache_ok = 0;
        return ER_OK;
    }
    ER_TRY(cache_reserve(s, s->n + 1));
    cache_put(s, s->n++, id, blob);
    return ER_OK;
}

void mem_cache_remove(MemStore *s, int64_t id) {
    int lo = 0, hi = s->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (s->ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (!s->cache_ok || lo >= s->n || s->ids[lo] != id)
        return;
    size_t rb = row_bytes(s), tail = (size_t)(s->n - lo - 1);
    memmove(&s->ids[lo], &s->ids[lo + 1], tail * sizeof *s->ids);
    memmove(&s->scales[lo], &s->scales[lo + 1], tail * sizeof *s->scales);
    memmove((char *)s->rows + rb * (size_t)lo, (char *)s->rows + rb * (size_t)(lo + 1), tail * rb);
    s->n--;
}

static int64_t data_version(MemStore *s) {
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    if (sqlite3_prepare_v2(s->db, "PRAGMA data_version", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

// Every stored vector into memory, read in one transaction (one snapshot of the file).
static int cache_load(MemStore *s) {
    sqlite3_stmt *st = NULL;
    int rc = ER_OK, src;
    mem_cache_free(s);
    src = sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL);
    if (src != SQLITE_OK)
        ER_CHECK(mem_sql_fail(s, src, "begin a read"));
    ER_CHECK(mem_read_meta(s));
    s->dpad = (s->dim + MEM_SCAN_ALIGN - 1) / MEM_SCAN_ALIGN * MEM_SCAN_ALIGN;
    size_t want = mem_blob_bytes(s->type, s->dim);
    ER_CHECK(mem_prepare(s, "SELECT id, vec FROM entries WHERE vec IS NOT NULL ORDER BY id", &st));
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t id = sqlite3_column_int64(st, 0);
        const void *blob = sqlite3_column_blob(st, 1);
        size_t got = (size_t)sqlite3_column_bytes(st, 1);
        if (s->dim == 0 || got != want)
            ER_CHECK(er_error(ER_EFORMAT, "%s: entry %lld's vector has %zu bytes, not %zu (%s, %d dims)", s->path,
                              (long long)id, got, want, mem_vec_type_name(s->type), s->dim));
        ER_CHECK(cache_reserve(s, s->n + 1));
        cache_put(s, s->n++, id, blob);
    }
    if (src != SQLITE_DONE)
        ER_CHECK(mem_sql_fail(s, src, "read the vectors"));
    s->data_version = data_version(s);
    s->cache_ok = 1;
done:
    sqlite3_finalize(st);
    if (!sqlite3_get_autocommit(s->db))
        sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL);
    if (rc < 0)
        mem_cache_free(s);
    return rc;
}

static int cache_fresh(MemStore *s) {
    if (s->cache_ok && data_version(s) == s->data_version)
        return ER_OK;
    return cache_load(s);
}

// ---- ranked lists ----

typedef struct {
    int64_t id;
    double score; // higher is better
} Ranked;

static int ranked_better(const Ranked *a, const Ranked *b) {
    return a->score > b->score || (a->score == b->score && a->id < b->id);
}

static int ranked_cmp(const void *a, const void *b) {
    return ranked_better(a, b) ? -1 : ranked_better(b, a) ? 1 : 0;
}

// The heap's root is its worst member.
static void heap_down(Ranked *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && ranked_better(&h[w], &h[l]))
            w = l;
        if (r < n && ranked_better(&h[w], &h[r]))
            w = r;
        if (w == i)
            return;
        Ranked t = h[i];
        h[i] = h[w], h[w] = t;
        i = w;
    }
}

static void heap_up(Ranked *h, int i) {
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!ranked_better(&h[p], &h[i]))
            return;
        Ranked t = h[i];
        h[i] = h[p], h[p] = t;
        i = p;
    }
}

// The best depth of n scored rows (skipping NaN scores) into top, best first; returns how many.
static int top_k(const int64_t *ids, const double *score, int n, int depth, Ranked *top) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(score[i]))
            continue;
        Ranked c = {ids[i], score[i]};
        if (m < depth) {
            top[m] = c;
            heap_up(top, m++);
        } else if (ranked_better(&c, &top[0])) {
            top[0] = c;
            heap_down(top, m, 0);
        }
    }
    qsort(top, (size_t)m, sizeof *top, ranked_cmp);
    return m;
}

// allowed[i] = 1 for the cached rows whose entries pass the filter (ids of both ascending).
static int filter_mask(MemStore *s, const MemFilter *f, unsigned char *allowed) {
    StrBuf sql = {0};
    sqlite3_stmt *st = NULL;
    int rc = ER_OK, src, i = 0;
    strbuf_puts(&sql, "SELECT e.id FROM entries e WHERE e.vec IS NOT NULL");
    mem_filter_sql(f, &sql);
    strbuf_puts(&sql, " ORDER BY e.id");
    if (sql.oom)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(mem_prepare(s, sql.p, &st));
    mem_filter_bind(f, st, 1);
    memset(allowed, 0, (size_t)s->n);
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t id = sqlite3_column_int64(st, 0);
        while (i < s->n && s->ids[i] < id)
            i++;
        if (i < s->n && s->ids[i] == id)
            allowed[i++] = 1;
    }
    if (src != SQLITE_DONE)
        ER_CHECK(mem_sql_fail(s, src, "filter entries"));
done:
    sqlite3_finalize(st);
    er_free(sql.p);
    return rc;
}

static int filter_active(const MemFilter *f) { return f && (f->n > 0 || f->since > -INFINITY || f->until < INFINITY); }

// score[i] for every cached row: the int8 codes' exact dot product times both scales, or fp16 x fp32.
static void scan_scores(const MemStore *s, const void *qv, float qscale, double *score) {
    const int block = 256, nb = (s->n + block - 1) / block;
    MemDotI8Fn dot8 = s->type == MEM_VEC_INT8 ? mem_scan_kernel(NULL, NULL) : NULL;
    MemDotF16Fn dot16 = s->type == MEM_VEC_F16 ? mem_scan_kernel_f16(NULL, NULL) : NULL;
#pragma omp parallel for schedule(static) if (nb > 8)
    for (int b = 0; b < nb; b++) {
        int i0 = b * block, m = s->n - i0 < block ? s->n - i0 : block;
        int32_t d8[256];
        float d16[256];
        if (dot8) {
            dot8((const int8_t *)s->rows + (size_t)i0 * (size_t)s->dpad, m, s->dpad, qv, d8);
            for (int i = 0; i < m; i++)
                score[i0 + i] = (double)d8[i] * (double)s->scales[i0 + i] * (double)qscale;
        } else {
            dot16((const uint16_t *)s->rows + (size_t)i0 * (size_t)s->dpad, m, s->dpad, qv, d16);
            for (int i = 0; i < m; i++)
                score[i0 + i] = (double)d16[i];
        }
    }
}

// The vector list: the best depth entries by cosine similarity to q->vec.
static int vec_list(MemStore *s, const MemQuery *q, int depth, Ranked *out, int *n_out) {
    float *y = NULL, qscale = 0.0f;
    void *qv = NULL;
    double *score = NULL;
    unsigned char *allowed = NULL;
    int rc = ER_OK;
    *n_out = 0;
    ER_CHECK(cache_fresh(s));
    if (s->dim == 0 || s->n == 0)
        goto done; // nothing stored has a vector
    if (q->dim != s->dim)
        ER_CHECK(er_error(ER_EINVAL, "%s: a %d-dim query vector for a store of %d-dim vectors", s->path, q->dim,
                          s->dim));
    y = er_calloc((size_t)s->dpad, sizeof *y);
    qv = er_calloc((size_t)s->dpad, sizeof(float));
    score = er_alloc(sizeof *score * (size_t)s->n);
    if (!y || !qv || !score)
        ER_CHECK(ER_ENOMEM);
    rc = mem_vec_normalize(q->vec, q->dim, y);
    if (rc < 0) {
        rc = er_error_prefix(rc, "%s: the query", s->path);
        goto done;
    }
    if (s->type == MEM_VEC_INT8)
        mem_quantize_i8(y, s->dim, qv, &qscale); // the padding stays 0
    else
        memcpy(qv, y, sizeof(float) * (size_t)s->dpad);
    scan_scores(s, qv, qscale, score);
    if (filter_active(q->filter)) {
        if (!(allowed = er_alloc((size_t)s->n)))
            ER_CHECK(ER_ENOMEM);
        ER_CHECK(filter_mask(s, q->filter, allowed));
        for (int i = 0; i < s->n; i++)
            if (!allowed[i])
                score[i] = NAN;
    }
    *n_out = top_k(s->ids, score, s->n, depth, out);
done:
    er_free(y), er_free(qv), er_free(score), er_free(allowed);
    return rc;
}

int mem_fts_query(const char *text, char **out) {
    StrBuf b = {0};
    int words = 0;
    *out = NULL;
    for (const char *p = text ? text : ""; *p;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (!*p)
            break;
        strbuf_puts(&b, words++ ? " OR \"" : "\"");
        for (; *p && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r'; p++)
            strbuf_put(&b, *p == '"' ? "\"\"" : p, *p == '"' ? 2 : 1);
        strbuf_puts(&b, "\"");
    }
    if (b.oom) {
        er_free(b.p);
        return er_error(ER_ENOMEM, "no memory for a search's text");
    }
    *out = b.p;
    return ER_OK;
}

// The BM25 list: FTS5's bm25() ascending (its best first), ids breaking ties; score = -bm25.
static int bm25_list(MemStore *s, const MemQuery *q, int depth, Ranked *out, int *n_out) {
    StrBuf sql = {0};
    sqlite3_stmt *st = NULL;
    char *match = NULL;
    int rc = ER_OK, src, n = 0;
    *n_out = 0;
    ER_CHECK(mem_fts_query(q->text, &match));
    if (!match)
        goto done;
    strbuf_puts(&sql, "SELECT e.id, bm25(entries_fts) AS r FROM entries_fts JOIN entries e ON e.id = entries_fts.rowid"
                      " WHERE entries_fts MATCH ?");
    mem_filter_sql(q->filter, &sql);
    strbuf_puts(&sql, " ORDER BY r, e.id LIMIT ?");
    if (sql.oom)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(mem_prepare(s, sql.p, &st));
    sqlite3_bind_text(st, 1, match, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, mem_filter_bind(q->filter, st, 2), depth);
    while ((src = sqlite3_step(st)) == SQLITE_ROW && n < depth) {
        out[n].id = sqlite3_column_int64(st, 0);
        out[n++].score = -sqlite3_column_double(st, 1);
    }
    if (src != SQLITE_DONE && src != SQLITE_ROW)
        ER_CHECK(mem_sql_fail(s, src, "full-text search"));
    *n_out = n;
done:
    sqlite3_finalize(st);
    er_free(sql.p);
    er_free(match);
    return rc;
}

// ---- fusion ----

static int hit_cmp(const void *pa, const void *pb) {
    const MemHit *a = pa, *b = pb;
    if (a->fused != b->fused)
        return a->fused > b->fused ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static MemHit *hit_find(MemHit *h, int n, int64_t id) {
    for (int i = 0; i < n; i++)
        if (h[i].id == id)
            return &h[i];
    return NULL;
}

// Both lists into cand (room for nb + nv): one hit per entry with its ranks and fused score, best first.
static int fuse(const Ranked *bl, int nb, const Ranked *vl, int nv, MemHit *cand) {
    int m = 0;
    for (int i = 0; i < nb; i++) {
        MemHit *h = &cand[m++];
        memset(h, 0, sizeof *h);
        h->id = bl[i].id, h->bm25 = -bl[i].score, h->bm25_rank = i + 1, h->vec_score = NAN;
        h->fused = 1.0 / (MEM_RRF_K + i + 1);
    }
    for (int i = 0; i < nv; i++) {
        MemHit *h = hit_find(cand, nb, vl[i].id);
        if (!h) {
            h = &cand[m++];
            memset(h, 0, sizeof *h);
            h->id = vl[i].id, h->bm25 = NAN;
        }
        h->vec_score = vl[i].score, h->vec_rank = i + 1;
        h->fused += 1.0 / (MEM_RRF_K + i + 1);
    }
    qsort(cand, (size_t)m, sizeof *cand, hit_cmp);
    return m;
}

static int hit_fill(MemStore *s, MemHit *h) {
    MemEntry e;
    ER_TRY(mem_get(s, h->id, &e));
    h->text = e.text, h->metadata = e.metadata, h->created = e.created;
    return ER_OK;
}

void mem_hits_free(MemHit *hits, int n) {
    for (int i = 0; hits && i < n; i++) {
        er_free(hits[i].text);
        er_free(hits[i].metadata);
        hits[i].text = hits[i].metadata = NULL;
    }
}

int mem_search(MemStore *s, const MemQuery *q, MemHit *hits, int k, int *n) {
    if (!s || !q || !hits || !n)
        return er_error(ER_EINVAL, "mem_search: bad arguments");
    *n = 0;
    if (k < 1 || k > MEM_MAX_K)
        return er_error(ER_EINVAL, "%s: k = %d is not in [1, %d]", s->path, k, MEM_MAX_K);
    int has_text = q->text && q->text[0], has_vec = q->vec != NULL;
    if (!has_text && !has_vec)
        return er_error(ER_EINVAL, "%s: a search needs a text, a vector or both", s->path);
    int depth = q->depth > 0 ? q->depth : (4 * k > 50 ? 4 * k : 50);
    depth = depth < k ? k : depth > MEM_MAX_K ? MEM_MAX_K : depth;
    Ranked *bl = er_calloc((size_t)depth, sizeof *bl), *vl = er_calloc((size_t)depth, sizeof *vl);
    MemHit *cand = er_calloc(2 * (size_t)depth, sizeof *cand);
    int rc = ER_OK, nb = 0, nv = 0, m = 0;
    if (!bl || !vl || !cand)
        ER_CHECK(ER_ENOMEM);
    if (has_text)
        ER_CHECK(bm25_list(s, q, depth, bl, &nb));
    if (has_vec)
        ER_CHECK(vec_list(s, q, depth, vl, &nv));
    m = fuse(bl, nb, vl, nv, cand);
    m = m < k ? m : k;
    for (int i = 0; i < m; i++) {
        hits[i] = cand[i];
        hits[i].text = hits[i].metadata = NULL;
    }
    for (int i = 0; i < m; i++) {
        rc = hit_fill(s, &hits[i]);
        if (rc < 0) {
            mem_hits_free(hits, m);
            goto done;
        }
    }
    *n = m;
done:
    er_free(bl), er_free(vl), er_free(cand);
    return rc;
}
