/* tokenkeys.router.policy._rank: the precise policy's ranking (score, cost, order) in one call.
 *
 * rank() computes what scorer.score_workers, cost.cost_workers and cost.choose (temperature 0)
 * compute in Python, with the same floating-point operations in the same order (setup.py
 * compiles this file without contraction into fused multiply-adds), so every score and cost is
 * bit-identical to the Python path's: router/policy/ranking.py holds both paths and the tests
 * compare them on random inputs. Any input outside the domain these loops reproduce exactly
 * (a non-float load view, a bool, a weight outside [0, 1], a non-finite number, a run longer
 * than the prompt) makes rank() answer None, and the caller runs the Python path, which
 * computes the same thing or raises the error it always raised.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "xxh.h"

/* Decimals at which costs are compared (cost.py's _DIGITS). */
#define COST_DIGITS 9

typedef struct {
    PyObject *worker; /* borrowed: an exact str */
    double load, score, prefill, cost, rcost;
    long long blocks;
    uint64_t rendezvous;
} Row;

static PyObject *s_worker, *s_score, *s_matched_blocks, *s_load, *s_cost;

/* round(x, digits) as Python computes it: correctly rounded to a decimal string and read back
 * (float.__round__ does exactly this with the same dtoa); -1 with an exception on failure. */
static int round_to(double x, int digits, double *out) {
    char *text = PyOS_double_to_string(x, 'f', digits, 0, NULL);
    if (text == NULL) return -1;
    *out = PyOS_string_to_double(text, NULL, NULL);
    PyMem_Free(text);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* An exact int or float (never a bool) as a double, finite; 0 when it is not one. */
static int number(PyObject *obj, double *out) {
    if (PyFloat_CheckExact(obj)) {
        *out = PyFloat_AS_DOUBLE(obj);
    } else if (PyLong_CheckExact(obj)) {
        *out = PyLong_AsDouble(obj);
        if (*out == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    } else {
        return 0;
    }
    return isfinite(*out);
}

/* An exact float, finite. */
static int exact_float(PyObject *obj, double *out) {
    if (!PyFloat_CheckExact(obj)) return 0;
    *out = PyFloat_AS_DOUBLE(obj);
    return isfinite(*out);
}

/* An exact int that fits a long long. */
static int exact_int(PyObject *obj, long long *out) {
    if (!PyLong_CheckExact(obj)) return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return !overflow;
}

/* Every tier weight as score_workers checks it: a number in [0, 1]. */
static int weights_ok(PyObject *tiers) {
    if (!PyDict_CheckExact(tiers)) return 0;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    double w;
    while (PyDict_Next(tiers, &pos, &key, &value)) {
        if (!number(value, &w) || !(w >= 0.0 && w <= 1.0)) return 0;
    }
    return 1;
}

/* The tier-weighted length of a run: sum of count * (best weight of its tiers), in segment
 * order, as score_workers adds them, at most ``limit`` blocks; 1 on success, 0 outside the
 * domain, -1 on error. */
static int weigh(PyObject *segments, PyObject *tiers, long long limit, long long *blocks,
                 double *weighted) {
    if (!PyTuple_CheckExact(segments)) return 0;
    long long total = 0;
    double sum = 0.0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(segments); i++) {
        PyObject *segment = PyTuple_GET_ITEM(segments, i);
        if (!PyTuple_CheckExact(segment) || PyTuple_GET_SIZE(segment) != 2) return 0;
        long long count;
        PyObject *names = PyTuple_GET_ITEM(segment, 1);
        /* (a count past the prompt makes score_workers refuse the run: left to it) */
        if (!exact_int(PyTuple_GET_ITEM(segment, 0), &count) || count < 0 || count > limit ||
            !PyTuple_CheckExact(names) || PyTuple_GET_SIZE(names) == 0)
            return 0;
        double best = 0.0;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(names); j++) {
            PyObject *name = PyTuple_GET_ITEM(names, j);
            if (!PyUnicode_CheckExact(name)) return 0;
            PyObject *found = PyDict_GetItemWithError(tiers, name);
            if (found == NULL && PyErr_Occurred()) return -1;
            double w = 1.0; /* scorer.UNKNOWN_TIER_WEIGHT */
            if (found != NULL && !number(found, &w)) return 0;
            if (j == 0 || w > best) best = w; /* max() keeps the first of equals */
        }
        total += count;
        if (total > limit) return 0;
        sum += (double)count * best;
    }
    *blocks = total;
    *weighted = sum;
    return 1;
}

