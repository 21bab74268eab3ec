#include "core/strbuf.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

void strbuf_put(StrBuf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = er_realloc_array(b->p, cap, 1);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void strbuf_puts(StrBuf *b, const char *s) { strbuf_put(b, s, strlen(s)); }

void strbuf_int(StrBuf *b, int v) {
    char t[16];
    snprintf(t, sizeof t, "%d", v);
    strbuf_puts(b, t);
}
