/* The key table's slot array (slots.h): recency links, growth, insertion, deletion. */
#include "slots.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

/* A zeroed slot array. A large one asks for transparent huge pages over its interior (where
 * the kernel leaves that to madvise): a probe of a table far larger than the caches then misses
 * the TLB far less often. Allocated through CPython's allocator still, so tracemalloc counts it
 * (the benchmark's bytes per entry). */
static Slot *alloc_slots(uint64_t count) {
    Slot *slots = PyMem_Calloc((size_t)count, sizeof(Slot));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    size_t huge = (size_t)2 << 20, bytes = (size_t)count * sizeof(Slot);
    if (slots != NULL && bytes >= 4 * huge) {
        uintptr_t start = ((uintptr_t)slots + huge - 1) & ~(uintptr_t)(huge - 1);
        uintptr_t end = ((uintptr_t)slots + bytes) & ~(uintptr_t)(huge - 1);
        if (end > start) (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
    }
#endif
    return slots;
}

static inline void unlink_slot(KeyTable *t, uint32_t i) {
    Slot *s = &t->slots[i];
    if (s->prev == NIL) t->head = s->next; else t->slots[s->prev].next = s->next;
    if (s->next == NIL) t->tail = s->prev; else t->slots[s->next].prev = s->prev;
}

static inline void append_slot(KeyTable *t, uint32_t i) {
    Slot *s = &t->slots[i];
    s->prev = t->tail;
    s->next = NIL;
    if (t->tail == NIL) t->head = i; else t->slots[t->tail].next = i;
    t->tail = i;
}

void slots_move_to_end(KeyTable *t, uint32_t i) {
    if (t->tail == i) return;
    unlink_slot(t, i);
    append_slot(t, i);
}

/* Double the slot array. Read in slot order, not recency order: with linear probing a key's
 * new home is its old one or that plus the old size, so the writes go forward in two streams
 * instead of one cache miss each; the recency links (old slot numbers) are then translated
 * through a map old -> new read in prefetched batches. */
static int grow(KeyTable *t) {
    uint64_t size = t->mask + 1, count = size * 2;
    if (count > (uint64_t)NIL) {
        PyErr_SetString(PyExc_MemoryError, "key table: more than 2**31 slots");
        return -1;
    }
    Slot *fresh = alloc_slots(count);
    uint32_t *moved = PyMem_Malloc((size_t)size * sizeof(uint32_t));
    if (fresh == NULL || moved == NULL) {
        PyMem_Free(fresh);
        PyMem_Free(moved);
        PyErr_NoMemory();
        return -1;
    }
    Slot *old = t->slots;
    uint64_t mask = count - 1;
    for (uint64_t j = 0; j < size; j++) {
        if (old[j].value == NULL) continue;
        uint64_t i = mix(old[j].key) & mask;
        while (fresh[i].value != NULL) i = (i + 1) & mask;
        fresh[i] = old[j]; /* links still old slot numbers */
        moved[j] = (uint32_t)i;
    }
    for (uint64_t i = 0; i < count; i += BATCH) {
        for (uint64_t j = i; j < i + BATCH; j++) {
            if (fresh[j].value == NULL) continue;
            if (fresh[j].prev != NIL) PREFETCH(&moved[fresh[j].prev]);
            if (fresh[j].next != NIL) PREFETCH(&moved[fresh[j].next]);
        }
        for (uint64_t j = i; j < i + BATCH; j++) {
            if (fresh[j].value == NULL) continue;
            if (fresh[j].prev != NIL) fresh[j].prev = moved[fresh[j].prev];
            if (fresh[j].next != NIL) fresh[j].next = moved[fresh[j].next];
        }
    }
    if (t->head != NIL) {
        t->head = moved[t->head];
        t->tail = moved[t->tail];
    }
    t->slots = fresh;
    t->mask = mask;
    PyMem_Free(moved);
    PyMem_Free(old);
    return 0;
}

int slots_insert(KeyTable *t, uint64_t key, PyObject *value) {
    t->version++;
    uint64_t need = (uint64_t)t->used + 1;
    if (need * 10 > (t->mask + 1) * 7) {
        /* Near the expected count, straight to room for it: each doubling on the way would
         * re-insert every key (most of an ingest's cost when the table doubled to 10M keys). */
        uint64_t want = t->expected > need && t->expected <= need * RESERVE_WITHIN ? t->expected
                                                                                  : need;
        do {
            if (grow(t) < 0) {
                if (need * 10 > (t->mask + 1) * 7) return -1;
                PyErr_Clear(); /* room enough for this key: the rest of the way later */
                break;
            }
        } while (want * 10 > (t->mask + 1) * 7);
    }
    uint64_t i = mix(key) & t->mask;
    while (t->slots[i].value != NULL) i = (i + 1) & t->mask;
    t->slots[i].key = key;
    Py_INCREF(value);
    t->slots[i].value = value;
    append_slot(t, (uint32_t)i);
    t->used++;
    return 0;
}

PyObject *slots_take(KeyTable *t, uint32_t i) {
    t->version++;
    PyObject *value = t->slots[i].value;
    unlink_slot(t, i);
    t->used--;
    uint64_t hole = i, j = (i + 1) & t->mask;
    while (t->slots[j].value != NULL) {
        uint64_t home = mix(t->slots[j].key) & t->mask;
        /* Slot j may move into the hole if its home is not in (hole, j] cyclically. */
        int stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (!stays) {
            Slot *s = &t->slots[j];
            t->slots[hole] = *s;
            if (s->prev == NIL) t->head = (uint32_t)hole; else t->slots[s->prev].next = (uint32_t)hole;
            if (s->next == NIL) t->tail = (uint32_t)hole; else t->slots[s->next].prev = (uint32_t)hole;
            hole = j;
        }
        j = (j + 1) & t->mask;
    }
    t->slots[hole].value = NULL;
    return value;
}
