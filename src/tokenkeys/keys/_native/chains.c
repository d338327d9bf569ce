/* tokenkeys.keys._chains: block-key chains of the client-computable profiles in one pass.
 *
 * Each chain walks a uint32 token buffer block by block (walk.h): it writes the block's
 * payload (canonical CBOR, or little-endian words: encode.h) into one scratch buffer, hashes
 * it, and puts the block's key: a BlockKey (digest bytes, event integer) into a list, or, with
 * None for the key type, the digest and the 64-bit event key into two flat buffers (no Python
 * object per block: what keys/spec.py's KeyArray wraps). The Python profiles compute
 * everything that is not per block (roots, extra-key tails, seeds) and pass it in, so this file
 * knows only byte layouts and digests; the pure-Python fast paths in the profile modules are
 * the same algorithms and the tests run every vector through both.
 *
 * Digests: SHA-256 is written here (sha256.h); XXH3 and XXH64 are libxxhash's, found in the
 * xxhash package (xxh.c); FNV-1a-64 is a loop (encode.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "encode.h"
#include "sha256.h"
#include "walk.h"
#include "xxh.h"

static int need_xxhash(int needed) {
    if (needed && tk_xxh3_128 == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "xxhash's C entry points are not available");
        return -1;
    }
    return 0;
}

/* ---- vLLM *_cbor ------------------------------------------------------------------------- */

PyDoc_STRVAR(vllm_cbor_doc,
             "vllm_cbor(key_type, tokens, block_size, parent, first_tail, common_tail, own, "
             "sha256)\n\nvLLM sha256_cbor / xxhash_cbor: block b hashes the canonical CBOR of "
             "[parent, tokens_b, extra_b]; first_tail is block 0's extra CBOR, own[b] a block's "
             "own, common_tail every other's. Event key: the digest's last 8 bytes. key_type "
             "None: (digests, events) as bytes.");

static PyObject *vllm_cbor(PyObject *self, PyObject *args) {
    PyObject *type, *tok_obj, *own;
    Py_ssize_t bs;
    const char *parent, *first, *common;
    Py_ssize_t parent_len, first_len, common_len;
    int use_sha;
    if (!PyArg_ParseTuple(args, "OOny#y#y#Op", &type, &tok_obj, &bs, &parent, &parent_len,
                          &first, &first_len, &common, &common_len, &own, &use_sha))
        return NULL;
    if (need_xxhash(!use_sha) < 0 || walk_check_dict(own, "own") < 0) return NULL;
    Py_ssize_t dlen = use_sha ? 32 : 16;
    Py_ssize_t tail = first_len > common_len ? first_len : common_len;
    Py_ssize_t own_max = walk_longest(own);
    tail = own_max > tail ? own_max : tail;
    size_t fixed = 1 + 9 + (size_t)(parent_len > dlen ? parent_len : dlen) + 9 + (size_t)tail;
    Walk w;
    if (walk_open(&w, type, tok_obj, bs, fixed, 5, dlen, 0) < 0) return NULL;
    uint8_t digest[32];
    const uint8_t *prev = (const uint8_t *)parent;
    Py_ssize_t prev_len = parent_len;
    for (Py_ssize_t b = 0; b < w.n_blocks; b++) {
        const char *extra = first;
        Py_ssize_t extra_len = first_len;
        if (b > 0 && walk_extra(own, b, common, common_len, &extra, &extra_len) < 0)
            return walk_close(&w, 0);
        uint8_t *p = w.scratch;
        *p++ = 0x83;
        p = cbor_head(p, 2, (uint64_t)prev_len);
        memmove(p, prev, (size_t)prev_len);
        p += prev_len;
        p = cbor_tokens(p, w.tokens + b * bs, bs);
        memcpy(p, extra, (size_t)extra_len);
        p += extra_len;
        if (use_sha) {
            sha256(w.scratch, (size_t)(p - w.scratch), digest);
        } else {
            xxh128_t h = tk_xxh3_128(w.scratch, (size_t)(p - w.scratch));
            put_be64(put_be64(digest, h.high64), h.low64);
        }
        if (walk_put(&w, b, digest, get_be64(digest + dlen - 8)) < 0) return walk_close(&w, 0);
        prev = digest;
        prev_len = dlen;
    }
    return walk_close(&w, 1);
}

/* ---- SGLang ------------------------------------------------------------------------------ */

PyDoc_STRVAR(sglang_doc,
             "sglang(key_type, tokens, block_size, prior)\n\nSGLang page hashes: "
             "SHA-256(prior || u32-LE tokens), prior the previous digest (block 0: the given "
             "prior, possibly empty). Event key: the first 8 bytes, signed.");

