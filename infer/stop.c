#include "infer/stop.h"

#include <string.h>

#include "core/error.h"

int stop_init(StopMatcher *m, const char *const *stops, int n) {
    if (!m)
        return er_error(ER_EINVAL, "stop_init: matcher is NULL");
    memset(m, 0, sizeof *m);
    if (n < 0 || n > STOP_MAX)
        return er_error(ER_EINVAL, "stop strings: %d given, at most %d supported", n, STOP_MAX);
    if (n > 0 && !stops)
        return er_error(ER_EINVAL, "stop strings: list is NULL");
    for (int i = 0; i < n; i++) {
        size_t len = stops[i] ? strlen(stops[i]) : 0;
        if (len == 0)
            return er_error(ER_EINVAL, "stop string %d is empty or NULL", i);
        if (len > STOP_MAX_LEN)
            return er_error(ER_EINVAL, "stop string %d is %zu bytes, at most %d supported", i, len, STOP_MAX_LEN);
        memcpy(m->str[i], stops[i], len);
        m->len[i] = (int)len;
        // fail[j] = length of the longest proper prefix of str[0..j] that is also its suffix
        const unsigned char *t = m->str[i];
        short *f = m->fail[i];
        f[0] = 0;
        int k = 0;
        for (int j = 1; j < (int)len; j++) {
            while (k > 0 && t[j] != t[k])
                k = f[k - 1];
            if (t[j] == t[k])
                k++;
            f[j] = (short)k;
        }
    }
    m->n = n;
    return ER_OK;
}

void stop_reset(StopMatcher *m) {
    for (int i = 0; i < STOP_MAX; i++)
        m->state[i] = 0;
    m->fed = 0;
    m->matched = 0;
    m->match_index = 0;
    m->match_start = 0;
}

int stop_feed(StopMatcher *m, const char *bytes, size_t n, size_t *match_start) {
    if (!m || (!bytes && n > 0))
        return er_error(ER_EINVAL, "stop_feed: NULL argument");
    for (size_t b = 0; b < n && !m->matched; b++) {
        unsigned char c = (unsigned char)bytes[b];
        m->fed++;
        for (int i = 0; i < m->n; i++) {
            const unsigned char *t = m->str[i];
            int k = m->state[i];
            while (k > 0 && c != t[k])
                k = m->fail[i][k - 1];
            if (c == t[k])
                k++;
            if (k == m->len[i]) {
                size_t start = m->fed - (size_t)k;
                // several completing on this byte: the longest (earliest start) wins
                if (!m->matched || start < m->match_start) {
                    m->matched = 1;
                    m->match_index = i;
                    m->match_start = start;
                }
                k = m->fail[i][k - 1];
            }
            m->state[i] = (short)k;
        }
    }
    if (m->matched && match_start)
        *match_start = m->match_start;
    return m->matched;
}

size_t stop_pending(const StopMatcher *m) {
    if (m->matched)
        return 0;
    int k = 0;
    for (int i = 0; i < m->n; i++)
        if (m->state[i] > k)
            k = m->state[i];
    return (size_t)k;
}
