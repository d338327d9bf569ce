/* A chain's walk over a token buffer: its arguments checked, one scratch buffer for a block's
 * payload, and where each block's key goes (a list of BlockKey, or two flat buffers). Every
 * profile's chain opens a walk, puts one key per block, and closes it. */
#ifndef TOKENKEYS_WALK_H
#define TOKENKEYS_WALK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    Py_buffer view;
    const uint32_t *tokens;
    Py_ssize_t n_blocks, bs;
    uint8_t *scratch;      /* one block's payload, with CBOR_SLACK bytes of slack (encode.h) */
    PyTypeObject *type;    /* BlockKey (a tuple subclass), or NULL: raw buffers */
    PyObject *keys;        /* the list of BlockKey (type set) */
    PyObject *digests;     /* raw: bytes of n_blocks * dlen */
    PyObject *events;      /* raw: bytes of n_blocks native 64-bit event keys */
    Py_ssize_t dlen;
    int is_signed;         /* event keys are signed 64-bit (SGLang) */
} Walk;

/* Checks the key type (a tuple subclass, or None for raw buffers) and the tokens (a buffer of
 * uint32), allocates the scratch buffer of `fixed + bs * per_token` bytes and the results.
 * 0 on success; -1 with an error set and nothing to release. */
int walk_open(Walk *w, PyObject *key_type, PyObject *tokens, Py_ssize_t bs, size_t fixed,
              size_t per_token, Py_ssize_t dlen, int is_signed);

/* Block b's key: the digest's first dlen bytes and the event key. 0 on success. */
int walk_put(Walk *w, Py_ssize_t b, const uint8_t *digest, uint64_t event);

/* Releases the walk: the keys (a list, or (digests, events) bytes) if `ok`, else NULL. */
PyObject *walk_close(Walk *w, int ok);

/* Per-block bytes from an optional {block: bytes} dict: its value, or `fallback`. */
int walk_extra(PyObject *own, Py_ssize_t b, const char *fallback, Py_ssize_t fallback_len,
               const char **out, Py_ssize_t *out_len);

/* The longest bytes value of an optional dict (sizes the scratch buffer). */
Py_ssize_t walk_longest(PyObject *own);

/* A dict or None, else TypeError naming `what`. */
int walk_check_dict(PyObject *obj, const char *what);

#endif
