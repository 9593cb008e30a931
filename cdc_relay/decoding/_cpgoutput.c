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
 * dict the Reader holds, looked up for every message); the Reader keeps the last
 * created_at, the last relation id's key, and the last plan read into C (held, so the
 * same tuple - immutable - is read once, not per message).
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
#define MAX_SLOTS 1664 /* PostgreSQL's 1600 columns and then some; a longer plan: pure path */

typedef struct {
    const unsigned char *at; /* NULL: the column was NULL (or is not in the relation) */
    Py_ssize_t len;
} Span;

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* A plan read into C: the decoder's (slots, ncols, nfields, aliases) tuple. */
typedef struct Plan {
    long ncols, nfields;
    int accepts;                  /* 0: nfields past MAX_FIELDS or slots past MAX_SLOTS */
    Py_ssize_t nslots, naliases;
    short field[MAX_SLOTS];       /* tuple column -> field, -1: not used */
    short alias[MAX_FIELDS][2];   /* (field, field whose column it shares) */
} Plan;

/* Walk the tuple columns up to the last planned one, as the pure path's _insert does.
 * 1: accepted (spans filled), 0: declined. */
static int walk(const unsigned char *buf, Py_ssize_t size, const Plan *plan, Span *spans) {
    Py_ssize_t pos = HEAD;
    for (Py_ssize_t column = 0; column < plan->nslots; column++) {
        long field = plan->field[column];
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
static void alias(const Plan *plan, Span *spans) {
    for (Py_ssize_t i = 0; i < plan->naliases; i++)
        spans[plan->alias[i][0]] = spans[plan->alias[i][1]];
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
    PyObject *key;   /* the last relation id as an int (the plans' key); NULL: none */
    uint32_t relid;  /* ... and as a number */
    PyObject *read;  /* the plan tuple ``plan`` was read from (held); NULL: none */
    Plan *plan;      /* that plan in C (allocated with the Reader) */
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

static PyObject *parse(Reader *self, const unsigned char *buf, Py_ssize_t size,
                       const Plan *plan, PyObject *wal_start) {
    if (size < HEAD || buf[0] != 'I' || buf[5] != 'N') Py_RETURN_NONE;
    if ((long)(((unsigned)buf[6] << 8) | buf[7]) != plan->ncols) Py_RETURN_NONE;
    if (!plan->accepts) Py_RETURN_NONE;
    /* Read the plan before anything allocates (event() does): a reentrant call may then
     * read another plan into the Reader. */
    long nfields = plan->nfields;
    Span spans[MAX_FIELDS] = {{NULL, 0}};
    if (!walk(buf, size, plan, spans)) Py_RETURN_NONE;
    alias(plan, spans);
    return event(self, spans, nfields, wal_start);
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

/* ``tuple`` (the decoder's plan) into *out, checked: the decoder builds plans, so a bad one
 * is a bug (raise, -1). Reads no item past what it checked: ints and tuples only. */
static int plan_read(PyObject *tuple, Plan *out) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 4) {
        PyErr_SetString(PyExc_TypeError, "a plan is (slots, ncols, nfields, aliases)");
        return -1;
    }
    PyObject *slots = PyTuple_GET_ITEM(tuple, 0), *aliases = PyTuple_GET_ITEM(tuple, 3);
    if (!PyTuple_Check(slots) || !PyTuple_Check(aliases)) {
        PyErr_SetString(PyExc_TypeError, "a plan's slots and aliases must be tuples");
        return -1;
    }
    out->ncols = PyLong_AsLong(PyTuple_GET_ITEM(tuple, 1));
    if (out->ncols == -1 && PyErr_Occurred()) return -1;
    long nfields = out->nfields = PyLong_AsLong(PyTuple_GET_ITEM(tuple, 2));
    if (nfields == -1 && PyErr_Occurred()) return -1;
    if (nfields < FIELDS || nfields == FIELDS + 1) {
        PyErr_Format(PyExc_ValueError, "a plan's nfields must be %d, or at least %d (the "
                     "carried columns, the two trace columns last)", FIELDS, FIELDS + TRACE);
        return -1;
    }
    out->nslots = PyTuple_GET_SIZE(slots);
    out->naliases = PyTuple_GET_SIZE(aliases);
    out->accepts = nfields <= MAX_FIELDS && out->nslots <= MAX_SLOTS
                   && out->naliases <= MAX_FIELDS;
    if (!out->accepts) return 0; /* every message of it declined: its items never read */
    for (Py_ssize_t column = 0; column < out->nslots; column++) {
        long field = plan_index(PyTuple_GET_ITEM(slots, column), nfields);
        if (field == -2) return -1;
        out->field[column] = (short)field;
    }
    for (Py_ssize_t i = 0; i < out->naliases; i++) {
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
        out->alias[i][0] = (short)field;
        out->alias[i][1] = (short)first;
    }
    return 0;
}

/* The relation id's plan (a new reference: the event's allocation may run Python code
 * that changes ``plans``), NULL if none (or with an exception set). The key, an int, is
 * the last message's again when the relation is (it nearly always is). */
static PyObject *plan_of(Reader *self, const unsigned char *buf) {
    uint32_t relid = be32(buf + 1);
    if (self->key == NULL || self->relid != relid) {
        PyObject *key = PyLong_FromUnsignedLong(relid);
        if (key == NULL) return NULL;
        Py_XSETREF(self->key, key);
        self->relid = relid;
    }
    PyObject *key = Py_NewRef(self->key);
    PyObject *plan = Py_XNewRef(PyDict_GetItemWithError(self->plans, key));
    Py_DECREF(key);
    return plan;
}

/* ``plan`` read into the Reader's Plan, unless it is the one read last: 0, -1 (raised). */
static int plan_use(Reader *self, PyObject *plan) {
    if (plan == self->read)
        return 0;
    Py_CLEAR(self->read); /* a failed read leaves none */
    if (plan_read(plan, self->plan) < 0)
        return -1;
    self->read = Py_NewRef(plan);
    return 0;
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
    if (self->plans == NULL || self->outbox.type == NULL || self->plan == NULL) {
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
    PyObject *out = NULL, *plan = NULL;
    if (view.len < HEAD || buf[0] != 'I') {
        out = Py_NewRef(Py_None);
    } else if ((plan = plan_of(self, buf)) == NULL) {
        if (!PyErr_Occurred()) out = Py_NewRef(Py_None);
    } else {
        if (plan_use(self, plan) == 0)
            out = parse(self, buf, view.len, self->plan, args[1]);
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
    Py_CLEAR(self->key);
    Py_CLEAR(self->read);
    if (self->plan == NULL && (self->plan = PyMem_Calloc(1, sizeof(Plan))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (outbox_setup(&self->outbox, event_class) < 0) return -1;
    self->plans = Py_NewRef(plans);
    return 0;
}

static void reader_dealloc(Reader *self) {
    Py_CLEAR(self->plans);
    Py_CLEAR(self->key);
    Py_CLEAR(self->read);
    PyMem_Free(self->plan);
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
