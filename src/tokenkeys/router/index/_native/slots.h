/* The key table's slot array: u64 key -> holder-set reference, in recency order.
 *
 * One open-addressing array of 24-byte slots (key, holder-set reference, previous and next
 * slot of the recency list as 32-bit slot numbers): a key costs one slot, no Python int and no
 * dict entry, and the recency list needs no node of its own. Linear probing from a mixed hash
 * of the key; a deletion shifts the following run back (no tombstones), relinking each moved
 * slot's neighbours. The array doubles at 70% load. */
#ifndef TOKENKEYS_SLOTS_H
#define TOKENKEYS_SLOTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define NIL UINT32_MAX
#define MIN_SLOTS 16
/* Slots are requested this many keys ahead of their probe, so the memory latency of a table
 * far larger than the caches is paid about once per batch instead of once per key. */
#define BATCH 16

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)0)
#endif

typedef struct {
    uint64_t key;
    PyObject *value; /* NULL: empty slot */
    uint32_t prev, next;
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    uint64_t mask; /* slot count - 1 (a power of two) */
    Py_ssize_t used;
    uint32_t head, tail; /* oldest, newest */
    /* Bumped whenever a slot may move (an insertion, a growth, a deletion): the slots the
     * last runs() found stay valid for touch_found() while it is unchanged. */
    uint64_t version;
    uint32_t *found; /* the slots the last runs() found, in key order */
    Py_ssize_t found_n, found_cap;
    uint64_t found_version;
    uint64_t expected; /* keys the table is expected to reach (reserve()) */
} KeyTable;

/* A growth goes straight to room for the expected keys once they are at most this many times
 * what the table holds: its array then is at most this many times what it needs (random keys
 * soon touch every page of it), while a table far below its bound keeps doubling. */
#define RESERVE_WITHIN 8

static inline uint64_t mix(uint64_t x) { /* splitmix64's finalizer: structured keys spread */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* The slot holding `key`, or NIL. */
static inline uint32_t slots_find(const KeyTable *t, uint64_t key) {
    uint64_t i = mix(key) & t->mask;
    for (;;) {
        const Slot *s = &t->slots[i];
        if (s->value == NULL) return NIL;
        if (s->key == key) return (uint32_t)i;
        i = (i + 1) & t->mask;
    }
}

/* Prefetch the home slot of `key` (probes read it a batch later). */
static inline void slots_ahead(const KeyTable *t, uint64_t key) {
    PREFETCH(&t->slots[mix(key) & t->mask]);
}

/* Make slot i the newest. */
void slots_move_to_end(KeyTable *t, uint32_t i);


/* Insert `key` (absent) with `value` (a new reference is taken) at the newest end. */
int slots_insert(KeyTable *t, uint64_t key, PyObject *value);

/* Empty slot `i` (its reference is the caller's now) and shift the run after it back. */
PyObject *slots_take(KeyTable *t, uint32_t i);

#endif
