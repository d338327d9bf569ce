/* tokenkeys.router.index._table: the in-memory index's key table, u64 key -> holder set, in
 * recency order, as a Python type.
 *
 * The slot array is slots.c's; the bulk methods (runs, touch, touch_found, add_keys) are
 * bulk.c's, reading keys as keys.c converts them; the module's walks over a router's counts of
 * keys in flight are counts.c's. The holder sets are Python objects the table
 * holds a reference to; they never refer back to the table, so no cycle runs through it and
 * the type is not tracked by the cycle collector (a full collection never walks its millions
 * of slots). The pure-Python table (index/table.py, PyKeyTable) has the same methods and the
 * same results; the tests run the index through both.
 */
#include "bulk.h"
#include "counts.h"
#include "keys.h"
#include "slots.h"

static int key_or_raise(PyObject *obj, uint64_t *out) {
    int ok = key_value(obj, out);
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
    PyMem_Free(t->found);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t table_len(KeyTable *t) { return t->used; }

static PyObject *table_get(KeyTable *t, PyObject *key) {
    uint64_t k;
    int ok = key_value(key, &k);
    if (ok < 0) return NULL;
    uint32_t i = ok ? slots_find(t, k) : NIL;
    PyObject *value = i == NIL ? Py_None : t->slots[i].value;
    Py_INCREF(value);
    return value;
}

static PyObject *table_subscript(KeyTable *t, PyObject *key) {
    uint64_t k;
    if (key_or_raise(key, &k) < 0) return NULL;
    uint32_t i = slots_find(t, k);
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
        uint32_t i = slots_find(t, k);
        if (i == NIL) {
            PyErr_Format(PyExc_KeyError, "%R", key);
            return -1;
        }
        Py_DECREF(slots_take(t, i));
        return 0;
    }
    int ok = key_value(key, &k);
    if (ok <= 0) {
        if (ok == 0) PyErr_Format(PyExc_OverflowError, "key %R is not in [0, 2**64)", key);
        return -1;
    }
    uint32_t i = slots_find(t, k);
    if (i == NIL) return slots_insert(t, k, value);
    PyObject *old = t->slots[i].value;
    Py_INCREF(value);
    t->slots[i].value = value;
    Py_DECREF(old);
    return 0;
}

static PyObject *table_move_to_end(KeyTable *t, PyObject *key) {
    uint64_t k;
    if (key_or_raise(key, &k) < 0) return NULL;
    uint32_t i = slots_find(t, k);
    if (i == NIL) {
        PyErr_Format(PyExc_KeyError, "%R", key);
        return NULL;
    }
    slots_move_to_end(t, i);
    Py_RETURN_NONE;
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

/* reserve(n): the table expects to hold n keys (an index bounded by n keys reaches it). Once
 * n is within RESERVE_WITHIN times what it holds, its next growth makes room for all n. */
static PyObject *table_reserve(KeyTable *t, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "reserve(): n must not be negative");
        return NULL;
    }
    t->expected = (uint64_t)n < (uint64_t)NIL / 2 ? (uint64_t)n : (uint64_t)NIL / 2;
    Py_RETURN_NONE;
}

static PyMethodDef table_methods[] = {
    {"reserve", (PyCFunction)table_reserve, METH_O, "Expect n keys: grow to room for all when near."},
    {"get", (PyCFunction)table_get, METH_O, "The holders of a key, or None."},
    {"move_to_end", (PyCFunction)table_move_to_end, METH_O, "Make a key the newest."},
    {"pop_oldest", (PyCFunction)table_pop_oldest, METH_NOARGS, "Remove and return the oldest (key, holders)."},
    {"keys", (PyCFunction)table_keys, METH_NOARGS, "The keys, oldest first."},
    {"values", (PyCFunction)table_values, METH_NOARGS, "The holders, oldest key first."},
    {"runs", (PyCFunction)table_runs, METH_O, "[(holders, count)] over the held prefix of keys."},
    {"touch", (PyCFunction)table_touch, METH_O, "Make each key the newest, in order."},
    {"touch_found", (PyCFunction)table_touch_found, METH_O, "Make the first n keys runs() found the newest."},
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
    {"held_prefix", (PyCFunction)(void (*)(void))held_prefix, METH_FASTCALL,
     "How many leading keys of a sequence are in a container."},
    {"count_absent", (PyCFunction)(void (*)(void))count_absent, METH_FASTCALL,
     "How many keys of a dict are not in a container."},
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
