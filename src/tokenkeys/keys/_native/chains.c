/* tokenkeys.keys._chains: block-key chains of the client-computable profiles in one pass.
 *
 * Each function walks a uint32 token buffer block by block: it writes the block's payload
 * (canonical CBOR, or little-endian words) into one scratch buffer, hashes it, and appends a
 * BlockKey (digest bytes, event integer) to the result. The Python profiles compute everything
 * that is not per block (roots, extra-key tails, seeds) and pass it in, so this file knows only
 * byte layouts and digests; the pure-Python fast paths in the profile modules are the same algorithms and
 * the tests run every vector through both.
 *
 * Digests: SHA-256 is written here (sha256.h). XXH3 and XXH64 come from the xxhash package
 * already imported (a runtime dependency): its extension module exports libxxhash's public C
 * API, and the entry points are looked up there at import and checked against the package's own
 * Python functions; where that fails (another build, no dlsym) XXHASH is False and the Python
 * paths are used for those profiles. FNV-1a-64 is a loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "sha256.h"

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#define TOKENKEYS_DLSYM 1
#endif

/* libxxhash 0.8 public API (xxhash.h): XXH128_hash_t is {low64, high64}. */
typedef struct {
    uint64_t low64;
    uint64_t high64;
} xxh128_t;
typedef xxh128_t (*xxh3_128_fn)(const void *, size_t);
typedef uint64_t (*xxh_seeded_fn)(const void *, size_t, uint64_t);

static xxh3_128_fn xxh3_128;
static xxh_seeded_fn xxh3_64_seeded;
static xxh_seeded_fn xxh64;

/* ---- byte helpers ------------------------------------------------------------------------ */

static uint8_t *put_be64(uint8_t *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static uint8_t *put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static uint64_t get_be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}

/* The shortest CBOR head of major type `major` with argument n (RFC 8949 §3, deterministic). */
static uint8_t *cbor_head(uint8_t *p, unsigned major, uint64_t n) {
    uint8_t mt = (uint8_t)(major << 5);
    if (n < 24) {
        *p++ = mt | (uint8_t)n;
    } else if (n <= 0xFF) {
        *p++ = mt | 24;
        *p++ = (uint8_t)n;
    } else if (n <= 0xFFFF) {
        *p++ = mt | 25;
        *p++ = (uint8_t)(n >> 8);
        *p++ = (uint8_t)n;
    } else if (n <= 0xFFFFFFFFULL) {
        *p++ = mt | 26;
        for (int i = 3; i >= 0; i--) *p++ = (uint8_t)(n >> (8 * i));
    } else {
        *p++ = mt | 27;
        p = put_be64(p, n);
    }
    return p;
}

/* Canonical CBOR of a block's tokens (array head included). Branch-free per token (token ids
 * of a large vocabulary mix 3- and 5-byte forms at random, which a branch mispredicts): the
 * head byte and the big-endian value shifted to its shortest width are always stored, and the
 * pointer advances by the width. Each store may write up to 4 bytes past the token's form,
 * which the next token or the tail overwrites; callers leave 4 bytes of slack. */
static uint8_t *cbor_tokens(uint8_t *p, const uint32_t *tok, Py_ssize_t bs) {
    p = cbor_head(p, 4, (uint64_t)bs);
    for (Py_ssize_t i = 0; i < bs; i++) {
        uint32_t t = tok[i];
        unsigned steps = (t >= 24) + (t >= 0x100) + (t >= 0x10000); /* 0..3 */
        unsigned width = steps + (steps == 3);                    /* 0, 1, 2, 4 bytes */
        p[0] = (uint8_t)(steps ? 0x17 + steps : t);
        store_be32(p + 1, (uint32_t)(((uint64_t)t << (32 - 8 * width)) & 0xFFFFFFFFULL));
        p += 1 + width;
    }
    return p;
}

/* Tokens as u32 little-endian words. */
static uint8_t *le_tokens(uint8_t *p, const uint32_t *tok, Py_ssize_t bs) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, tok, (size_t)bs * 4);
    return p + bs * 4;
#else
    for (Py_ssize_t i = 0; i < bs; i++) {
        uint32_t t = tok[i];
        *p++ = (uint8_t)t;
        *p++ = (uint8_t)(t >> 8);
        *p++ = (uint8_t)(t >> 16);
        *p++ = (uint8_t)(t >> 24);
    }
    return p;
#endif
}