/* cost.choose's order: cost rounded, then the highest rendezvous hash, then the worker id. */
static int by_cost(const void *pa, const void *pb) {
    const Row *a = pa, *b = pb;
    if (a->rcost != b->rcost) return a->rcost < b->rcost ? -1 : 1;
    if (a->rendezvous != b->rendezvous) return a->rendezvous > b->rendezvous ? -1 : 1;
    return PyUnicode_Compare(a->worker, b->worker);
}

/* xxh64(affinity as 8 bytes little-endian + the worker's UTF-8), as cost._rendezvous. */
static int rendezvous(uint64_t affinity, PyObject *worker, uint64_t *out) {
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(worker, &n);
    if (utf8 == NULL) {
        PyErr_Clear();
        return 0;
    }
    unsigned char stack[8 + 256];
    unsigned char *buf = (size_t)n <= 256 ? stack : PyMem_Malloc(8 + (size_t)n);
    if (buf == NULL) return -1;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(affinity >> (8 * i));
    memcpy(buf + 8, utf8, (size_t)n);
    *out = tk_xxh64(buf, 8 + (size_t)n, 0);
    if (buf != stack) PyMem_Free(buf);
    return 1;
}

/* A WorkerScore filled as its frozen dataclass __init__ fills it (every field in the instance
 * dict), without the five object.__setattr__ calls. */
static PyObject *worker_score(PyTypeObject *type, const Row *r) {
    PyObject *obj = type->tp_alloc(type, 0);
    if (obj == NULL) return NULL;
    PyObject *dict = PyObject_GenericGetDict(obj, NULL);
    PyObject *score = PyFloat_FromDouble(r->score), *load = PyFloat_FromDouble(r->load);
    PyObject *blocks = PyLong_FromLongLong(r->blocks), *cost = PyFloat_FromDouble(r->cost);
    int bad = dict == NULL || !score || !load || !blocks || !cost ||
              PyDict_SetItem(dict, s_worker, r->worker) || PyDict_SetItem(dict, s_score, score) ||
              PyDict_SetItem(dict, s_matched_blocks, blocks) || PyDict_SetItem(dict, s_load, load) ||
              PyDict_SetItem(dict, s_cost, cost);
    Py_XDECREF(dict);
    Py_XDECREF(score);
    Py_XDECREF(load);
    Py_XDECREF(blocks);
    Py_XDECREF(cost);
    if (bad) Py_CLEAR(obj);
    return obj;
}

/* The cost weights (prefix, load, overflow, growth) from a 4-tuple of numbers. */
static int cost_weights(PyObject *weights, double w[4]) {
    if (!PyTuple_CheckExact(weights) || PyTuple_GET_SIZE(weights) != 4) return 0;
    for (int i = 0; i < 4; i++)
        if (!number(PyTuple_GET_ITEM(weights, i), &w[i])) return 0;
    return 1;
}

/* One candidate's score and cost (scorer.score_workers, cost.cost_workers); 1, 0 or -1. */
static int row_of(PyObject *item, long long total, PyObject *tiers, const double w[4], Row *r) {
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 8) return 0;
    PyObject **f = &PyTuple_GET_ITEM(item, 0);
    /* (worker, load, segments or None, active_blocks, inflight_prefix, growth, queued, capacity) */
    double active, growth, queued;
    long long inflight, capacity;
    if (!PyUnicode_CheckExact(f[0]) || !number(f[1], &r->load) || r->load < 0.0 ||
        !exact_float(f[3], &active) || !exact_int(f[4], &inflight) || !exact_float(f[5], &growth) ||
        !number(f[6], &queued) || !exact_int(f[7], &capacity))
        return 0;
    r->worker = f[0];
    double weighted = 0.0;
    r->blocks = 0;
    if (f[2] != Py_None) {
        int ok = weigh(f[2], tiers, total, &r->blocks, &weighted);
        if (ok <= 0) return ok;
    }
    r->score = total ? weighted / (double)total : 0.0;
    long long held = total < inflight ? total : inflight; /* min(inflight, total) */
    double matched = r->score * (double)total, in_use = (double)held;
    double cached = in_use > matched ? in_use : matched;
    double left = (double)total - cached;
    r->prefill = 0.0 > left ? 0.0 : left;
    active = active + (double)(total - held);
    double overflow = 0.0;
    if (capacity > 0) {
        double over = active - (double)capacity;
        overflow = 0.0 > over ? 0.0 : over;
    }
    r->cost = w[0] * r->prefill + w[1] * (active + queued) + w[2] * overflow + w[3] * growth;
    if (!isfinite(r->cost)) return 0;
    return round_to(r->cost, COST_DIGITS, &r->rcost) ? -1 : 1;
}

