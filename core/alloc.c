#include "core/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"

#define ER_ALIGN 64

void *er_alloc(size_t bytes) {
    if (bytes == 0)
        bytes = 1;
    size_t rounded;
    if (er_add_size(bytes, ER_ALIGN - 1, &rounded) < 0) {
        er_error(ER_ENOMEM, "allocation of %zu bytes overflows", bytes);
        return NULL;
    }
    rounded &= ~(size_t)(ER_ALIGN - 1);
    void *p = aligned_alloc(ER_ALIGN, rounded);
    if (!p)
        er_error(ER_ENOMEM, "out of memory allocating %.1f MiB", bytes / 1048576.0);
    return p;
}

void *er_calloc(size_t n, size_t elem_size) {
    size_t bytes;
    if (er_mul_size(n, elem_size, &bytes) < 0) {
        er_error(ER_ENOMEM, "allocation of %zu x %zu bytes overflows", n, elem_size);
        return NULL;
    }
    void *p = er_alloc(bytes);
    if (p)
        memset(p, 0, bytes);
    return p;
}

void *er_realloc_array(void *p, size_t n, size_t elem_size) {
    size_t bytes;
    if (er_mul_size(n, elem_size, &bytes) < 0) {
        er_error(ER_ENOMEM, "allocation of %zu x %zu bytes overflows", n, elem_size);
        return NULL;
    }
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q)
        er_error(ER_ENOMEM, "out of memory allocating %.1f MiB", bytes / 1048576.0);
    return q;
}

void er_free(void *p) { free(p); }

char *er_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (!d) {
        er_error(ER_ENOMEM, "out of memory copying a string");
        return NULL;
    }
    memcpy(d, s, n);
    return d;
}

size_t er_physical_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (size_t)pages * (size_t)size : 0;
}

size_t er_resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size, resident;
    int ok = f && fscanf(f, "%lu %lu", &size, &resident) == 2;
    if (f)
        fclose(f);
    long ps = sysconf(_SC_PAGESIZE);
    return ok && ps > 0 ? (size_t)resident * (size_t)ps : 0;
}

void er_release_pages(const void *p, size_t bytes) {
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0 || !p)
        return;
    uintptr_t mask = ~((uintptr_t)ps - 1);
    uintptr_t a = ((uintptr_t)p + (uintptr_t)ps - 1) & mask, e = ((uintptr_t)p + bytes) & mask;
#ifdef MADV_DONTNEED
    if (e > a)
        madvise((void *)a, e - a, MADV_DONTNEED);
#endif
}

void er_hint_huge_pages(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20, mask = ~(huge - 1);
    uintptr_t a = ((uintptr_t)p + huge - 1) & mask, e = ((uintptr_t)p + bytes) & mask;
    if (p && e > a)
        madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}
