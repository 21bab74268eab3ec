#include "core/utf8.h"

#include <stdint.h>
#include <string.h>

size_t utf8_invalid_at(const void *p, size_t len) {
    const unsigned char *s = p;
    size_t i = 0;
    while (i < len) {
        // Eight ASCII bytes at a time: most text is ASCII, and this runs on every encoded text.
        if (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        int k = utf8_next(s + i, len - i);
        if (k < 0)
            return i;
        i += (size_t)k;
    }
    return len;
}
