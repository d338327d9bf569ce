/* libxxhash's entry points from the xxhash package's own extension (xxh.h).
 *
 * Its extension module exports libxxhash's public C API; the entry points are looked up there
 * at import and checked against the package's own Python functions. Where that fails (another
 * build, no dlsym) they stay NULL, XXHASH is False, and the Python paths run those profiles. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "encode.h"
#include "xxh.h"

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#define TOKENKEYS_DLSYM 1
#endif

xxh3_128_fn tk_xxh3_128;
xxh_seeded_fn tk_xxh3_64_seeded;
xxh_seeded_fn tk_xxh64;

#ifdef TOKENKEYS_DLSYM
/* The three symbols from the loaded module's shared object, if it is libxxhash 0.8's API. */
static void lookup(PyObject *mod) {
    PyObject *file = PyObject_GetAttrString(mod, "__file__");
    PyObject *version = PyObject_GetAttrString(mod, "XXHASH_VERSION");
    const char *path = file && PyUnicode_Check(file) ? PyUnicode_AsUTF8(file) : NULL;
    const char *ver = version && PyUnicode_Check(version) ? PyUnicode_AsUTF8(version) : NULL;
    /* The 0.8 API (XXH128_hash_t by value) is the one declared in xxh.h. */
    if (path != NULL && ver != NULL && strncmp(ver, "0.8.", 4) == 0) {
        void *lib = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
        if (lib != NULL) {
            tk_xxh3_128 = (xxh3_128_fn)dlsym(lib, "XXH3_128bits");
            tk_xxh3_64_seeded = (xxh_seeded_fn)dlsym(lib, "XXH3_64bits_withSeed");
            tk_xxh64 = (xxh_seeded_fn)dlsym(lib, "XXH64");
        }
    }
    PyErr_Clear();
    Py_XDECREF(file);
    Py_XDECREF(version);
}

/* Each entry point against the package's Python function on the same bytes. */
static int agrees(PyObject *mod) {
    static const char probe[] = "tokenkeys probe: 0123456789abcdef0123456789abcdef";
    size_t n = strlen(probe);
    PyObject *r1 = PyObject_CallMethod(mod, "xxh3_128_digest", "y", probe);
    PyObject *r2 = PyObject_CallMethod(mod, "xxh3_64_intdigest", "yK", probe, 1337ULL);
    PyObject *r3 = PyObject_CallMethod(mod, "xxh64_intdigest", "yK", probe, 7ULL);
    uint8_t want[16];
    xxh128_t h = tk_xxh3_128(probe, n);
    put_be64(put_be64(want, h.high64), h.low64);
    int ok = r1 && r2 && r3 && PyBytes_Check(r1) && PyBytes_GET_SIZE(r1) == 16 &&
             memcmp(PyBytes_AS_STRING(r1), want, 16) == 0 &&
             PyLong_AsUnsignedLongLong(r2) == tk_xxh3_64_seeded(probe, n, 1337) &&
             PyLong_AsUnsignedLongLong(r3) == tk_xxh64(probe, n, 7);
    Py_XDECREF(r1);
    Py_XDECREF(r2);
    Py_XDECREF(r3);
    PyErr_Clear();
    return ok;
}
#endif

void tk_find_xxhash(void) {
#ifdef TOKENKEYS_DLSYM
    PyObject *mod = PyImport_ImportModule("xxhash._xxhash");
    if (mod == NULL) {
        PyErr_Clear();
        return;
    }
    lookup(mod);
    if (!(tk_xxh3_128 && tk_xxh3_64_seeded && tk_xxh64 && agrees(mod))) {
        tk_xxh3_128 = NULL;
        tk_xxh3_64_seeded = NULL;
        tk_xxh64 = NULL;
    }
    Py_DECREF(mod);
#endif
}