static uint64_t fnv1a64(const uint8_t *p, size_t n) {
    uint64_t h = 0xCBF29CE484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ULL;
    return h;
}

/* ---- results ----------------------------------------------------------------------------- */

/* A BlockKey (a tuple subclass of two items) made as tuple.__new__(BlockKey, (digest, event))
 * does; steals neither reference. */
static PyObject *block_key(PyTypeObject *type, PyObject *digest, PyObject *event) {
    PyObject *key = type->tp_alloc(type, 2);
    if (key == NULL) return NULL;
    Py_INCREF(digest);
    Py_INCREF(event);
    PyTuple_SET_ITEM(key, 0, digest);
    PyTuple_SET_ITEM(key, 1, event);
    return key;
}

/* Appends BlockKey(digest bytes, event) to `out` (a list pre-sized to n); 0 on success. */
static int set_key(PyObject *out, Py_ssize_t i, PyTypeObject *type, const uint8_t *digest,
                   Py_ssize_t dlen, PyObject *event) {
    if (event == NULL) return -1;
    PyObject *raw = PyBytes_FromStringAndSize((const char *)digest, dlen);
    if (raw == NULL) {
        Py_DECREF(event);
        return -1;
    }
    PyObject *key = block_key(type, raw, event);
    Py_DECREF(raw);
    Py_DECREF(event);
    if (key == NULL) return -1;
    PyList_SET_ITEM(out, i, key);
    return 0;
}

/* ---- arguments --------------------------------------------------------------------------- */

typedef struct {
    Py_buffer view;
    const uint32_t *tokens;
    Py_ssize_t n_blocks;
    Py_ssize_t bs;
} Tokens;

