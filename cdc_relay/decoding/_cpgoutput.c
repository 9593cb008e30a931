/* The compiled fast path of the pgoutput decoder (docs/design.md, "The compiled decoders").
 *
 * Owns ``Reader.insert``: the common Insert message of an outbox relation, parsed
 * straight from the message's buffer into the finished OutboxEvent (_coutbox.h builds it
 * and parses created_at). It accepts a message only when
 * cdc_relay/decoding/pgoutput.py's pure path would accept it and give the same event;
 * for anything else (another message type, an unknown relation, a truncated or odd tuple,
 * NULL in a required column, invalid UTF-8, a created_at the compiled parse does not
 * read) it returns None and the pure path runs, producing the event or the DecodeError.
 * It must never raise for a message, and never word an error: declining is its only
 * answer to bad input. The plans are the decoder's (one per outbox relation, kept in the
 * dict the Reader holds); the Reader keeps no other state than the last created_at.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_coutbox.h"

#define FIELDS 6      /* id, aggregate_type, aggregate_id, event_type, payload, created_at */
#define CREATED_AT 5
#define TRACE 2       /* with carried columns: (extras), traceparent, tracestate */
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

/* A Reader: the decoder's plans (the dict it keeps them in) and the event class. */
typedef struct {
    PyObject_HEAD
    PyObject *plans; /* relation id -> (slots, ncols, nfields, aliases) */
    Outbox outbox;   /* the event class, and the last created_at */
} Reader;

/* The fields after the payload into fields[]: created_at_ms, then (nfields > FIELDS) the
 * carried texts as (extras), traceparent, tracestate, else (), None, None. 0, 1 to
 * decline, -1 on an error. */
static int optional_fields(Reader *self, const Span *spans, long nfields, PyObject **fields) {
    Span created = spans[CREATED_AT];
    if (created.at == NULL) {
        fields[EV_CREATED_AT_MS] = Py_NewRef(Py_None);
    } else {
        int status = outbox_created_at(&self->outbox, (const char *)created.at, created.len,
                                       &fields[EV_CREATED_AT_MS]);
        if (status <= 0) return status < 0 ? -1 : 1;
    }
    long nextras = nfields > FIELDS ? nfields - FIELDS - TRACE : 0;
    if ((fields[EV_EXTRA] = PyTuple_New(nextras)) == NULL) return -1;
    for (long j = 0; j < nextras; j++) {
        PyObject *value = text(spans[FIELDS + j]);
        if (value == NULL) return PyErr_Occurred() ? -1 : 1; /* NULL items are skipped */
        PyTuple_SET_ITEM(fields[EV_EXTRA], j, value);
    }
    for (int j = 0; j < TRACE; j++) {
        Span span = nfields > FIELDS ? spans[FIELDS + nextras + j] : (Span){NULL, 0};
        if ((fields[EV_TRACEPARENT + j] = text(span)) == NULL) return PyErr_Occurred() ? -1 : 1;
    }
    return 0;
}

/* The event, Py_None (declined) or NULL (failed, exception set). */
static PyObject *event(Reader *self, const Span *spans, long nfields, PyObject *wal_start) {
    for (int field = 0; field < REQUIRED; field++)
        if (spans[field].at == NULL) Py_RETURN_NONE;
    PyObject *fields[EV_FIELDS] = {NULL};
    /* created_at first: a declined timestamp then costs no other object */
    int status = optional_fields(self, spans, nfields, fields);
    for (int field = 0; status == 0 && field < REQUIRED; field++) {
        if (field == PAYLOAD)
            fields[field] = PyBytes_FromStringAndSize((const char *)spans[field].at,
                                                      spans[field].len);
        else if (field == EV_AGGREGATE_TYPE || field == EV_EVENT_TYPE)
            fields[field] = outbox_repeated_text(&self->outbox, field == EV_EVENT_TYPE,
                                                 (const char *)spans[field].at, spans[field].len);
        else
            fields[field] = text(spans[field]);
        if (fields[field] == NULL) status = PyErr_Occurred() ? -1 : 1;
    }
    if (status != 0) {
        outbox_discard(fields);
        return status < 0 ? NULL : Py_NewRef(Py_None);
    }
    fields[EV_LSN] = Py_NewRef(wal_start);
    return outbox_event(&self->outbox, fields);
}

