/* The compiled fast path of the pgoutput decoder (docs/design.md, "The compiled decoders").
 *
 * Owns one function, insert(): the common Insert message of an outbox relation, parsed
 * straight from the message's buffer into the values an OutboxEvent needs. It accepts a
 * message only when cdc_relay/decoding/pgoutput.py's pure path would accept it and give
 * the same values; for anything else (another message type, an unknown relation, a
 * truncated or odd tuple, NULL in a required column, invalid UTF-8) it returns None and
 * the pure path runs, producing the event or the DecodeError. It must never raise for a
 * message, and never word an error: declining is its only answer to bad input.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define FIELDS 6      /* id, aggregate_type, aggregate_id, event_type, payload, created_at */
#define REQUIRED 5    /* the first five may not be NULL */
#define PAYLOAD 4     /* passed on as bytes, not decoded */
#define MAX_FIELDS 64 /* more carried columns than this: the pure path */
#define HEAD 8        /* 'I', relation id (4), 'N', column count (2) */

typedef struct {
    const unsigned char *at; /* NULL: the column was NULL (or is not in the relation) */
    Py_ssize_t len;
} Span;

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* A plan item as a C index, or -2 (with an exception set) when it is not a small int. */
static long plan_index(PyObject *item, long limit) {
    long value = PyLong_AsLong(item);
    if (value == -1 && PyErr_Occurred()) return -2;
    if (value < -1 || value >= limit) {
        PyErr_Format(PyExc_ValueError, "plan index %ld outside -1..%ld", value, limit - 1);
        return -2;
    }
    return value;
}

/* Walk the tuple columns up to the last planned one, as the pure path's _insert does.
 * 1: accepted (spans filled), 0: declined, -1: the plan is malformed (exception set). */
static int walk(const unsigned char *buf, Py_ssize_t size, PyObject *slots, Span *spans,
                long nfields) {
    Py_ssize_t pos = HEAD;
    Py_ssize_t count = PyTuple_GET_SIZE(slots);
    for (Py_ssize_t column = 0; column < count; column++) {
        long field = plan_index(PyTuple_GET_ITEM(slots, column), nfields);
        if (field == -2) return -1;
        if (pos >= size) return 0;
        unsigned char kind = buf[pos];
        if (kind == 'n') {
            pos += 1; /* spans start NULL */
        } else if (kind == 't' || (kind == 'b' && field < 0)) {
            if (size - pos < 5) return 0;
            uint32_t length = be32(buf + pos + 1); /* compared unsigned: no 32-bit overflow */
            if ((uint64_t)(size - pos - 5) < length) return 0;
            Py_ssize_t len = (Py_ssize_t)length;
            if (field >= 0) {
                spans[field].at = buf + pos + 5;
                spans[field].len = len;
            }
            pos += 5 + len;
        } else if (kind == 'u' && field < 0) {
            pos += 1;
        } else {
            return 0; /* a mapped 'u' / 'b', or an unknown kind: the pure path words it */
        }
    }
    return 1;
}

/* Apply (field, field whose column it shares) pairs in order, as the pure path does. */
static int alias(PyObject *aliases, Span *spans, long nfields) {
    Py_ssize_t count = PyTuple_GET_SIZE(aliases);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = PyTuple_GET_ITEM(aliases, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "aliases must be (field, field) pairs");
            return -1;
        }
        long field = plan_index(PyTuple_GET_ITEM(pair, 0), nfields);
        long first = plan_index(PyTuple_GET_ITEM(pair, 1), nfields);
        if (field < 0 || first < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "alias field -1");
            return -1;
        }
        spans[field] = spans[first];
    }
    return 0;
}

