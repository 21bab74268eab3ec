// UTF-8 as Rust's str::from_utf8 reads it (no overlong forms, no surrogates, nothing above
// U+10FFFF): one validator for everything that takes text from a file (JSON, safetensors headers,
// tokenizer input), fast on ASCII since the tokenizer runs it on every text it encodes.
#ifndef CORE_UTF8_H
#define CORE_UTF8_H

#include <stddef.h>

// >0: length of the well-formed sequence at s (n > 0 bytes left); <0: minus the length of the
// maximal ill-formed subpart (what Rust's from_utf8_lossy replaces with one U+FFFD). Inline: the
// tokenizer steps through every character with it.
static inline int utf8_next(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    unsigned lo = 0x80, hi = 0xBF;
    int w;
    if (c >= 0xC2 && c <= 0xDF)
        w = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        w = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        w = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return -1;
    if (n < 2 || s[1] < lo || s[1] > hi)
        return -1;
    for (int k = 2; k < w; k++)
        if ((size_t)k >= n || (s[k] & 0xC0) != 0x80)
            return -k;
    return w;
}

// Offset of the first byte that is not part of a valid UTF-8 sequence, or len if all are valid.
size_t utf8_invalid_at(const void *s, size_t len);

#endif