static PyObject *parse(Reader *self, const unsigned char *buf, Py_ssize_t size, PyObject *slots,
                       long ncols, long nfields, PyObject *aliases, PyObject *wal_start) {
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
    return event(self, spans, nfields, wal_start);
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
    if (*nfields < FIELDS || *nfields == FIELDS + 1) {
        PyErr_Format(PyExc_ValueError, "a plan's nfields must be %d, or at least %d (the "
                     "carried columns, the two trace columns last)", FIELDS, FIELDS + TRACE);
        return -1;
    }
    return 0;
}

/* The relation id's plan (a new reference: the key's release, unpacking the plan and the
 * event's allocation may run Python code that changes ``plans``), NULL if none (or with an
 * exception set). */
static PyObject *plan_of(PyObject *plans, const unsigned char *buf) {
    PyObject *key = PyLong_FromUnsignedLong(be32(buf + 1));
    if (key == NULL) return NULL;
    PyObject *plan = Py_XNewRef(PyDict_GetItemWithError(plans, key));
    Py_DECREF(key);
    return plan;
}

PyDoc_STRVAR(insert_doc,
"insert(payload, wal_start, /)\n--\n\n"
"The OutboxEvent (lsn ``wal_start``) of an outbox Insert message (a bytes-like\n"
"object), or None.\n\n"
"The Reader's ``plans`` map relation id -> (slots, ncols, nfields, aliases): ``slots``\n"
"maps tuple column -> field (-1: not used; fields: id, aggregate_type, aggregate_id,\n"
"event_type, payload, created_at, then the carried columns: the extras, traceparent,\n"
"tracestate), ``ncols`` is the relation's column count, ``nfields`` 6 without carried\n"
"columns, ``aliases`` (field, field whose column it shares) pairs. None when the\n"
"message is not one the fast path accepts (including a relation id without a plan):\n"
"the pure decoder then decodes it or words its error. Raises only for a malformed\n"
"argument or plan.");

static PyObject *reader_insert(Reader *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "insert() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (self->plans == NULL || self->outbox.type == NULL) {
        PyErr_SetString(PyExc_TypeError, "Reader.insert(): the Reader is not initialised");
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
    } else if ((plan = plan_of(self->plans, buf)) == NULL) {
        if (!PyErr_Occurred()) out = Py_NewRef(Py_None);
    } else {
        if (unpack_plan(plan, &slots, &ncols, &nfields, &aliases) == 0)
            out = parse(self, buf, view.len, slots, ncols, nfields, aliases, args[1]);
        Py_DECREF(plan);
    }
    PyBuffer_Release(&view);
    return out;
}

static int reader_init(Reader *self, PyObject *args, PyObject *kwargs) {
    PyObject *plans, *event_class;
    static char *keywords[] = {"plans", "event_class", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O:Reader", keywords, &PyDict_Type, &plans,
                                     &event_class))
        return -1;
    Py_CLEAR(self->plans);
    if (outbox_setup(&self->outbox, event_class) < 0) return -1;
    self->plans = Py_NewRef(plans);
    return 0;
}

static void reader_dealloc(Reader *self) {
    Py_CLEAR(self->plans);
    outbox_clear(&self->outbox);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef reader_methods[] = {
    {"insert", (PyCFunction)(void (*)(void))reader_insert, METH_FASTCALL, insert_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc_relay.decoding._cpgoutput.Reader",
    .tp_doc = PyDoc_STR("Reader(plans, event_class): reads the common Inserts of the outbox "
                        "relations ``plans`` has a plan for into event_class (OutboxEvent) "
                        "instances (docs/design.md, \"The compiled decoders\")."),
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_cpgoutput",
    .m_doc = "The compiled fast path of cdc_relay.decoding.pgoutput (see Reader.insert()).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__cpgoutput(void) {
    return outbox_module(&module, &ReaderType, sizeof(Reader), (initproc)reader_init,
                         (destructor)reader_dealloc, reader_methods);
}
