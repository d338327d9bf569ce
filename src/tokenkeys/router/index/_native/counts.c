/* Two walks over a prompt's keys against a router's counts of keys in flight (index/table.py:
 * held_prefix and count_absent, which say what they compute; router/workers/load_view.py calls
 * them once per candidate worker and decision, over every block of the prompt). The same
 * membership tests as the Python loops, in the same order, so the same answers and the same
 * exceptions; only the interpreter's per-key dispatch is gone. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "counts.h"

PyObject *held_prefix(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "held_prefix() takes 2 arguments");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "held_prefix() takes a sequence of keys");
    if (seq == NULL) return NULL;
    PyObject *counts = args[1];
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (; i < n; i++) {
        int found = PySequence_Contains(counts, items[i]);
        if (found < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        if (!found) break;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(i);
}

PyObject *count_absent(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "count_absent() takes a dict and a set of keys");
        return NULL;
    }
    PyObject *counts = args[0], *keys = args[1], *key, *value;
    Py_ssize_t pos = 0, absent = 0;
    while (PyDict_Next(counts, &pos, &key, &value)) {
        int found = PySequence_Contains(keys, key);
        if (found < 0) return NULL;
        absent += !found;
    }
    return PyLong_FromSsize_t(absent);
}
