/* Byte layouts the chains hash: fixed-width integers, canonical CBOR heads and token arrays,
 * little-endian token words, and FNV-1a-64 (the one digest simple enough to be a loop).
 * Static inline: every function is small and sits in a per-block loop. */
#ifndef TOKENKEYS_ENCODE_H
#define TOKENKEYS_ENCODE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint8_t *put_be64(uint8_t *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static inline uint8_t *put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static inline uint64_t get_be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}

static inline void put_be32(uint8_t *p, uint32_t v) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap32(v);
    memcpy(p, &v, 4);
#else
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
#endif
}

/* The shortest CBOR head of major type `major` with argument n (RFC 8949 §3, deterministic). */
static inline uint8_t *cbor_head(uint8_t *p, unsigned major, uint64_t n) {
    uint8_t mt = (uint8_t)(major << 5);
    if (n < 24) {
        *p++ = mt | (uint8_t)n;
    } else if (n <= 0xFF) {
        *p++ = mt | 24;
        *p++ = (uint8_t)n;
    } else if (n <= 0xFFFF) {
        *p++ = mt | 25;
        *p++ = (uint8_t)(n >> 8);
        *p++ = (uint8_t)n;
    } else if (n <= 0xFFFFFFFFULL) {
        *p++ = mt | 26;
        put_be32(p, (uint32_t)n);
        p += 4;
    } else {
        *p++ = mt | 27;
        p = put_be64(p, n);
    }
    return p;
}

/* Canonical CBOR of a block's tokens (array head included). The token's form is built in a
 * register as a word whose little-endian bytes are the form (head byte, then the big-endian
 * value shifted to its width), stored with one 8-byte store, and the pointer advances by its
 * length. No branch on the token: ids of a large vocabulary mix 3- and 5-byte forms at random,
 * which a branch mispredicts on every new prompt (a repeated one is learnt by the predictor,
 * which flattered a branching version in repeated timings of one prompt). A store may write
 * up to 7 bytes past the form, which the next token or the tail overwrites; callers leave
 * CBOR_SLACK bytes of slack. */
#define CBOR_SLACK 8

static inline uint8_t *cbor_tokens(uint8_t *p, const uint32_t *tok, ptrdiff_t bs) {
    p = cbor_head(p, 4, (uint64_t)bs);
    for (ptrdiff_t i = 0; i < bs; i++) {
        uint32_t t = tok[i];
        unsigned k = (t >= 24) + (t >= 0x100) + (t >= 0x10000); /* 0..3 */
        unsigned width = k + (k == 3);                            /* 0, 1, 2, 4 bytes */
        /* t's bytes reversed: as a little-endian word, t big-endian (one bswap). */
        uint64_t be = (t >> 24) | (t >> 8 & 0xFF00) | (t << 8 & 0xFF0000) | (uint64_t)(t & 0xFF) << 24;
        uint64_t head = k ? 0x17 + k : t;
        uint64_t word = head | (be >> (32 - 8 * width)) << 8;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(p, &word, 8);
#else
        for (int b = 0; b < 8; b++) p[b] = (uint8_t)(word >> (8 * b));
#endif
        p += 1 + width;
    }
    return p;
}

/* Tokens as u32 little-endian words. */
static inline uint8_t *le_tokens(uint8_t *p, const uint32_t *tok, ptrdiff_t bs) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, tok, (size_t)bs * 4);
    return p + bs * 4;
#else
    for (ptrdiff_t i = 0; i < bs; i++) {
        uint32_t t = tok[i];
        *p++ = (uint8_t)t;
        *p++ = (uint8_t)(t >> 8);
        *p++ = (uint8_t)(t >> 16);
        *p++ = (uint8_t)(t >> 24);
    }
    return p;
#endif
}

static inline uint64_t fnv1a64(const uint8_t *p, size_t n) {
    uint64_t h = 0xCBF29CE484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ULL;
    return h;
}

#endif
