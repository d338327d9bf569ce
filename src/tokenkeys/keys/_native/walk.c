/* A chain's walk (walk.h): argument checks, the scratch buffer, the results. */
#include "walk.h"

#include <string.h>

#include "encode.h"

static int open_tokens(Walk *w, PyObject *obj, Py_ssize_t bs) {
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "block size must be positive");
        return -1;
    }
    if (PyObject_GetBuffer(obj, &w->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *f = w->view.format;
    if (w->view.itemsize != 4 || f == NULL ||
        (strcmp(f, "I") != 0 && strcmp(f, "=I") != 0 && strcmp(f, "<I") != 0)) {
        PyBuffer_Release(&w->view);
        PyErr_SetString(PyExc_TypeError, "tokens must be a buffer of uint32 ('I')");
        return -1;
    }
    w->tokens = (const uint32_t *)w->view.buf;
    w->bs = bs;
    w->n_blocks = w->view.len / 4 / bs;
    return 0;
}

int walk_open(Walk *w, PyObject *key_type, PyObject *tokens, Py_ssize_t bs, size_t fixed,
              size_t per_token, Py_ssize_t dlen, int is_signed) {
    memset(w, 0, sizeof(*w));
    if (key_type != Py_None) {
        if (!PyType_Check(key_type) || !PyType_IsSubtype((PyTypeObject *)key_type, &PyTuple_Type)) {
            PyErr_SetString(PyExc_TypeError, "key type must be a tuple subclass or None");
            return -1;
        }
        w->type = (PyTypeObject *)key_type;
    }
    if (open_tokens(w, tokens, bs) < 0) return -1;
    w->dlen = dlen;
    w->is_signed = is_signed;
    w->scratch = PyMem_Malloc(fixed + (size_t)bs * per_token + CBOR_SLACK);
    if (w->type != NULL) {
        w->keys = PyList_New(w->n_blocks);
    } else {
        w->digests = PyBytes_FromStringAndSize(NULL, w->n_blocks * dlen);
        w->events = PyBytes_FromStringAndSize(NULL, w->n_blocks * 8);
    }
    if (w->scratch == NULL || (w->type ? w->keys == NULL : !w->digests || !w->events)) {
        walk_close(w, 0);
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* A BlockKey made as tuple.__new__(BlockKey, (digest, event)) does; steals both references. */
static PyObject *block_key(PyTypeObject *type, PyObject *digest, PyObject *event) {
    PyObject *key = digest && event ? type->tp_alloc(type, 2) : NULL;
    if (key == NULL) {
        Py_XDECREF(digest);
        Py_XDECREF(event);
        return NULL;
    }
    PyTuple_SET_ITEM(key, 0, digest);
    PyTuple_SET_ITEM(key, 1, event);
    return key;
}

int walk_put(Walk *w, Py_ssize_t b, const uint8_t *digest, uint64_t event) {
    if (w->type == NULL) {
        memcpy(PyBytes_AS_STRING(w->digests) + b * w->dlen, digest, (size_t)w->dlen);
        memcpy(PyBytes_AS_STRING(w->events) + b * 8, &event, 8);
        return 0;
    }
    PyObject *key = block_key(
        w->type, PyBytes_FromStringAndSize((const char *)digest, w->dlen),
        w->is_signed ? PyLong_FromLongLong((long long)event) : PyLong_FromUnsignedLongLong(event));
    if (key == NULL) return -1;
    PyList_SET_ITEM(w->keys, b, key);
    return 0;
}

PyObject *walk_close(Walk *w, int ok) {
    PyObject *out = NULL;
    if (ok) {
        out = w->type ? w->keys : PyTuple_Pack(2, w->digests, w->events);
        if (w->type) w->keys = NULL; /* handed over */
    }
    PyMem_Free(w->scratch);
    if (w->view.obj != NULL) PyBuffer_Release(&w->view);
    Py_XDECREF(w->keys);
    Py_XDECREF(w->digests);
    Py_XDECREF(w->events);
    memset(w, 0, sizeof(*w));
    return out;
}

int walk_extra(PyObject *own, Py_ssize_t b, const char *fallback, Py_ssize_t fallback_len,
               const char **out, Py_ssize_t *out_len) {
    *out = fallback;
    *out_len = fallback_len;
    if (own == NULL || own == Py_None || PyDict_GET_SIZE(own) == 0) return 0;
    PyObject *index = PyLong_FromSsize_t(b);
    if (index == NULL) return -1;
    PyObject *value = PyDict_GetItemWithError(own, index);
    Py_DECREF(index);
    if (value == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyBytes_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "per-block extras must be bytes");
        return -1;
    }
    *out = PyBytes_AS_STRING(value);
    *out_len = PyBytes_GET_SIZE(value);
    return 0;
}

Py_ssize_t walk_longest(PyObject *own) {
    Py_ssize_t pos = 0, most = 0;
    PyObject *k, *v;
    if (own == NULL || own == Py_None) return 0;
    while (PyDict_Next(own, &pos, &k, &v))
        if (PyBytes_Check(v) && PyBytes_GET_SIZE(v) > most) most = PyBytes_GET_SIZE(v);
    return most;
}

int walk_check_dict(PyObject *obj, const char *what) {
    if (obj == Py_None || PyDict_Check(obj)) return 0;
    PyErr_Format(PyExc_TypeError, "%s must be a dict or None", what);
    return -1;
}
