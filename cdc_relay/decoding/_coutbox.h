/* The OutboxEvent a compiled decoder returns, and its created_at (docs/design.md, "The
 * compiled decoders").
 *
 * Owns, for _cwal2json.c and _cpgoutput.c (included after Python.h): building a
 * cdc_relay.model.OutboxEvent straight from C (outbox_event: the object is allocated as
 * ``object.__new__`` does and its eleven slots are stored, so no Python code runs), the
 * check that the class is the slots dataclass of exactly those fields in that order
 * (outbox_setup, with _cslots.h), and created_at's epoch milliseconds from the row's raw bytes with a
 * one-entry cache of the last accepted text (outbox_created_at; the parse is
 * _ctimestamp.h's). The cache holds only a pure function's
 * last answer, so a decline or a pure-path row in between never makes it stale. Also the
 * module set-up both share (outbox_module: the Reader type's common slots), and Decode,
 * the decoder's entry point both modules export: ``Decode(fast, slow, lsn_class)`` called
 * with (payload, position) makes the position an Lsn (without Python code: int's own
 * constructor for subclasses, called directly), remembers the last
 * non-zero one (``position``: the decoder's errors name it for messages that carry none),
 * and returns ``fast(payload, lsn)`` unless that is None, then ``slow(payload, lsn)``.
 *
 * Must not: accept a class whose fields differ from the ones listed here (a field added to
 * OutboxEvent would be left unset: outbox_setup raises instead), run Python code per
 * event, or decide anything about a timestamp the parse declines except PostgreSQL's two
 * infinities, which are None exactly as on the pure path (decoding/values.py).
 */
#ifndef CDC_RELAY_COUTBOX_H
#define CDC_RELAY_COUTBOX_H

#include <stddef.h>
#include <string.h>
#include "_cslots.h"
#include "_ctimestamp.h"

typedef struct {
    PyTypeObject *type;            /* OutboxEvent (a strong reference); NULL: not set up */
    Py_ssize_t offset[EV_FIELDS];  /* each field's slot in the instance */
    PyObject *attempt;             /* 1: every WAL event is its first attempt */
    PyObject *created_ms;          /* created_text's milliseconds (int or None); NULL: none */
    Py_ssize_t created_len;
    char created_text[TS_MAX_TEXT];
    PyObject *repeated[2];         /* the last aggregate_type and event_type (str); NULL: none */
} Outbox;

static void outbox_clear(Outbox *o)
{
    Py_CLEAR(o->type);
    Py_CLEAR(o->attempt);
    Py_CLEAR(o->created_ms);
    Py_CLEAR(o->repeated[0]);
    Py_CLEAR(o->repeated[1]);
}

/* The str of UTF-8 text that mostly repeats from row to row (``which``: 0 aggregate_type,
 * 1 event_type): when the bytes are those of the last one (ASCII), that str again - nothing
 * allocated, and its hash, which the router's cache lookup needs, already computed; else
 * a new one, kept for the next row. NULL with no exception set: not UTF-8 (decline). */
static inline PyObject *outbox_repeated_text(Outbox *o, int which, const char *s, Py_ssize_t n)
{
    PyObject *last = o->repeated[which];
    if (last != NULL && PyUnicode_IS_COMPACT_ASCII(last) && PyUnicode_GET_LENGTH(last) == n
        && memcmp(PyUnicode_DATA(last), s, (size_t)n) == 0)
        return Py_NewRef(last);
    PyObject *text = PyUnicode_DecodeUTF8(s, n, NULL);
    if (text == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            PyErr_Clear();
        return NULL;
    }
    Py_XSETREF(o->repeated[which], Py_NewRef(text));
    return text;
}

/* Check ``cls`` and remember how to fill it: 0, or -1 with TypeError (a bug: the decoders
 * pass cdc_relay.model.OutboxEvent, and this must change with it). */
static int outbox_setup(Outbox *o, PyObject *cls)
{
    outbox_clear(o);
    if (slots_class(cls, outbox_fields, EV_FIELDS, o->offset, "_coutbox.h") < 0)
        return -1;
    if ((o->attempt = PyLong_FromLong(1)) == NULL)
        return -1;
    o->type = (PyTypeObject *)Py_NewRef(cls);
    o->created_len = -1;
    return 0;
}

/* Drop the field values gathered so far (NULL ones are skipped). */
static void outbox_discard(PyObject **fields)
{
    for (int k = 0; k < EV_FIELDS; k++)
        Py_CLEAR(fields[k]);
}

/* The event of ``fields`` (every one set but EV_ATTEMPT, which is 1), whose references it
 * takes, also on failure (NULL, exception set). */
