// A growable NUL-terminated string. The first failed allocation sticks (oom), so a builder checks
// once at the end instead of after every append.
#ifndef CORE_STRBUF_H
#define CORE_STRBUF_H

#include <stddef.h>

typedef struct {
    char *p;    // NUL-terminated once anything is appended; free with er_free
    size_t n, cap;
    int oom;
} StrBuf;

void strbuf_put(StrBuf *b, const char *s, size_t n);
void strbuf_puts(StrBuf *b, const char *s);
void strbuf_int(StrBuf *b, int v);

#endif