static PyObject *sglang(PyObject *self, PyObject *args) {
    PyObject *type, *tok_obj;
    Py_ssize_t bs, prior_len;
    const char *prior;
    if (!PyArg_ParseTuple(args, "OOny#", &type, &tok_obj, &bs, &prior, &prior_len)) return NULL;
    Walk w;
    if (walk_open(&w, type, tok_obj, bs, (size_t)(prior_len > 32 ? prior_len : 32), 4, 32, 1) <
        0)
        return NULL;
    uint8_t digest[32];
    memcpy(w.scratch, prior, (size_t)prior_len);
    Py_ssize_t head = prior_len;
    for (Py_ssize_t b = 0; b < w.n_blocks; b++) {
        uint8_t *p = le_tokens(w.scratch + head, w.tokens + b * bs, bs);
        sha256(w.scratch, (size_t)(p - w.scratch), digest);
        if (walk_put(&w, b, digest, get_be64(digest)) < 0) return walk_close(&w, 0);
        memcpy(w.scratch, digest, 32);
        head = 32;
    }
    return walk_close(&w, 1);
}

/* ---- u64 chains: Dynamo, llm-d ------------------------------------------------------------ */

enum chain_kind { DYNAMO, LLMD_CBOR, LLMD_XXH64 };

/* One u64 chain; `extras` maps a block to bytes appended to its payload. `start` is the first
 * parent (for Dynamo: has_start says whether there is one; without, the chain starts at the
 * first local hash). */
static PyObject *u64_chain(PyObject *args, enum chain_kind kind) {
    PyObject *type, *tok_obj, *extras;
    Py_ssize_t bs;
    unsigned long long start, seed = 0;
    int has_start = 1;
    if (kind == DYNAMO) {
        if (!PyArg_ParseTuple(args, "OOnKpKO", &type, &tok_obj, &bs, &seed, &has_start, &start,
                              &extras))
            return NULL;
    } else if (!PyArg_ParseTuple(args, "OOnKO", &type, &tok_obj, &bs, &start, &extras)) {
        return NULL;
    }
    if (need_xxhash(kind != LLMD_CBOR) < 0 || walk_check_dict(extras, "extras") < 0) return NULL;
    Walk w;
    if (walk_open(&w, type, tok_obj, bs, 1 + 9 + 9 + 1 + (size_t)walk_longest(extras), 5, 8, 0) <
        0)
        return NULL;
    uint64_t key = start;
    static const char null_extra[] = "\xf6";
    int none = kind == LLMD_CBOR; /* llm-d's CBOR payload ends in null without extras */
    for (Py_ssize_t b = 0; b < w.n_blocks; b++) {
        const uint32_t *tok = w.tokens + b * bs;
        const char *extra;
        Py_ssize_t extra_len;
        if (walk_extra(extras, b, null_extra, none ? 1 : 0, &extra, &extra_len) < 0)
            return walk_close(&w, 0);
        uint8_t *p = w.scratch;
        if (kind == LLMD_CBOR) {
            *p++ = 0x83;
            p = cbor_head(p, 0, key);
            p = cbor_tokens(p, tok, bs);
        } else if (kind == LLMD_XXH64) {
            p = le_tokens(put_le64(p, key), tok, bs);
        } else {
            p = le_tokens(p, tok, bs);
        }
        memcpy(p, extra, (size_t)extra_len);
        p += extra_len;
        size_t len = (size_t)(p - w.scratch);
        if (kind == LLMD_CBOR) {
            key = fnv1a64(w.scratch, len);
        } else if (kind == LLMD_XXH64) {
            key = tk_xxh64(w.scratch, len, 0);
        } else {
            uint64_t local = tk_xxh3_64_seeded(w.scratch, len, seed);
            if (has_start) {
                uint8_t pair[16];
                put_le64(put_le64(pair, key), local);
                key = tk_xxh3_64_seeded(pair, 16, 1337);
            } else {
                key = local;
                has_start = 1;
            }
        }
        uint8_t digest[8];
        put_be64(digest, key);
        if (walk_put(&w, b, digest, key) < 0) return walk_close(&w, 0);
    }
    return walk_close(&w, 1);
}

PyDoc_STRVAR(dynamo_doc,
             "dynamo(key_type, tokens, block_size, seed, has_parent, parent, mm)\n\nDynamo "
             "sequence hashes: local = XXH3-64(u32-LE tokens || mm[b], seed), seq = "
             "XXH3-64(u64-LE seq || u64-LE local, 1337), the first local hash starting the chain "
             "without a parent.");

static PyObject *dynamo(PyObject *self, PyObject *args) { return u64_chain(args, DYNAMO); }

PyDoc_STRVAR(llmd_cbor_doc,
             "llmd_cbor(key_type, tokens, block_size, root, extras)\n\nllm-d cbor-fnv64: key = "
             "FNV-1a-64(CBOR [parent, tokens_b, extras[b] or null]).");

static PyObject *llmd_cbor(PyObject *self, PyObject *args) { return u64_chain(args, LLMD_CBOR); }

PyDoc_STRVAR(llmd_xxh64_doc,
             "llmd_xxh64(key_type, tokens, block_size, root, extras)\n\nllm-d xxh64: key = "
             "XXH64(u64-LE parent || u32-LE tokens || extras[b], 0).");

static PyObject *llmd_xxh64(PyObject *self, PyObject *args) {
    return u64_chain(args, LLMD_XXH64);
}

