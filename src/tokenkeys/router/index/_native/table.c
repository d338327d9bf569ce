/* tokenkeys.router.index._table: the in-memory index's key table, u64 key -> holder set, in
 * recency order.
 *
 * One open-addressing array of 24-byte slots (key, holder-set reference, previous and next
 * slot of the recency list as 32-bit slot numbers): a key costs one slot, no Python int and no
 * dict entry, and the recency list needs no node of its own. Linear probing from a mixed hash
 * of the key; a deletion shifts the following run back (no tombstones), relinking each moved
 * slot's neighbours. The array doubles at 70% load, re-inserting in recency order.
 *
 * The holder sets are Python objects the table holds a reference to; they never refer back to
 * the table, so no cycle runs through it and the type is not tracked by the cycle collector
 * (a full collection never walks its millions of slots).
 *
 * The bulk methods (runs, touch, add_keys) probe in batches: every key's slot of a batch is
 * prefetched before the first is read, so the memory latency of a table far larger than the
 * caches is paid about once per batch instead of once per key. The pure-Python table
 * (index/table.py, PyKeyTable) has the same methods and the same results; the tests run the
 * index through both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NIL UINT32_MAX
#define BATCH 16
#define MIN_SLOTS 16

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
} KeyTable;

static inline uint64_t mix(uint64_t x) { /* splitmix64's finalizer: structured keys spread */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* The slot holding `key`, or NIL. */
static inline uint32_t find(const KeyTable *t, uint64_t key) {
    uint64_t i = mix(key) & t->mask;
    for (;;) {
        const Slot *s = &t->slots[i];
        if (s->value == NULL) return NIL;
        if (s->key == key) return (uint32_t)i;
        i = (i + 1) & t->mask;
    }
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

static inline void move_to_end(KeyTable *t, uint32_t i) {
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
    Slot *fresh = PyMem_Calloc((size_t)count, sizeof(Slot));
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

/* Insert `key` (absent) with `value` (a new reference is taken) at the newest end. */
static int insert(KeyTable *t, uint64_t key, PyObject *value) {
    if ((uint64_t)(t->used + 1) * 10 > (t->mask + 1) * 7 && grow(t) < 0) return -1;
    uint64_t i = mix(key) & t->mask;
    while (t->slots[i].value != NULL) i = (i + 1) & t->mask;
    t->slots[i].key = key;
    Py_INCREF(value);
    t->slots[i].value = value;
    append_slot(t, (uint32_t)i);
    t->used++;
    return 0;
}

/* Empty slot `i` (its reference is the caller's now) and shift the run after it back. */
static PyObject *take(KeyTable *t, uint32_t i) {
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

/* A key as u64: 1 and *out on success, 0 for an int outside [0, 2**64) or not an int (never a
 * table key), -1 with an error set for anything else failing. An exact int of up to three
 * 30-bit digits (every u64) is read in place on 3.11: PyLong_AsUnsignedLongLong goes through
 * _PyLong_AsByteArray there, which cost more per key than the whole probe. */
static int as_key(PyObject *obj, uint64_t *out) {
    if (!PyLong_Check(obj)) return 0;
#if PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030C0000 && !defined(Py_LIMITED_API) && \
    PYLONG_BITS_IN_DIGIT == 30
    if (PyLong_CheckExact(obj)) {
        Py_ssize_t size = Py_SIZE(obj);
        const digit *d = ((PyLongObject *)obj)->ob_digit;
        if (size < 0) return 0; /* negative */
        if (size <= 2) {
            *out = size == 0 ? 0 : size == 1 ? d[0] : (uint64_t)d[0] | (uint64_t)d[1] << 30;
            return 1;
        }
        if (size == 3 && d[2] < (1u << 4)) { /* 64 - 2 * 30 bits in the top digit */
            *out = (uint64_t)d[0] | (uint64_t)d[1] << 30 | (uint64_t)d[2] << 60;
            return 1;
        }
        return 0;
    }
#endif
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

static int key_or_raise(PyObject *obj, uint64_t *out) {
    int ok = as_key(obj, out);
    if (ok == 0) PyErr_Format(PyExc_KeyError, "%R", obj);
    return ok == 1 ? 0 : -1;
}

/* ---- the type ------------------------------------------------------------------------------ */

static PyObject *table_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "KeyTable() takes no arguments");
        return NULL;
    }
    KeyTable *t = (KeyTable *)type->tp_alloc(type, 0);
    if (t == NULL) return NULL;
    t->slots = PyMem_Calloc(MIN_SLOTS, sizeof(Slot));
    if (t->slots == NULL) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    t->mask = MIN_SLOTS - 1;
    t->head = t->tail = NIL;
    return (PyObject *)t;
}

static void table_dealloc(KeyTable *t) {
    if (t->slots != NULL) {
        for (uint64_t i = 0; i <= t->mask; i++) Py_XDECREF(t->slots[i].value);
        PyMem_Free(t->slots);
    }
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t table_len(KeyTable *t) { return t->used; }

static PyObject *table_get(KeyTable *t, PyObject *key) {
    uint64_t k;
    int ok = as_key(key, &k);
    if (ok < 0) return NULL;
    uint32_t i = ok ? find(t, k) : NIL;
    PyObject *value = i == NIL ? Py_None : t->slots[i].value;
    Py_INCREF(value);
    return value;
}

static PyObject *table_subscript(KeyTable *t, PyObject *key) {
    uint64_t k;
    if (key_or_raise(key, &k) < 0) return NULL;
    uint32_t i = find(t, k);
    if (i == NIL) {
        PyErr_Format(PyExc_KeyError, "%R", key);
        return NULL;
    }
    Py_INCREF(t->slots[i].value);
    return t->slots[i].value;
}

/* t[key] = value keeps a present key's place (as a dict does); del t[key]. */
static int table_ass_subscript(KeyTable *t, PyObject *key, PyObject *value) {
    uint64_t k;
    if (value == NULL) {
        if (key_or_raise(key, &k) < 0) return -1;
        uint32_t i = find(t, k);
        if (i == NIL) {
            PyErr_Format(PyExc_KeyError, "%R", key);
            return -1;
        }
        Py_DECREF(take(t, i));
        return 0;
    }
    int ok = as_key(key, &k);
    if (ok <= 0) {
        if (ok == 0) PyErr_Format(PyExc_OverflowError, "key %R is not in [0, 2**64)", key);
        return -1;
    }
    uint32_t i = find(t, k);
    if (i == NIL) return insert(t, k, value);
    PyObject *old = t->slots[i].value;
    Py_INCREF(value);
    t->slots[i].value = value;
    Py_DECREF(old);
    return 0;
}

static PyObject *table_move_to_end(KeyTable *t, PyObject *key) {
    uint64_t k;
    if (key_or_raise(key, &k) < 0) return NULL;
    uint32_t i = find(t, k);
    if (i == NIL) {
        PyErr_Format(PyExc_KeyError, "%R", key);
        return NULL;
    }
    move_to_end(t, i);
    Py_RETURN_NONE;
}

static PyObject *table_pop_oldest(KeyTable *t, PyObject *unused) {
    if (t->head == NIL) {
        PyErr_SetString(PyExc_KeyError, "pop_oldest(): the table is empty");
        return NULL;
    }
    uint32_t i = t->head;
    PyObject *key = PyLong_FromUnsignedLongLong(t->slots[i].key);
    if (key == NULL) return NULL;
    PyObject *value = take(t, i);
    PyObject *pair = PyTuple_Pack(2, key, value);
    Py_DECREF(key);
    Py_DECREF(value);
    return pair;
}

/* Keys (or values) oldest first, as a list. */
static PyObject *listed(KeyTable *t, int values) {
    PyObject *out = PyList_New(t->used);
    if (out == NULL) return NULL;
    Py_ssize_t n = 0;
    for (uint32_t at = t->head; at != NIL; at = t->slots[at].next) {
        PyObject *item;
        if (values) {
            item = t->slots[at].value;
            Py_INCREF(item);
        } else if ((item = PyLong_FromUnsignedLongLong(t->slots[at].key)) == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, n++, item);
    }
    return out;
}

static PyObject *table_keys(KeyTable *t, PyObject *unused) { return listed(t, 0); }
static PyObject *table_values(KeyTable *t, PyObject *unused) { return listed(t, 1); }

static PyObject *table_iter(KeyTable *t) {
    PyObject *keys = listed(t, 0);
    if (keys == NULL) return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

/* The keys of a sequence as u64, with a flag per key (0: not a u64, never a table key): NULL
 * with an error set when the sequence or a conversion fails. Freed with PyMem_Free. */
static uint64_t *converted(PyObject *seq, Py_ssize_t size, uint8_t **ok) {
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint64_t *keys = PyMem_Malloc((size_t)(size ? size : 1) * (sizeof(uint64_t) + 1));
    if (keys == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    *ok = (uint8_t *)(keys + size);
    for (Py_ssize_t j = 0; j < size; j++) {
        int got = as_key(items[j], &keys[j]);
        if (got < 0) {
            PyMem_Free(keys);
            return NULL;
        }
        (*ok)[j] = (uint8_t)got;
    }
    return keys;
}

/* Prefetch the home slot of key j (a pipeline BATCH keys ahead of the probes). */
static inline void ahead(const KeyTable *t, const uint64_t *keys, const uint8_t *ok, Py_ssize_t j,
                         Py_ssize_t size) {
    if (j < size && ok[j]) PREFETCH(&t->slots[mix(keys[j]) & t->mask]);
}

static int append_run(PyObject *out, PyObject *holders, Py_ssize_t count) {
    PyObject *pair = Py_BuildValue("(On)", holders, count);
    int rc = pair == NULL ? -1 : PyList_Append(out, pair);
    Py_XDECREF(pair);
    return rc;
}

/* runs(keys): [(holders, count), ...] over the longest prefix of keys in the table, one pair per
 * run of consecutive keys with the same holder object. */
static PyObject *table_runs(KeyTable *t, PyObject *keys) {
    PyObject *seq = PySequence_Fast(keys, "keys must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    uint8_t *ok;
    uint64_t *k = converted(seq, size, &ok);
    Py_DECREF(seq);
    if (k == NULL) return NULL;
    PyObject *out = PyList_New(0), *current = NULL;
    Py_ssize_t count = 0;
    if (out == NULL) goto fail;
    for (Py_ssize_t j = 0; j < BATCH; j++) ahead(t, k, ok, j, size);
    for (Py_ssize_t j = 0; j < size; j++) {
        ahead(t, k, ok, j + BATCH, size);
        uint32_t i = ok[j] ? find(t, k[j]) : NIL;
        if (i == NIL) break;
        PyObject *value = t->slots[i].value;
        if (value == current) {
            count++;
            continue;
        }
        if (current != NULL && append_run(out, current, count) < 0) goto fail;
        current = value;
        count = 1;
    }
    if (current != NULL && append_run(out, current, count) < 0) goto fail;
    PyMem_Free(k);
    return out;
fail:
    Py_XDECREF(out);
    PyMem_Free(k);
    return NULL;
}

/* touch(keys): move each key to the newest end, in order (every key must be present). The
 * slots are found a batch ahead, and the neighbours a move rewrites are prefetched too. */
static PyObject *table_touch(KeyTable *t, PyObject *keys) {
    PyObject *seq = PySequence_Fast(keys, "keys must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    uint8_t *ok;
    uint64_t *k = converted(seq, size, &ok);
    if (k == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    uint32_t found[BATCH];
    for (Py_ssize_t j = 0; j < BATCH; j++) ahead(t, k, ok, j, size);
    for (Py_ssize_t at = 0; at < size; at += BATCH) {
        Py_ssize_t n = size - at < BATCH ? size - at : BATCH;
        for (Py_ssize_t j = 0; j < n; j++) {
            ahead(t, k, ok, at + j + BATCH, size);
            found[j] = ok[at + j] ? find(t, k[at + j]) : NIL;
            if (found[j] == NIL) {
                PyErr_Format(PyExc_KeyError, "%R", PySequence_Fast_ITEMS(seq)[at + j]);
                Py_DECREF(seq);
                PyMem_Free(k);
                return NULL;
            }
            const Slot *s = &t->slots[found[j]];
            if (s->prev != NIL) PREFETCH(&t->slots[s->prev]);
            if (s->next != NIL) PREFETCH(&t->slots[s->next]);
        }
        /* Moves relink slots, never move them: the slots found stay valid. */
        for (Py_ssize_t j = 0; j < n; j++) move_to_end(t, found[j]);
    }
    Py_DECREF(seq);
    PyMem_Free(k);
    Py_RETURN_NONE;
}

/* add_keys(keys, value, capacity) -> (present, evicted): in order, each absent key is inserted
 * with `value` at the newest end and, past `capacity` keys, the oldest is evicted; each present
 * key is moved to the newest end and listed in `present` (its holders are the caller's to
 * change). `evicted` lists (key, holders) in eviction order. None, with nothing changed, when
 * a key is not an exact int in [0, 2**64) (the caller's check then names it). */
static PyObject *table_add_keys(KeyTable *t, PyObject *args) {
    PyObject *keys, *value;
    Py_ssize_t capacity;
    if (!PyArg_ParseTuple(args, "OOn:add_keys", &keys, &value, &capacity)) return NULL;
    if (capacity < 1) {
        PyErr_SetString(PyExc_ValueError, "capacity must be positive");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(keys, "keys must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint8_t *ok;
    uint64_t *k = converted(seq, size, &ok);
    if (k == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t j = 0; j < size; j++) {
        if (!ok[j] || !PyLong_CheckExact(items[j])) { /* bools and subclasses too */
            PyMem_Free(k);
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
    }
    PyObject *present = PyList_New(0), *evicted = PyList_New(0);
    if (present == NULL || evicted == NULL) goto fail;
    for (Py_ssize_t j = 0; j < BATCH; j++) ahead(t, k, ok, j, size);
    for (Py_ssize_t j = 0; j < size; j++) {
        ahead(t, k, ok, j + BATCH, size);
        /* Probed one by one: an insertion or eviction may move slots (a prefetched line is
         * still the one read). */
        uint32_t i = find(t, k[j]);
        if (i != NIL) {
            move_to_end(t, i);
            if (PyList_Append(present, items[j]) < 0) goto fail;
            continue;
        }
        if (insert(t, k[j], value) < 0) goto fail;
        if (t->used > capacity) {
            PyObject *pair = table_pop_oldest(t, NULL);
            if (pair == NULL || PyList_Append(evicted, pair) < 0) {
                Py_XDECREF(pair);
                goto fail;
            }
            Py_DECREF(pair);
        }
    }
    PyMem_Free(k);
    Py_DECREF(seq);
    return Py_BuildValue("(NN)", present, evicted);
fail:
    Py_XDECREF(present);
    Py_XDECREF(evicted);
    PyMem_Free(k);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef table_methods[] = {
    {"get", (PyCFunction)table_get, METH_O, "The holders of a key, or None."},
    {"move_to_end", (PyCFunction)table_move_to_end, METH_O, "Make a key the newest."},
    {"pop_oldest", (PyCFunction)table_pop_oldest, METH_NOARGS, "Remove and return the oldest (key, holders)."},
    {"keys", (PyCFunction)table_keys, METH_NOARGS, "The keys, oldest first."},
    {"values", (PyCFunction)table_values, METH_NOARGS, "The holders, oldest key first."},
    {"runs", (PyCFunction)table_runs, METH_O, "[(holders, count)] over the held prefix of keys."},
    {"touch", (PyCFunction)table_touch, METH_O, "Make each key the newest, in order."},
    {"add_keys", (PyCFunction)table_add_keys, METH_VARARGS, "Insert or refresh keys: (present, evicted)."},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods table_mapping = {
    (lenfunc)table_len,
    (binaryfunc)table_subscript,
    (objobjargproc)table_ass_subscript,
};

static PyTypeObject KeyTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tokenkeys.router.index._table.KeyTable",
    .tp_basicsize = sizeof(KeyTable),
    .tp_dealloc = (destructor)table_dealloc,
    .tp_as_mapping = &table_mapping,
    .tp_iter = (getiterfunc)table_iter,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "u64 key -> holder set, in recency order (oldest first).",
    .tp_methods = table_methods,
    .tp_new = table_new,
};

static PyObject *slot_size(PyObject *self, PyObject *unused) { return PyLong_FromSize_t(sizeof(Slot)); }

static PyObject *table_nbytes(PyObject *self, PyObject *obj) {
    if (!PyObject_TypeCheck(obj, &KeyTableType)) {
        PyErr_SetString(PyExc_TypeError, "nbytes() takes a KeyTable");
        return NULL;
    }
    KeyTable *t = (KeyTable *)obj;
    return PyLong_FromSize_t(sizeof(KeyTable) + (size_t)(t->mask + 1) * sizeof(Slot));
}

static PyMethodDef module_methods[] = {
    {"slot_size", slot_size, METH_NOARGS, "Bytes per slot."},
    {"nbytes", table_nbytes, METH_O, "Bytes a table's slot array and header take."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_table",
    "The in-memory prefix index's key table in C (tokenkeys/router/index/table.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__table(void) {
    if (PyType_Ready(&KeyTableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&KeyTableType);
    if (PyModule_AddObject(m, "KeyTable", (PyObject *)&KeyTableType) < 0) {
        Py_DECREF(&KeyTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
