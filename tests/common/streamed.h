// Shared by the engine tests: what the streaming callback (GenTokenFn) receives, per sample.
#ifndef TESTS_COMMON_STREAMED_H
#define TESTS_COMMON_STREAMED_H

#include <criterion/criterion.h>
#include <string.h>

typedef struct {
    char buf[3][4096];
    size_t len[3];
    int calls[3];
    int stop_after; // > 0: the callback stops sample 0 after this many calls
} Streamed;

static inline int streamed_collect(void *user, int sample, int token, const char *bytes, size_t n) {
    (void)token;
    Streamed *s = user;
    cr_assert(sample < 3 && s->len[sample] + n < sizeof s->buf[sample]);
    memcpy(s->buf[sample] + s->len[sample], bytes, n);
    s->len[sample] += n;
    s->calls[sample]++;
    return sample == 0 && s->stop_after > 0 && s->calls[0] >= s->stop_after;
}

#endif
