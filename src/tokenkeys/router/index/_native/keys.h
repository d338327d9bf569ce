/* Keys as the table's bulk methods read them: a list or tuple of ints, or a buffer of u64
 * words (array('Q'), a KeyArray's index keys), converted once into a C array; and the
 * prefetching probe that walks them. */
#ifndef TOKENKEYS_KEYS_H
#define TOKENKEYS_KEYS_H

#include "slots.h"

typedef struct {
    uint64_t *keys;
    uint8_t *ok;    /* 1: an exact int in [0, 2**64) (every word of a buffer); 0: never a key */
    Py_ssize_t size;
    int all_ok;
    PyObject *seq;  /* the list or tuple (NULL for a buffer): its items name bad keys */
} Keys;

/* A key as u64: 1 and *out on success, 0 for an int outside [0, 2**64) or not an int (never a
 * table key), -1 with an error set for anything else failing. */
int key_value(PyObject *obj, uint64_t *out);

/* 0 on success; -1 with an error set (not a sequence or buffer of keys). */
int keys_open(Keys *k, PyObject *obj);
void keys_close(Keys *k);

static inline void probe_start(const KeyTable *t, const Keys *k) {
    for (Py_ssize_t j = 0; j < BATCH && j < k->size; j++)
        if (k->ok[j]) slots_ahead(t, k->keys[j]);
}

/* Key j's slot (NIL: absent or never a key), prefetching key j + BATCH's. */
static inline uint32_t probe(const KeyTable *t, const Keys *k, Py_ssize_t j) {
    Py_ssize_t next = j + BATCH;
    if (next < k->size && k->ok[next]) slots_ahead(t, k->keys[next]);
    return k->ok[j] ? slots_find(t, k->keys[j]) : NIL;
}

#endif