/* rank(candidates, total, tiers, weights, affinity, slack, WorkerScore) -> (ranking, prefill)
 * or None; see ranking.py. */
static PyObject *rank(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "rank() takes 7 arguments");
        return NULL;
    }
    PyObject *candidates = args[0], *tiers = args[2], *type = args[6];
    long long total;
    double w[4], slack;
    uint64_t affinity = 0;
    int hashed = args[4] != Py_None;
    if (!PyList_CheckExact(candidates) || PyList_GET_SIZE(candidates) == 0 ||
        !exact_int(args[1], &total) || total < 0 || !weights_ok(tiers) ||
        !cost_weights(args[3], w) || !number(args[5], &slack) || !PyType_Check(type) ||
        ((PyTypeObject *)type)->tp_dictoffset == 0) /* worker_score fills an instance dict */
        Py_RETURN_NONE;
    if (hashed) {
        if (tk_xxh64 == NULL || !PyLong_CheckExact(args[4])) Py_RETURN_NONE;
        affinity = PyLong_AsUnsignedLongLong(args[4]);
        if (affinity == (uint64_t)-1 && PyErr_Occurred()) {
            PyErr_Clear(); /* negative or past 64 bits: to_bytes(8) refuses it in Python */
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t n = PyList_GET_SIZE(candidates);
    Row *rows = PyMem_Malloc((size_t)n * sizeof(Row));
    if (rows == NULL) return PyErr_NoMemory();
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int ok = row_of(PyList_GET_ITEM(candidates, i), total, tiers, w, &rows[i]);
        if (ok == 1 && hashed) ok = rendezvous(affinity, rows[i].worker, &rows[i].rendezvous);
        else rows[i].rendezvous = 0;
        if (ok < 0) goto done;
        if (ok == 0) {
            out = Py_NewRef(Py_None);
            goto done;
        }
    }
    qsort(rows, (size_t)n, sizeof(Row), by_cost);
    Py_ssize_t chosen = 0;
    if (n >= 2 && slack > 0 && hashed) {
        /* Within the slack: the fewest blocks to prefill, then the highest hash, then the
         * highest worker id (max() over (-round(prefill), rendezvous, worker)). */
        double bound, best_prefill = 0.0, prefill;
        int have = 0;
        if (round_to(rows[0].cost + slack, COST_DIGITS, &bound)) goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!(rows[i].rcost <= bound)) continue;
            if (round_to(rows[i].prefill, COST_DIGITS, &prefill)) goto done;
            const Row *a = &rows[i], *b = &rows[chosen];
            int better = !have || prefill < best_prefill ||
                         (prefill == best_prefill &&
                          (a->rendezvous > b->rendezvous ||
                           (a->rendezvous == b->rendezvous &&
                            PyUnicode_Compare(a->worker, b->worker) > 0)));
            if (better) {
                chosen = i;
                best_prefill = prefill;
                have = 1;
            }
        }
    }
    PyObject *ranking = PyList_New(n);
    if (ranking == NULL) goto done;
    for (Py_ssize_t i = 0, at = 1; i < n; i++) {
        PyObject *item = worker_score((PyTypeObject *)type, &rows[i]);
        if (item == NULL) {
            Py_DECREF(ranking);
            goto done;
        }
        PyList_SET_ITEM(ranking, i == chosen ? 0 : (i < chosen ? at++ : i), item);
    }
    out = Py_BuildValue("(Nd)", ranking, rows[chosen].prefill);
done:
    PyMem_Free(rows);
    return out;
}

static PyMethodDef methods[] = {
    {"rank", (PyCFunction)(void (*)(void))rank, METH_FASTCALL,
     "The precise policy's ranking and the chosen worker's prefill, or None (ranking.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tokenkeys.router.policy._rank",
    "The precise policy's ranking in C (router/policy/ranking.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__rank(void) {
    tk_find_xxhash();
    s_worker = PyUnicode_InternFromString("worker");
    s_score = PyUnicode_InternFromString("score");
    s_matched_blocks = PyUnicode_InternFromString("matched_blocks");
    s_load = PyUnicode_InternFromString("load");
    s_cost = PyUnicode_InternFromString("cost");
    if (!s_worker || !s_score || !s_matched_blocks || !s_load || !s_cost) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "XXHASH", tk_xxh64 != NULL)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
