/*
 * pickle.h — the pickles of PyTorch checkpoints (src/io/pickle.c): a
 * restricted unpickler that builds a tree of values and runs nothing, and
 * a pickler of protocol 2 for the values a checkpoint holds.
 */
#ifndef DP_IO_PICKLE_H
#define DP_IO_PICKLE_H

#include "dplua.h"
#include <stddef.h>
#include <stdint.h>

/* Kinds beyond the public dp_pykind: only while unpickling. */
enum { PY_GLOBAL = DP_PY_NUM_KINDS, PY_STORAGE };

/* The element types of torch's storage classes (torch.FloatStorage...). */
typedef struct {
    const char *name;    /* "FloatStorage" */
    int elsize;          /* bytes of one element in the file */
    int dtype;           /* what dplua loads it as; -1: not loaded */
} py_storage_type;
extern const py_storage_type py_storage_types[];

typedef struct {
    int storage;         /* the PY_STORAGE value */
    int64_t offset;      /* in elements */
    int ndim;
    int64_t size[DP_MAX_DIMS], stride[DP_MAX_DIMS];
} py_view;

typedef struct {
    int kind;
    int sub;             /* PY_GLOBAL: which; PY_STORAGE: its py_storage_types index */
    int64_t i;           /* bool, int; PY_STORAGE: numel */
    double f;
    char *s;             /* str, bytes, a dtype's or device's name; PY_STORAGE: its key */
    size_t len;
    int n, cap;          /* list and tuple items; dicts: key, value, key, value... */
    int *items;
    py_view *view;       /* DP_PY_TENSOR */
} py_value;

typedef struct {
    int n, cap;
    py_value *v;
    int root;
} py_tree;

/* Unpickles data (len bytes) into tree; what names it in messages. */
dp_status py_unpickle(py_tree *tree, const char *data, size_t len, const char *what);
void py_tree_free(py_tree *tree);

/* The pickler: a buffer of protocol 2 opcodes. Containers open with
 * py_begin and close with py_end; a dict's items alternate key, value. */
typedef struct {
    char *p;
    size_t len, cap;
    int oom;
    int depth;
    int kinds[64];       /* the open containers */
    int ntensors, tcap;
    dp_tensor **tensors; /* every distinct tensor, in order: its index is its storage key */
} py_pickler;

void py_pickler_init(py_pickler *p);
void py_pickler_free(py_pickler *p);
dp_status py_put_none(py_pickler *p);
dp_status py_put_bool(py_pickler *p, int v);
dp_status py_put_int(py_pickler *p, int64_t v);
dp_status py_put_float(py_pickler *p, double v);
dp_status py_put_str(py_pickler *p, const char *s, size_t len);
dp_status py_put_dtype(py_pickler *p, int dtype);
dp_status py_put_device(py_pickler *p, const char *type, int index);
dp_status py_put_tensor(py_pickler *p, dp_tensor *t);
dp_status py_begin(py_pickler *p, int kind);
dp_status py_end(py_pickler *p);
dp_status py_finish(py_pickler *p);   /* STOP; the pickle is then p->p, p->len */

#endif /* DP_IO_PICKLE_H */
