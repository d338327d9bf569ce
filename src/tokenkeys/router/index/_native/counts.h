/* Module functions over a router's counts of keys in flight (counts.c). */
#ifndef TOKENKEYS_COUNTS_H
#define TOKENKEYS_COUNTS_H

#include <Python.h>

/* held_prefix(keys, counts): how many leading keys are in counts. */
PyObject *held_prefix(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* count_absent(counts, keys): how many keys of the dict counts are not in keys. */
PyObject *count_absent(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
