/* The key table's bulk methods: one call per prompt or event batch, keys probed in prefetched
 * batches (keys.h). */
#ifndef TOKENKEYS_BULK_H
#define TOKENKEYS_BULK_H

#include "slots.h"

PyObject *table_runs(KeyTable *t, PyObject *keys);
PyObject *table_touch(KeyTable *t, PyObject *keys);
PyObject *table_touch_found(KeyTable *t, PyObject *arg);
PyObject *table_add_keys(KeyTable *t, PyObject *args);

/* Remove and return the least recently used (key, holders). */
PyObject *table_pop_oldest(KeyTable *t, PyObject *unused);

#endif