/* str of a span, None for NULL; NULL with no exception set: not UTF-8 (decline). */
static PyObject *text(Span span) {
    if (span.at == NULL) Py_RETURN_NONE;
    PyObject *out = PyUnicode_DecodeUTF8((const char *)span.at, span.len, NULL);
    if (out == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear();
    return out;
}

/* The result tuple, or NULL: declined (no exception) or failed (exception set). */
static PyObject *values(const Span *spans, long nfields) {
    for (int field = 0; field < REQUIRED; field++)
        if (spans[field].at == NULL) return NULL;
    PyObject *out = PyTuple_New(nfields);
    if (out == NULL) return NULL;
    for (long field = 0; field < nfields; field++) {
        PyObject *value;
        if (field == PAYLOAD)
            value = PyBytes_FromStringAndSize((const char *)spans[field].at, spans[field].len);
        else
            value = text(spans[field]);
        if (value == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, field, value);
    }
    return out;
}

static PyObject *parse(const unsigned char *buf, Py_ssize_t size, PyObject *slots,
                       long ncols, long nfields, PyObject *aliases) {
    if (size < HEAD || buf[0] != 'I' || buf[5] != 'N') Py_RETURN_NONE;
    if ((long)(((unsigned)buf[6] << 8) | buf[7]) != ncols) Py_RETURN_NONE;
    if (nfields > MAX_FIELDS) Py_RETURN_NONE;
    Span spans[MAX_FIELDS] = {{NULL, 0}};
    int walked = walk(buf, size, slots, spans, nfields);
    if (walked <= 0) {
        if (walked < 0) return NULL;
        Py_RETURN_NONE;
    }
    if (alias(aliases, spans, nfields) < 0) return NULL;
    PyObject *out = values(spans, nfields);
    if (out == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return out;
}

/* The plan's parts, checked: the decoder builds plans, so a bad one is a bug (raise). */
static int unpack_plan(PyObject *plan, PyObject **slots, long *ncols, long *nfields,
                       PyObject **aliases) {
    if (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != 4) {
        PyErr_SetString(PyExc_TypeError, "a plan is (slots, ncols, nfields, aliases)");
        return -1;
    }
    *slots = PyTuple_GET_ITEM(plan, 0);
    *aliases = PyTuple_GET_ITEM(plan, 3);
    if (!PyTuple_Check(*slots) || !PyTuple_Check(*aliases)) {
        PyErr_SetString(PyExc_TypeError, "a plan's slots and aliases must be tuples");
        return -1;
    }
    *ncols = PyLong_AsLong(PyTuple_GET_ITEM(plan, 1));
    if (*ncols == -1 && PyErr_Occurred()) return -1;
    *nfields = PyLong_AsLong(PyTuple_GET_ITEM(plan, 2));
    if (*nfields == -1 && PyErr_Occurred()) return -1;
    if (*nfields < FIELDS) {
        PyErr_Format(PyExc_ValueError, "a plan's nfields must be at least %d", FIELDS);
        return -1;
    }
    return 0;
}

/* The relation id's plan (borrowed), NULL if none (or with an exception set). */
static PyObject *plan_of(PyObject *plans, const unsigned char *buf) {
    PyObject *key = PyLong_FromUnsignedLong(be32(buf + 1));
    if (key == NULL) return NULL;
    PyObject *plan = PyDict_GetItemWithError(plans, key);
    Py_DECREF(key);
    return plan;
}

PyDoc_STRVAR(insert_doc,
"insert(payload, plans, /)\n--\n\n"
"The values of an outbox Insert message (a bytes-like object), or None.\n\n"
"``plans`` maps relation id -> (slots, ncols, nfields, aliases): ``slots`` maps tuple\n"
"column -> field (-1: not used), ``ncols`` is the relation's column count, ``nfields``\n"
"the result's length, ``aliases`` (field, field whose column it shares) pairs. The\n"
"result: id, aggregate_type, aggregate_id, event_type (str), payload (bytes), then\n"
"created_at and the carried columns (str or None). None when the message is not one\n"
"the fast path accepts (including a relation id without a plan): the pure decoder then\n"
"decodes it or words its error. Raises only for a malformed argument or plan.");

static PyObject *insert(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "insert() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "plans must be a dict");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_BufferError)) return NULL; /* not bytes-like */
        PyErr_Clear(); /* e.g. a non-contiguous view: the pure path copies it */
        Py_RETURN_NONE;
    }
    const unsigned char *buf = view.buf;
    PyObject *out = NULL, *plan = NULL, *slots, *aliases;
    long ncols, nfields;
    if (view.len < HEAD || buf[0] != 'I') {
        out = Py_NewRef(Py_None);
    } else if ((plan = plan_of(args[1], buf)) == NULL) {
        if (!PyErr_Occurred()) out = Py_NewRef(Py_None);
    } else if (unpack_plan(plan, &slots, &ncols, &nfields, &aliases) == 0) {
        Py_INCREF(plan); /* parse runs no Python code, but keep the borrowed plan alive */
        out = parse(buf, view.len, slots, ncols, nfields, aliases);
        Py_DECREF(plan);
    }
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"insert", (PyCFunction)(void (*)(void))insert, METH_FASTCALL, insert_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_cpgoutput",
    .m_doc = "The compiled fast path of cdc_relay.decoding.pgoutput (see its insert()).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__cpgoutput(void) { return PyModule_Create(&module); }
