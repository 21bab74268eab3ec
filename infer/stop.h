// Stop strings over the decoded byte stream of one sequence. Tokens can split a stop string and a
// stop string can split a token, so matching runs byte by byte (one KMP automaton per string) and
// is independent of how the stream is chunked: the reported match is the occurrence that
// completes first in the stream (the longest one when several complete on the same byte), and its
// start offset is where the caller cuts the output.
#ifndef INFER_STOP_H
#define INFER_STOP_H

#include <stddef.h>

#define STOP_MAX 8       // stop strings per sequence
#define STOP_MAX_LEN 256 // bytes per stop string

typedef struct {
    int n;
    int len[STOP_MAX];
    unsigned char str[STOP_MAX][STOP_MAX_LEN];
    short fail[STOP_MAX][STOP_MAX_LEN]; // KMP failure function: longest proper border of str[0..j]
    short state[STOP_MAX];              // bytes of str[i] matched by the end of the stream
    size_t fed;                         // bytes fed so far
    int matched;                        // sticky: once a stop string appeared, later feeds are ignored
    int match_index;                    // which stop string
    size_t match_start;                 // its offset in the fed stream
} StopMatcher;

// stops: n (0..STOP_MAX) NUL-terminated, non-empty strings of at most STOP_MAX_LEN bytes; they are
// copied. ER_EINVAL otherwise. Plain data: nothing to free.
int stop_init(StopMatcher *m, const char *const *stops, int n);
// Forgets the stream, keeps the stop strings.
void stop_reset(StopMatcher *m);
// Feeds the next n bytes. Returns 1 if a stop string has appeared (now or earlier) and sets
// *match_start (may be NULL) to where it starts in the whole fed stream; 0 if not; ER_EINVAL on
// NULL arguments.
int stop_feed(StopMatcher *m, const char *bytes, size_t n, size_t *match_start);
// Bytes at the end of the stream that could still become the start of a stop string: a streaming
// caller may emit all but these (0 after a match: cut at match_start instead).
size_t stop_pending(const StopMatcher *m);

#endif