static PyObject *outbox_event(const Outbox *o, PyObject **fields)
{
    PyObject *event = o->type->tp_alloc(o->type, 0); /* what object.__new__ calls */
    if (event == NULL) {
        outbox_discard(fields);
        return NULL;
    }
    fields[EV_ATTEMPT] = Py_NewRef(o->attempt);
    for (int k = 0; k < EV_FIELDS; k++)
        *(PyObject **)((char *)event + o->offset[k]) = fields[k];
    return event;
}

/* The created_at_ms of the text s[0..n) into *out (a new reference: an int, or None for
 * "infinity" / "-infinity"): 1, or 0 to decline (the pure path decides), -1 on an error.
 * A text equal to the last accepted one is one comparison and no object. */
static int outbox_created_at(Outbox *o, const char *s, Py_ssize_t n, PyObject **out)
{
    if (n == o->created_len && memcmp(s, o->created_text, (size_t)n) == 0) {
        *out = Py_NewRef(o->created_ms);
        return 1;
    }
    int64_t ms;
    PyObject *value;
    if (ts_epoch_ms(s, n, &ms) == 0) {
        if ((value = PyLong_FromLongLong((long long)ms)) == NULL)
            return -1;
    }
    else if ((n == 8 && memcmp(s, "infinity", 8) == 0)
             || (n == 9 && memcmp(s, "-infinity", 9) == 0))
        value = Py_NewRef(Py_None);
    else
        return 0;
    memcpy(o->created_text, s, (size_t)n); /* n <= TS_MAX_TEXT: ts_epoch_ms or infinity */
    o->created_len = n;
    Py_XSETREF(o->created_ms, Py_NewRef(value));
    *out = value;
    return 1;
}

/* ---- Decode: the decoder's entry point ---------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fast;     /* fast(payload, lsn): the event, or None */
    PyObject *slow;     /* slow(payload, lsn): the pure decoder, for everything else */
    PyTypeObject *lsn;  /* cdc_relay.model.Lsn: an int subclass with no fields of its own */
    PyObject *position; /* the last non-zero position (an int) */
    PyObject *args;     /* the 1-tuple decode_lsn hands int's constructor, reused */
} Decode;

/* ``position`` (an int) as an Lsn: a new reference, NULL with an exception set. Through
 * int's own constructor for subclasses (``lsn->tp_new``, public API; decode_init checks it
 * is int's), without the class call's argument parsing and __init__ look-up around it.
 * Its argument tuple is ``*args``, reused while nothing else holds it (int's constructor
 * keeps no reference to it), so an event costs no tuple (docs/design.md, "Each extension
 * earns its keep": a tuple per event was ~1 % of the main thread). */
static PyObject *decode_lsn(PyTypeObject *lsn, PyObject **args, PyObject *position)
{
    if (Py_IS_TYPE(position, lsn))
        return Py_NewRef(position);
    if (*args == NULL || Py_REFCNT(*args) != 1) {
        Py_XSETREF(*args, PyTuple_Pack(1, position));
        if (*args == NULL)
            return NULL;
    } else if (PyTuple_GET_ITEM(*args, 0) != position) {
        /* refcount 1: the tuple is ours alone, and so may be filled again (as
         * PyTuple_SetItem would, without its checks: the ones above are its) */
        PyObject *old = PyTuple_GET_ITEM(*args, 0);
        PyTuple_SET_ITEM(*args, 0, Py_NewRef(position));
        Py_DECREF(old);
    }
    return lsn->tp_new(lsn, *args, NULL);
}