PyDoc_STRVAR(digest_doc,
             "digest(name, data)\n\nOne digest by this module's own code ('sha256', "
             "'xxh3_128', 'xxh3_64:<seed>', 'xxh64:<seed>', 'fnv1a64'), for the tests that "
             "compare it with hashlib and xxhash.");

static PyObject *digest(PyObject *self, PyObject *args) {
    const char *name;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "sy*", &name, &data)) return NULL;
    uint8_t out[32];
    Py_ssize_t n = 8;
    const uint8_t *buf = data.buf;
    size_t len = (size_t)data.len;
    unsigned long long seed = 0;
    const char *colon = strchr(name, ':');
    if (colon != NULL) seed = strtoull(colon + 1, NULL, 10);
    size_t stem = colon ? (size_t)(colon - name) : strlen(name);
    if (stem == 6 && strncmp(name, "sha256", 6) == 0) {
        sha256(buf, len, out);
        n = 32;
    } else if (stem == 8 && strncmp(name, "xxh3_128", 8) == 0 && tk_xxh3_128 != NULL) {
        xxh128_t h = tk_xxh3_128(buf, len);
        put_be64(put_be64(out, h.high64), h.low64);
        n = 16;
    } else if (stem == 7 && strncmp(name, "xxh3_64", 7) == 0 && tk_xxh3_64_seeded != NULL) {
        put_be64(out, tk_xxh3_64_seeded(buf, len, seed));
    } else if (stem == 5 && strncmp(name, "xxh64", 5) == 0 && tk_xxh64 != NULL) {
        put_be64(out, tk_xxh64(buf, len, seed));
    } else if (stem == 7 && strncmp(name, "fnv1a64", 7) == 0) {
        put_be64(out, fnv1a64(buf, len));
    } else {
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "no digest %s here", name);
        return NULL;
    }
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)out, n);
}

/* ---- token lists -------------------------------------------------------------------------- */


/* An exact int's value if it is in [0, 2**32), else -1. Small ints are read in place (one
 * 30-bit digit, or the compact value on 3.12+) instead of through PyLong_AsUnsignedLongLong:
 * at a few ns per token that call cost as much as the chain's whole per-block work. */
static int64_t token_value(PyObject *item) {
    if (!PyLong_CheckExact(item)) return -1;
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)item)) {
        Py_ssize_t v = PyUnstable_Long_CompactValue((PyLongObject *)item);
        return v >= 0 && (uint64_t)v <= 0xFFFFFFFFULL ? (int64_t)v : -1;
    }
#elif PY_VERSION_HEX >= 0x030A0000 && !defined(Py_LIMITED_API) && PYLONG_BITS_IN_DIGIT == 30
    Py_ssize_t size = Py_SIZE(item);
    if (size == 0) return 0;
    if (size == 1) return (int64_t)((PyLongObject *)item)->ob_digit[0];
#endif
    unsigned long long v = PyLong_AsUnsignedLongLong(item);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return v <= 0xFFFFFFFFULL ? (int64_t)v : -1;
}


PyDoc_STRVAR(u32_into_doc,
             "u32_into(tokens, out)\n\nA list or tuple of ints in [0, 2**32) written into "
             "out, a writable uint32 buffer of the same length (an array('I')): True, or False "
             "with out partly written when an item is anything else (the caller's own "
             "conversion then names the bad token). Into the caller's array: bytes and then an "
             "array's copy of them took two large allocations per call.");

static PyObject *u32_into(PyObject *self, PyObject *args) {
    PyObject *seq, *out;
    if (!PyArg_ParseTuple(args, "OO", &seq, &out)) return NULL;
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) Py_RETURN_FALSE;
    Py_buffer view;
    if (PyObject_GetBuffer(out, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (view.itemsize != 4 || view.format == NULL || strcmp(view.format, "I") != 0 ||
        view.len != n * 4) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "out must be a uint32 buffer of the tokens' length");
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint32_t *dst = view.buf;
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        int64_t v = token_value(items[i]);
        ok = v >= 0;
        dst[i] = (uint32_t)v;
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

/* ---- module ------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"vllm_cbor", vllm_cbor, METH_VARARGS, vllm_cbor_doc},
    {"sglang", sglang, METH_VARARGS, sglang_doc},
    {"dynamo", dynamo, METH_VARARGS, dynamo_doc},
    {"llmd_cbor", llmd_cbor, METH_VARARGS, llmd_cbor_doc},
    {"llmd_xxh64", llmd_xxh64, METH_VARARGS, llmd_xxh64_doc},
    {"digest", digest, METH_VARARGS, digest_doc},
    {"u32_into", u32_into, METH_VARARGS, u32_into_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_chains",
    "Block-key chains of the client-computable profiles in C (see keys/native.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__chains(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    const char *env = getenv("TOKENKEYS_SHA_NI");
    const char *sha = sha256_setup(env == NULL || strcmp(env, "0") != 0);
    tk_find_xxhash();
    if (PyModule_AddStringConstant(m, "SHA256", sha) < 0 ||
        PyModule_AddObject(m, "XXHASH", PyBool_FromLong(tk_xxh3_128 != NULL)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
