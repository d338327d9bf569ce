/* libxxhash's entry points, borrowed from the xxhash package's own extension module (a runtime
 * dependency already imported): NULL where they could not be found or failed the probe. */
#ifndef TOKENKEYS_XXH_H
#define TOKENKEYS_XXH_H

#include <stddef.h>
#include <stdint.h>

/* libxxhash 0.8 public API (xxhash.h): XXH128_hash_t is {low64, high64}. */
typedef struct {
    uint64_t low64;
    uint64_t high64;
} xxh128_t;
typedef xxh128_t (*xxh3_128_fn)(const void *, size_t);
typedef uint64_t (*xxh_seeded_fn)(const void *, size_t, uint64_t);

extern xxh3_128_fn tk_xxh3_128;
extern xxh_seeded_fn tk_xxh3_64_seeded;
extern xxh_seeded_fn tk_xxh64;

/* Looks the entry points up in xxhash._xxhash and keeps them only if each agrees with the
 * package's Python function on a probe; never raises. */
void tk_find_xxhash(void);

#endif