static PyObject *decode_call(Decode *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "decode takes (payload, position)");
        return NULL;
    }
    PyObject *position = args[1];
    if (!PyLong_Check(position)) {
        PyErr_Format(PyExc_TypeError, "decode: the position must be an int, not %.100s",
                     Py_TYPE(position)->tp_name);
        return NULL;
    }
    PyObject *lsn = decode_lsn(self->lsn, &self->args, position);
    if (lsn == NULL)
        return NULL;
    int nonzero = PyObject_IsTrue(position); /* an int: never fails */
    if (nonzero)
        Py_SETREF(self->position, Py_NewRef(lsn));
    PyObject *call[3] = {NULL, args[0], lsn};
    PyObject *out = PyObject_Vectorcall(self->fast, call + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                        NULL);
    if (out == Py_None) {
        Py_DECREF(out);
        out = PyObject_Vectorcall(self->slow, call + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    Py_DECREF(lsn);
    return out;
}

static int decode_init(Decode *self, PyObject *args, PyObject *kwargs)
{
    PyObject *fast, *slow;
    PyTypeObject *lsn;
    static char *keywords[] = {"fast", "slow", "lsn_class", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!:Decode", keywords, &fast, &slow,
                                     &PyType_Type, &lsn))
        return -1;
    if (!PyCallable_Check(fast) || !PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_TypeError, "Decode: fast and slow must be callable");
        return -1;
    }
    /* built as int's own subclasses are: only an int subclass without fields of its own */
    if (!PyType_IsSubtype(lsn, &PyLong_Type) || lsn->tp_basicsize != PyLong_Type.tp_basicsize
        || lsn->tp_itemsize != PyLong_Type.tp_itemsize || lsn->tp_dictoffset != 0
        || lsn->tp_new != PyLong_Type.tp_new) {
        PyErr_Format(PyExc_TypeError, "Decode: %s is not an int subclass without fields",
                     lsn->tp_name);
        return -1;
    }
    self->vectorcall = (vectorcallfunc)decode_call;
    Py_XSETREF(self->fast, Py_NewRef(fast));
    Py_XSETREF(self->slow, Py_NewRef(slow));
    Py_XSETREF(self->lsn, (PyTypeObject *)Py_NewRef(lsn));
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL)
        return -1;
    Py_XSETREF(self->position, decode_lsn(lsn, &self->args, zero));
    Py_DECREF(zero);
    return self->position == NULL ? -1 : 0;
}

/* slow is a bound method of the decoder that holds this: a cycle. */
static int decode_traverse(Decode *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fast);
    Py_VISIT(self->slow);
    Py_VISIT(self->lsn);
    Py_VISIT(self->position);
    Py_VISIT(self->args);
    return 0;
}

static int decode_clear(Decode *self)
{
    self->vectorcall = NULL; /* a call after this goes to the tp_call entry, which refuses */
    Py_CLEAR(self->fast);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->lsn);
    Py_CLEAR(self->position);
    Py_CLEAR(self->args);
    return 0;
}

static void decode_dealloc(Decode *self)
{
    PyObject_GC_UnTrack(self);
    decode_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *decode_vectorcall_entry(PyObject *self, PyObject *args, PyObject *kwargs)
{
    if (((Decode *)self)->fast == NULL) {
        PyErr_SetString(PyExc_TypeError, "Decode is not initialised");
        return NULL;
    }
    return PyVectorcall_Call(self, args, kwargs);
}

static PyObject *decode_get_position(Decode *self, void *closure)
{
    return Py_NewRef(self->position != NULL ? self->position : Py_None);
}

static PyGetSetDef decode_getset[] = {
    {"position", (getter)decode_get_position, NULL,
     "The last non-zero position decoded (an Lsn; 0/0 before the first).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DecodeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "Decode", /* named per module in outbox_module */
    .tp_doc = PyDoc_STR("Decode(fast, slow, lsn_class): the decoder's entry point, "
                        "decode(payload, position) (docs/design.md, \"The compiled decoders\")."),
    .tp_basicsize = sizeof(Decode),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Decode, vectorcall),
    .tp_call = decode_vectorcall_entry,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)decode_init,
    .tp_dealloc = (destructor)decode_dealloc,
    .tp_traverse = (traverseproc)decode_traverse,
    .tp_clear = (inquiry)decode_clear,
    .tp_getset = decode_getset,
};

/* The module ``def`` describes, with its ``Reader`` type readied and added; ``type`` has
 * its name and doc, the rest of what both decoders' Readers share is filled in here. */
static PyObject *outbox_module(struct PyModuleDef *def, PyTypeObject *type, Py_ssize_t size,
                               initproc init, destructor dealloc, PyMethodDef *methods)
{
    type->tp_basicsize = size;
    type->tp_flags = Py_TPFLAGS_DEFAULT;
    type->tp_new = PyType_GenericNew;
    type->tp_init = init;
    type->tp_dealloc = dealloc;
    type->tp_methods = methods;
    if (PyType_Ready(type) < 0)
        return NULL;
    if (!(DecodeType.tp_flags & Py_TPFLAGS_READY)) { /* once per process */
        static char name[64];
        PyOS_snprintf(name, sizeof name, "cdc_relay.decoding.%s.Decode", def->m_name);
        DecodeType.tp_name = name;
        if (PyType_Ready(&DecodeType) < 0)
            return NULL;
    }
    PyObject *m = PyModule_Create(def);
    if (m != NULL && (PyModule_AddObjectRef(m, "Reader", (PyObject *)type) < 0
                      || PyModule_AddObjectRef(m, "Decode", (PyObject *)&DecodeType) < 0
                      || slots_export(m, "OUTBOX_FIELDS", outbox_fields, EV_FIELDS) < 0))
        Py_CLEAR(m);
    return m;
}

#endif /* CDC_RELAY_COUTBOX_H */