static int tokens_open(Tokens *t, PyObject *obj, Py_ssize_t bs) {
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "block size must be positive");
        return -1;
    }
    if (PyObject_GetBuffer(obj, &t->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (t->view.itemsize != 4 || t->view.format == NULL ||
        (strcmp(t->view.format, "I") != 0 && strcmp(t->view.format, "=I") != 0 &&
         strcmp(t->view.format, "<I") != 0)) {
        PyBuffer_Release(&t->view);
        PyErr_SetString(PyExc_TypeError, "tokens must be a buffer of uint32 ('I')");
        return -1;
    }
    t->tokens = (const uint32_t *)t->view.buf;
    t->bs = bs;
    t->n_blocks = t->view.len / 4 / bs;
    return 0;
}

/* Per-block bytes from an optional {block: bytes} dict: its value, or `fallback`. */
static int block_bytes(PyObject *own, Py_ssize_t b, const char *fb, Py_ssize_t fb_len,
                       const char **out, Py_ssize_t *out_len) {
    *out = fb;
    *out_len = fb_len;
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

/* The longest bytes value of an optional dict (sizes the scratch buffer). */
static Py_ssize_t longest(PyObject *own) {
    Py_ssize_t pos = 0, most = 0;
    PyObject *k, *v;
    if (own == NULL || own == Py_None) return 0;
    while (PyDict_Next(own, &pos, &k, &v))
        if (PyBytes_Check(v) && PyBytes_GET_SIZE(v) > most) most = PyBytes_GET_SIZE(v);
    return most;
}

static int check_type(PyTypeObject *type) {
    if (!PyType_IsSubtype(type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "key type must be a tuple subclass");
        return -1;
    }
    return 0;
}

/* ---- vLLM *_cbor ------------------------------------------------------------------------- */

PyDoc_STRVAR(vllm_cbor_doc,
             "vllm_cbor(key_type, tokens, block_size, parent, first_tail, common_tail, own, "
             "sha256)\n\nvLLM sha256_cbor / xxhash_cbor: block b hashes the canonical CBOR of "
             "[parent, tokens_b, extra_b]; first_tail is block 0's extra CBOR, own[b] a block's "
             "own, common_tail every other's. Event key: the digest's last 8 bytes.");

static PyObject *vllm_cbor(PyObject *self, PyObject *args) {
    PyTypeObject *type;
    PyObject *tok_obj, *own;
    Py_ssize_t bs;
    const char *parent, *first, *common;
    Py_ssize_t parent_len, first_len, common_len;
    int use_sha;
    if (!PyArg_ParseTuple(args, "O!Ony#y#y#Op", &PyType_Type, &type, &tok_obj, &bs, &parent,
                          &parent_len, &first, &first_len, &common, &common_len, &own, &use_sha))
        return NULL;
    if (check_type(type) < 0) return NULL;
    if (!use_sha && xxh3_128 == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "xxhash's C entry points are not available");
        return NULL;
    }
    if (own != Py_None && !PyDict_Check(own)) {
        PyErr_SetString(PyExc_TypeError, "own must be a dict or None");
        return NULL;
    }
    Tokens t;
    if (tokens_open(&t, tok_obj, bs) < 0) return NULL;
    Py_ssize_t dlen = use_sha ? 32 : 16;
    Py_ssize_t tail = first_len > common_len ? first_len : common_len;
    Py_ssize_t own_max = longest(own);
    tail = own_max > tail ? own_max : tail;
    size_t cap = 1 + 9 + (size_t)(parent_len > dlen ? parent_len : dlen) + 9 + (size_t)bs * 5 +
                 (size_t)tail + 4;
    uint8_t *buf = PyMem_Malloc(cap);
    PyObject *out = PyList_New(t.n_blocks);
    if (buf == NULL || out == NULL) {
        PyMem_Free(buf);
        Py_XDECREF(out);
        PyBuffer_Release(&t.view);
        return PyErr_NoMemory();
    }
    uint8_t digest[32];
    const uint8_t *prev = (const uint8_t *)parent;
    Py_ssize_t prev_len = parent_len;
    for (Py_ssize_t b = 0; b < t.n_blocks; b++) {
        const char *extra;
        Py_ssize_t extra_len;
        if (b == 0) {
            extra = first;
            extra_len = first_len;
        } else if (block_bytes(own, b, common, common_len, &extra, &extra_len) < 0) {
            goto fail;
        }
        uint8_t *p = buf;
        *p++ = 0x83;
        p = cbor_head(p, 2, (uint64_t)prev_len);
        memmove(p, prev, (size_t)prev_len);
        p += prev_len;
        p = cbor_tokens(p, t.tokens + b * bs, bs);
        memcpy(p, extra, (size_t)extra_len);
        p += extra_len;
        if (use_sha) {
            sha256(buf, (size_t)(p - buf), digest);
        } else {
            xxh128_t h = xxh3_128(buf, (size_t)(p - buf));
            put_be64(put_be64(digest, h.high64), h.low64);
        }
        if (set_key(out, b, type, digest, dlen,
                    PyLong_FromUnsignedLongLong(get_be64(digest + dlen - 8))) < 0)
            goto fail;
        prev = digest;
        prev_len = dlen;
    }
    PyMem_Free(buf);
    PyBuffer_Release(&t.view);
    return out;
fail:
    PyMem_Free(buf);
    PyBuffer_Release(&t.view);
    Py_DECREF(out);
    return NULL;
}

/* ---- SGLang ------------------------------------------------------------------------------ */

PyDoc_STRVAR(sglang_doc,
             "sglang(key_type, tokens, block_size, prior)\n\nSGLang page hashes: "
             "SHA-256(prior || u32-LE tokens), prior the previous digest (block 0: the given "
             "prior, possibly empty). Event key: the first 8 bytes, signed.");

static PyObject *sglang(PyObject *self, PyObject *args) {
    PyTypeObject *type;
    PyObject *tok_obj;
    Py_ssize_t bs, prior_len;
    const char *prior;
    if (!PyArg_ParseTuple(args, "O!Ony#", &PyType_Type, &type, &tok_obj, &bs, &prior,
                          &prior_len))
        return NULL;
    if (check_type(type) < 0) return NULL;
    Tokens t;
    if (tokens_open(&t, tok_obj, bs) < 0) return NULL;
    size_t cap = (size_t)(prior_len > 32 ? prior_len : 32) + (size_t)bs * 4;
    uint8_t *buf = PyMem_Malloc(cap);
    PyObject *out = PyList_New(t.n_blocks);
    if (buf == NULL || out == NULL) {
        PyMem_Free(buf);
        Py_XDECREF(out);
        PyBuffer_Release(&t.view);
        return PyErr_NoMemory();
    }
    uint8_t digest[32];
    memcpy(buf, prior, (size_t)prior_len);
    Py_ssize_t head = prior_len;
    for (Py_ssize_t b = 0; b < t.n_blocks; b++) {
        uint8_t *p = le_tokens(buf + head, t.tokens + b * bs, bs);
        sha256(buf, (size_t)(p - buf), digest);
        if (set_key(out, b, type, digest, 32,
                    PyLong_FromLongLong((long long)get_be64(digest))) < 0) {
            PyMem_Free(buf);
            PyBuffer_Release(&t.view);
            Py_DECREF(out);
            return NULL;
        }
        memcpy(buf, digest, 32);
        head = 32;
    }
    PyMem_Free(buf);
    PyBuffer_Release(&t.view);
    return out;
}

/* ---- u64 chains: Dynamo, llm-d ------------------------------------------------------------ */

enum chain_kind { DYNAMO, LLMD_CBOR, LLMD_XXH64 };

/* One u64 chain; `extras` maps a block to bytes appended to its payload. `start` is the first
 * parent (for Dynamo: has_start says whether there is one; without, the chain starts at the
 * first local hash). */
static PyObject *u64_chain(PyObject *args, enum chain_kind kind) {
    PyTypeObject *type;
    PyObject *tok_obj, *extras;
    Py_ssize_t bs;
    unsigned long long start, seed = 0;
    int has_start = 1;
    if (kind == DYNAMO) {
        if (!PyArg_ParseTuple(args, "O!OnKpKO", &PyType_Type, &type, &tok_obj, &bs, &seed,
                              &has_start, &start, &extras))
            return NULL;
    } else if (!PyArg_ParseTuple(args, "O!OnKO", &PyType_Type, &type, &tok_obj, &bs, &start,
                                 &extras)) {
        return NULL;
    }
    if (check_type(type) < 0) return NULL;
    if (kind != LLMD_CBOR && (xxh3_64_seeded == NULL || xxh64 == NULL)) {
        PyErr_SetString(PyExc_RuntimeError, "xxhash's C entry points are not available");
        return NULL;
    }
    if (extras != Py_None && !PyDict_Check(extras)) {
        PyErr_SetString(PyExc_TypeError, "extras must be a dict or None");
        return NULL;
    }
    Tokens t;
    if (tokens_open(&t, tok_obj, bs) < 0) return NULL;
    size_t cap = 1 + 9 + 9 + (size_t)bs * 5 + 1 + (size_t)longest(extras) + 4;
    uint8_t *buf = PyMem_Malloc(cap);
    PyObject *out = PyList_New(t.n_blocks);
    if (buf == NULL || out == NULL) {
        PyMem_Free(buf);
        Py_XDECREF(out);
        PyBuffer_Release(&t.view);
        return PyErr_NoMemory();
    }
    uint64_t key = start;
    static const char null_extra[] = "\xf6";
    for (Py_ssize_t b = 0; b < t.n_blocks; b++) {
        const uint32_t *tok = t.tokens + b * bs;
        const char *extra;
        Py_ssize_t extra_len;
        int none = kind == LLMD_CBOR;
        if (block_bytes(extras, b, null_extra, none ? 1 : 0, &extra, &extra_len) < 0) goto fail;
        uint8_t *p = buf;
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
        size_t len = (size_t)(p - buf);
        if (kind == LLMD_CBOR) {
            key = fnv1a64(buf, len);
        } else if (kind == LLMD_XXH64) {
            key = xxh64(buf, len, 0);
        } else {
            uint64_t local = xxh3_64_seeded(buf, len, seed);
            if (has_start) {
                uint8_t pair[16];
                put_le64(put_le64(pair, key), local);
                key = xxh3_64_seeded(pair, 16, 1337);
            } else {
                key = local;
                has_start = 1;
            }
        }
        uint8_t digest[8];
        put_be64(digest, key);
        if (set_key(out, b, type, digest, 8, PyLong_FromUnsignedLongLong(key)) < 0) goto fail;
    }
    PyMem_Free(buf);
    PyBuffer_Release(&t.view);
    return out;
fail:
    PyMem_Free(buf);
    PyBuffer_Release(&t.view);
    Py_DECREF(out);
    return NULL;
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
    } else if (stem == 8 && strncmp(name, "xxh3_128", 8) == 0 && xxh3_128 != NULL) {
        xxh128_t h = xxh3_128(buf, len);
        put_be64(put_be64(out, h.high64), h.low64);
        n = 16;
    } else if (stem == 7 && strncmp(name, "xxh3_64", 7) == 0 && xxh3_64_seeded != NULL) {
        put_be64(out, xxh3_64_seeded(buf, len, seed));
    } else if (stem == 5 && strncmp(name, "xxh64", 5) == 0 && xxh64 != NULL) {
        put_be64(out, xxh64(buf, len, seed));
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

PyDoc_STRVAR(u32_doc,
             "u32(tokens)\n\nA list or tuple of ints in [0, 2**32) as native uint32 bytes (for "
             "array('I').frombytes), or None when an item is anything else: the caller's own "
             "conversion then names the bad token.");

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

static PyObject *u32(PyObject *self, PyObject *seq) {
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 4);
    if (out == NULL) return NULL;
    uint32_t *dst = (uint32_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = token_value(items[i]);
        if (v < 0) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        dst[i] = (uint32_t)v;
    }
    return out;
}

/* ---- module ------------------------------------------------------------------------------ */

/* libxxhash's entry points from the xxhash package's own extension, if it exports them and
 * they agree with the package's Python functions on a probe. */
static void find_xxhash(void) {
#ifdef TOKENKEYS_DLSYM
    PyObject *mod = PyImport_ImportModule("xxhash._xxhash");
    if (mod == NULL) {
        PyErr_Clear();
        return;
    }
    PyObject *file = PyObject_GetAttrString(mod, "__file__");
    PyObject *version = PyObject_GetAttrString(mod, "XXHASH_VERSION");
    const char *path = file && PyUnicode_Check(file) ? PyUnicode_AsUTF8(file) : NULL;
    const char *ver = version && PyUnicode_Check(version) ? PyUnicode_AsUTF8(version) : NULL;
    /* The 0.8 API (XXH128_hash_t by value) is the one declared above. */
    if (path != NULL && ver != NULL && strncmp(ver, "0.8.", 4) == 0) {
        void *lib = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
        if (lib != NULL) {
            xxh3_128 = (xxh3_128_fn)dlsym(lib, "XXH3_128bits");
            xxh3_64_seeded = (xxh_seeded_fn)dlsym(lib, "XXH3_64bits_withSeed");
            xxh64 = (xxh_seeded_fn)dlsym(lib, "XXH64");
        }
    }
    PyErr_Clear();
    Py_XDECREF(file);
    Py_XDECREF(version);
    /* Probe: each entry point against the package's Python function on the same bytes. */
    static const char probe[] = "tokenkeys probe: 0123456789abcdef0123456789abcdef";
    int ok = xxh3_128 && xxh3_64_seeded && xxh64;
    if (ok) {
        PyObject *r1 = PyObject_CallMethod(mod, "xxh3_128_digest", "y", probe);
        PyObject *r2 = PyObject_CallMethod(mod, "xxh3_64_intdigest", "yK", probe, 1337ULL);
        PyObject *r3 = PyObject_CallMethod(mod, "xxh64_intdigest", "yK", probe, 7ULL);
        uint8_t want[16];
        xxh128_t h = xxh3_128(probe, strlen(probe));
        put_be64(put_be64(want, h.high64), h.low64);
        ok = r1 && r2 && r3 && PyBytes_Check(r1) && PyBytes_GET_SIZE(r1) == 16 &&
             memcmp(PyBytes_AS_STRING(r1), want, 16) == 0 &&
             PyLong_AsUnsignedLongLong(r2) == xxh3_64_seeded(probe, strlen(probe), 1337) &&
             PyLong_AsUnsignedLongLong(r3) == xxh64(probe, strlen(probe), 7);
        Py_XDECREF(r1);
        Py_XDECREF(r2);
        Py_XDECREF(r3);
        PyErr_Clear();
    }
    if (!ok) {
        xxh3_128 = NULL;
        xxh3_64_seeded = NULL;
        xxh64 = NULL;
    }
    Py_DECREF(mod);
#endif
}

static PyMethodDef methods[] = {
    {"vllm_cbor", vllm_cbor, METH_VARARGS, vllm_cbor_doc},
    {"sglang", sglang, METH_VARARGS, sglang_doc},
    {"dynamo", dynamo, METH_VARARGS, dynamo_doc},
    {"llmd_cbor", llmd_cbor, METH_VARARGS, llmd_cbor_doc},
    {"llmd_xxh64", llmd_xxh64, METH_VARARGS, llmd_xxh64_doc},
    {"digest", digest, METH_VARARGS, digest_doc},
    {"u32", u32, METH_O, u32_doc},
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
    find_xxhash();
    if (PyModule_AddStringConstant(m, "SHA256", sha) < 0 ||
        PyModule_AddObject(m, "XXHASH", PyBool_FromLong(xxh3_128 != NULL)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
