// Allocation helpers: 64-byte aligned, overflow-checked, and failures recorded as ER_ENOMEM
// (never abort). Everything from er_alloc* is released with er_free.
#ifndef CORE_ALLOC_H
#define CORE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

void *er_alloc(size_t bytes);                // uninitialised
void *er_calloc(size_t n, size_t elem_size); // zeroed, n*elem_size checked for overflow
void *er_realloc_array(void *p, size_t n, size_t elem_size); // plain realloc, never aligned memory
void er_free(void *p);
char *er_strdup(const char *s);
// Physical memory of the machine in bytes (0 when unknown): the default limit for buffers sized up front.
size_t er_physical_memory(void);
// The process's resident set in bytes (Linux: /proc/self/statm), 0 where unknown: for reports.
size_t er_resident_bytes(void);
// Tells the OS that the whole pages inside [p, p + bytes) will not be read again: pages of a mapped file
// leave the resident set (a later read maps them in again), anonymous ones read back as zeros. A hint: no
// error, nothing where the OS lacks it.
void er_release_pages(const void *p, size_t bytes);
// Asks the OS to back the whole 2 MiB-aligned stretches inside [p, p + bytes) with huge pages where it can
// (fewer page faults when a large buffer is first written). A hint, like er_release_pages.
void er_hint_huge_pages(void *p, size_t bytes);

// a*b and a+b into *out; return 0, or -1 on size_t overflow.
static inline int er_mul_size(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int er_add_size(size_t a, size_t b, size_t *out) {
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

#endif
