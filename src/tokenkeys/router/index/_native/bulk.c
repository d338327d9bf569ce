/* The key table's bulk methods (bulk.h). */
#include "bulk.h"

#include "keys.h"

/* Key j as a Python int (new reference): the caller's own object where it gave a list. */
static PyObject *key_object(const Keys *k, Py_ssize_t j) {
    if (k->seq != NULL) {
        PyObject *item = PySequence_Fast_ITEMS(k->seq)[j];
        Py_INCREF(item);
        return item;
    }
    return PyLong_FromUnsignedLongLong(k->keys[j]);
}

static int append_run(PyObject *out, PyObject *holders, Py_ssize_t count) {
    PyObject *pair = Py_BuildValue("(On)", holders, count);
    int rc = pair == NULL ? -1 : PyList_Append(out, pair);
    Py_XDECREF(pair);
    return rc;
}

/* Keep the slots found, for touch_found(). */
static int remember(KeyTable *t, const uint32_t *slots, Py_ssize_t n) {
    if (n > t->found_cap) {
        uint32_t *more = PyMem_Realloc(t->found, (size_t)n * sizeof(uint32_t));
        if (more == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->found = more;
        t->found_cap = n;
    }
    memcpy(t->found, slots, (size_t)n * sizeof(uint32_t));
    t->found_n = n;
    t->found_version = t->version;
    return 0;
}

/* runs(keys): [(holders, count), ...] over the longest prefix of keys in the table, one pair per
 * run of consecutive keys with the same holder object; None, when a key is not an exact int in
 * [0, 2**64) (the caller's check then names it). The slots of that prefix are kept for
 * touch_found(). */
PyObject *table_runs(KeyTable *t, PyObject *keys) {
    Keys k;
    if (keys_open(&k, keys) < 0) return NULL;
    if (!k.all_ok) {
        keys_close(&k);
        Py_RETURN_NONE;
    }
    PyObject *out = PyList_New(0), *current = NULL;
    uint32_t *slots = PyMem_Malloc((size_t)(k.size ? k.size : 1) * sizeof(uint32_t));
    Py_ssize_t count = 0, held = 0;
    if (out == NULL || slots == NULL) goto fail;
    probe_start(t, &k);
    for (; held < k.size; held++) {
        uint32_t i = probe(t, &k, held);
        if (i == NIL) break;
        slots[held] = i;
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
    if (remember(t, slots, held) < 0) goto fail;
    PyMem_Free(slots);
    keys_close(&k);
    return out;
fail:
    if (out == NULL || slots == NULL) PyErr_NoMemory();
    Py_XDECREF(out);
    PyMem_Free(slots);
    keys_close(&k);
    return NULL;
}

/* Slot `last`, a run of slots linked from `first`, goes to the newest end as a block. */
static void splice_to_end(KeyTable *t, uint32_t first, uint32_t last) {
    if (last == t->tail) return; /* already the newest */
    Slot *f = &t->slots[first], *l = &t->slots[last];
    if (f->prev == NIL) t->head = l->next; else t->slots[f->prev].next = l->next;
    t->slots[l->next].prev = f->prev; /* l->next exists: last is not the tail */
    f->prev = t->tail;
    t->slots[t->tail].next = first;
    l->next = NIL;
    t->tail = last;
}

/* Make slots newest in order. Slots already linked in that order (a prompt touched or stored
 * before: the usual case) move as one block, so a lookup repeated costs one relink, not one
 * per key; the result is the order moving each slot to the end in turn gives. Contiguity is
 * read as the list is now, just before each splice, so repeated slots are right too. */
static void move_all(KeyTable *t, const uint32_t *found, Py_ssize_t n) {
    Py_ssize_t j = 0;
    while (j < n) {
        Py_ssize_t end = j;
        while (end + 1 < n && t->slots[found[end]].next == found[end + 1]) end++;
        splice_to_end(t, found[j], found[end]);
        j = end + 1;
    }
}

/* touch_found(n): make the first n keys the last runs() found the newest, in order. Valid only
 * while no slot has moved since (the index calls it right after runs(), in the same lookup),
 * while the slots read are still in cache. */
PyObject *table_touch_found(KeyTable *t, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > t->found_n || t->found_version != t->version) {
        PyErr_SetString(PyExc_RuntimeError, "touch_found() after a change of the table");
        return NULL;
    }
    move_all(t, t->found, n);
    Py_RETURN_NONE;
}

/* touch(keys): make each key (all present) the newest, in order. */
PyObject *table_touch(KeyTable *t, PyObject *keys) {
    Keys k;
    if (keys_open(&k, keys) < 0) return NULL;
    uint32_t *found = PyMem_Malloc((size_t)(k.size ? k.size : 1) * sizeof(uint32_t));
    if (found == NULL) {
        keys_close(&k);
        return PyErr_NoMemory();
    }
    probe_start(t, &k);
    for (Py_ssize_t j = 0; j < k.size; j++) {
        found[j] = probe(t, &k, j);
        if (found[j] == NIL) {
            PyObject *key = key_object(&k, j);
            if (key != NULL) PyErr_SetObject(PyExc_KeyError, key);
            Py_XDECREF(key);
            PyMem_Free(found);
            keys_close(&k);
            return NULL;
        }
    }
    move_all(t, found, k.size);
    PyMem_Free(found);
    keys_close(&k);
    Py_RETURN_NONE;
}

PyObject *table_pop_oldest(KeyTable *t, PyObject *unused) {
    if (t->head == NIL) {
        PyErr_SetString(PyExc_KeyError, "pop_oldest(): the table is empty");
        return NULL;
    }
    uint32_t i = t->head;
    PyObject *key = PyLong_FromUnsignedLongLong(t->slots[i].key);
    if (key == NULL) return NULL;
    PyObject *value = slots_take(t, i);
    PyObject *pair = PyTuple_Pack(2, key, value);
    Py_DECREF(key);
    Py_DECREF(value);
    return pair;
}

/* add_keys(keys, value, capacity, log=None) -> (present, evicted): in order, each absent key is
 * inserted with `value` at the newest end and, past `capacity` keys, the oldest is evicted;
 * each present key is moved to the newest end and listed in `present` (its holders are the
 * caller's to change). `evicted` lists (key, holders) in eviction order (either is an empty
 * tuple when there are none). The keys' u64 words
 * are appended to `log` (an array('Q'), by its frombytes: already converted here). None, with
 * nothing changed, when a key is not an exact int in [0, 2**64) (the caller's check then names
 * it). */
PyObject *table_add_keys(KeyTable *t, PyObject *args) {
    PyObject *keys, *value, *log = Py_None;
    Py_ssize_t capacity;
    if (!PyArg_ParseTuple(args, "OOn|O:add_keys", &keys, &value, &capacity, &log)) return NULL;
    if (capacity < 1) {
        PyErr_SetString(PyExc_ValueError, "capacity must be positive");
        return NULL;
    }
    Keys k;
    if (keys_open(&k, keys) < 0) return NULL;
    if (!k.all_ok) {
        keys_close(&k);
        Py_RETURN_NONE;
    }
    /* Made on first use: most adds of a stream of new blocks have neither. */
    PyObject *present = NULL, *evicted = NULL;
    probe_start(t, &k);
    for (Py_ssize_t j = 0; j < k.size; j++) {
        /* Probed one by one: an insertion or eviction may move slots (a prefetched line is
         * still the one read). */
        uint32_t i = probe(t, &k, j);
        if (i != NIL) {
            slots_move_to_end(t, i);
            if (present == NULL && (present = PyList_New(0)) == NULL) goto fail;
            PyObject *key = key_object(&k, j);
            int rc = key == NULL ? -1 : PyList_Append(present, key);
            Py_XDECREF(key);
            if (rc < 0) goto fail;
            continue;
        }
        if (slots_insert(t, k.keys[j], value) < 0) goto fail;
        if (t->used > capacity) {
            if (evicted == NULL && (evicted = PyList_New(0)) == NULL) goto fail;
            PyObject *pair = table_pop_oldest(t, NULL);
            if (pair == NULL || PyList_Append(evicted, pair) < 0) {
                Py_XDECREF(pair);
                goto fail;
            }
            Py_DECREF(pair);
        }
    }
    if (log != Py_None && k.size) {
        PyObject *done = PyObject_CallMethod(log, "frombytes", "y#", (const char *)k.keys,
                                             k.size * (Py_ssize_t)sizeof(uint64_t));
        if (done == NULL) goto fail;
        Py_DECREF(done);
    }
    keys_close(&k);
    PyObject *none = PyTuple_New(0); /* the empty tuple, shared */
    if (none == NULL) goto fail;
    PyObject *out = PyTuple_Pack(2, present ? present : none, evicted ? evicted : none);
    Py_DECREF(none);
    Py_XDECREF(present);
    Py_XDECREF(evicted);
    return out;
fail:
    Py_XDECREF(present);
    Py_XDECREF(evicted);
    keys_close(&k);
    return NULL;
}
