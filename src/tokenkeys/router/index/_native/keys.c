/* Keys for the bulk methods (keys.h). */
#include "keys.h"

#include <string.h>

/* An exact int of up to three 30-bit digits (every u64) is read in place on 3.10-3.11:
 * PyLong_AsUnsignedLongLong goes through _PyLong_AsByteArray there, which cost more per key
 * than the whole probe. */
int key_value(PyObject *obj, uint64_t *out) {
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

static int alloc(Keys *k, Py_ssize_t size) {
    k->size = size;
    k->keys = PyMem_Malloc((size_t)(size ? size : 1) * (sizeof(uint64_t) + 1));
    if (k->keys == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    k->ok = (uint8_t *)(k->keys + size);
    return 0;
}

/* A buffer of unsigned 64-bit words; 1 if `obj` is one (read), 0 if it is no buffer of them. */
static int open_words(Keys *k, PyObject *obj) {
    if (!PyObject_CheckBuffer(obj) || PyBytes_Check(obj) || PyByteArray_Check(obj)) return 0;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = view.format ? view.format : "B";
    if (*f == '=' || *f == '<' || *f == '@') f++;
    int words = view.itemsize == 8 && (strcmp(f, "Q") == 0 || strcmp(f, "L") == 0);
    if (words && alloc(k, view.len / 8) == 0) {
        memcpy(k->keys, view.buf, (size_t)view.len);
        memset(k->ok, 1, (size_t)k->size);
        k->all_ok = 1;
    }
    PyBuffer_Release(&view);
    return words ? (k->keys ? 1 : -1) : 0;
}

int keys_open(Keys *k, PyObject *obj) {
    memset(k, 0, sizeof(*k));
    int words = open_words(k, obj);
    if (words != 0) return words < 0 ? -1 : 0;
    k->seq = PySequence_Fast(obj, "keys must be a sequence");
    if (k->seq == NULL) return -1;
    if (alloc(k, PySequence_Fast_GET_SIZE(k->seq)) < 0) {
        keys_close(k);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(k->seq);
    k->all_ok = 1;
    for (Py_ssize_t j = 0; j < k->size; j++) {
        int got = key_value(items[j], &k->keys[j]);
        if (got < 0) {
            keys_close(k);
            return -1;
        }
        /* bools and int subclasses are never keys (they would serialize differently) */
        k->ok[j] = (uint8_t)(got && PyLong_CheckExact(items[j]));
        k->all_ok &= k->ok[j];
    }
    return 0;
}

void keys_close(Keys *k) {
    PyMem_Free(k->keys);
    Py_XDECREF(k->seq);
    memset(k, 0, sizeof(*k));
}
