/* The replication stream's reader, compiled (docs/design.md, "The compiled reader").
 *
 * Owns: Changes, one per replication session: ``changes()`` is what the session calls per
 * message. It calls ``get_copy_data(1)`` (psycopg's non-blocking read), and for an
 * XLogData message with a payload - every row - takes its position from the header and
 * returns ``decode(payload, position)`` (the decoder's entry point), so a row costs no
 * Python frame between libpq and the decoder. Nothing buffered → None; a message that
 * decodes to nothing → ``no_change``. Everything else (a keepalive, a header-only
 * XLogData, the end of the stream) goes to ``message(nbytes, data)``, the stream's Python
 * code (None, or a parsed ServerMessage: a keepalive is returned as it is, an XLogData
 * decoded as above), and an exception of get_copy_data to ``failed(exception)``, which
 * raises the stream's error for it. That is cdc_relay.wal.stream.protocol.read_changes over
 * ReplicationStream.read, the pure twin, without its two Python frames per row.
 *
 * Must not: look into a payload (the decoder does), or decide anything about a message
 * other than a row's: the stream's Python code words every error.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#include "../../decoding/_craise.h"

#define XLOG_DATA 'w'
#define XLOG_HEADER_SIZE 25 /* 'w' + wal_start + wal_end + send_time */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *get_copy_data; /* get_copy_data(1) -> (nbytes, data) */
    PyObject *decode;        /* decode(payload, position) -> change or None */
    PyObject *message;       /* message(nbytes, data) -> None or a ServerMessage */
    PyObject *failed;        /* failed(exception): raises the stream's error */
    PyObject *no_change;     /* what a message that decodes to nothing comes back as */
    PyObject *one;
} Changes;

static PyObject *decoded(Changes *self, PyObject *payload, PyObject *position)
{
    PyObject *call[3] = {NULL, payload, position};
    PyObject *out = PyObject_Vectorcall(self->decode, call + 1,
                                        2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (out == Py_None) {
        Py_DECREF(out);
        out = Py_NewRef(self->no_change);
    }
    return out;
}

/* A row: position and payload out of the XLogData message in ``buf``, then decode. */
static PyObject *row(Changes *self, const unsigned char *buf, Py_ssize_t size)
{
    uint64_t start = 0;
    for (int i = 1; i <= 8; i++)
        start = (start << 8) | buf[i];
    PyObject *position = PyLong_FromUnsignedLongLong(start);
    if (position == NULL)
        return NULL;
    PyObject *payload = PyBytes_FromStringAndSize((const char *)buf + XLOG_HEADER_SIZE,
                                                  size - XLOG_HEADER_SIZE);
    if (payload == NULL) {
        Py_DECREF(position);
        return NULL;
    }
    PyObject *out = decoded(self, payload, position);
    Py_DECREF(payload);
    Py_DECREF(position);
    return out;
}

/* What the stream's Python code makes of any other message. */
static PyObject *other(Changes *self, PyObject *nbytes, PyObject *data)
{
    PyObject *call[3] = {NULL, nbytes, data};
    PyObject *parsed = PyObject_Vectorcall(self->message, call + 1,
                                           2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (parsed == NULL || parsed == Py_None)
        return parsed;
    if (!PyTuple_CheckExact(parsed) || PyTuple_GET_SIZE(parsed) != 3) {
        PyErr_Format(PyExc_TypeError, "Changes: message() must return None or a "
                     "(kind, position, data) tuple, not %.100s", Py_TYPE(parsed)->tp_name);
        Py_DECREF(parsed);
        return NULL;
    }
    PyObject *kind = PyTuple_GET_ITEM(parsed, 0);
    long code = PyLong_Check(kind) ? PyLong_AsLong(kind) : -1;
    if (code == -1 && PyErr_Occurred()) {
        Py_DECREF(parsed);
        return NULL;
    }
    if (code != XLOG_DATA)
        return parsed; /* a keepalive: the session's */
    PyObject *out = decoded(self, PyTuple_GET_ITEM(parsed, 2), PyTuple_GET_ITEM(parsed, 1));
    Py_DECREF(parsed);
    return out;
}

static PyObject *changes_call(Changes *self, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 0 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "changes() takes no arguments");
        return NULL;
    }
    PyObject *got = PyObject_CallOneArg(self->get_copy_data, self->one);
    if (got == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL; /* KeyboardInterrupt and the like go as they came */
        return raise_through(self->failed); /* failed() raises the stream's error */
    }
    if (!PyTuple_CheckExact(got) || PyTuple_GET_SIZE(got) != 2
        || !PyLong_CheckExact(PyTuple_GET_ITEM(got, 0))) {
        PyErr_Format(PyExc_TypeError, "Changes: get_copy_data() must return (nbytes, data), "
                     "not %.100s", Py_TYPE(got)->tp_name);
        Py_DECREF(got);
        return NULL;
    }
    PyObject *nbytes = PyTuple_GET_ITEM(got, 0), *data = PyTuple_GET_ITEM(got, 1);
    long size = PyLong_AsLong(nbytes);
    PyObject *out;
    if (size == -1 && PyErr_Occurred()) {
        out = NULL;
    } else if (size == 0) {
        out = Py_NewRef(Py_None); /* nothing complete yet */
    } else if (size > XLOG_HEADER_SIZE && (PyMemoryView_Check(data) || PyBytes_CheckExact(data))) {
        /* A memoryview over libpq's buffer (psycopg's C implementation) or bytes (its
         * Python one): read in place through a buffer of our own (a released view
         * refuses one), kept alive by ``view`` until the row is decoded. */
        Py_buffer view;
        if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear(); /* the stream's Python code words it */
            out = other(self, nbytes, data);
        } else {
            const unsigned char *buf = view.buf;
            if (view.len == size && buf[0] == XLOG_DATA)
                out = row(self, buf, view.len);
            else
                out = other(self, nbytes, data);
            PyBuffer_Release(&view);
        }
    } else {
        out = other(self, nbytes, data);
    }
    Py_DECREF(got);
    return out;
}

static int changes_init(Changes *self, PyObject *args, PyObject *kwargs)
{
    PyObject *get_copy_data, *decode, *message, *failed, *no_change;
    static char *keywords[] = {"get_copy_data", "decode", "message", "failed", "no_change",
                               NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO:Changes", keywords, &get_copy_data,
                                     &decode, &message, &failed, &no_change))
        return -1;
    if (!PyCallable_Check(get_copy_data) || !PyCallable_Check(decode)
        || !PyCallable_Check(message) || !PyCallable_Check(failed)) {
        PyErr_SetString(PyExc_TypeError,
                        "Changes: get_copy_data, decode, message and failed must be callable");
        return -1;
    }
    if (no_change == Py_None) {
        PyErr_SetString(PyExc_TypeError, "Changes: no_change cannot be None (nothing buffered)");
        return -1;
    }
    Py_XSETREF(self->get_copy_data, Py_NewRef(get_copy_data));
    Py_XSETREF(self->decode, Py_NewRef(decode));
    Py_XSETREF(self->message, Py_NewRef(message));
    Py_XSETREF(self->failed, Py_NewRef(failed));
    Py_XSETREF(self->no_change, Py_NewRef(no_change));
    Py_XSETREF(self->one, PyLong_FromLong(1));
    if (self->one == NULL)
        return -1;
    self->vectorcall = (vectorcallfunc)changes_call;
    return 0;
}

/* Before __init__ ran (Changes.__new__(Changes)), a call must not reach NULL callables. */
static PyObject *changes_call_entry(PyObject *self, PyObject *args, PyObject *kwargs)
{
    if (((Changes *)self)->get_copy_data == NULL) {
        PyErr_SetString(PyExc_TypeError, "Changes is not initialised");
        return NULL;
    }
    return PyVectorcall_Call(self, args, kwargs);
}

/* message and failed are bound methods of the stream, decode the decoder's: a cycle. */
static int changes_traverse(Changes *self, visitproc visit, void *arg)
{
    Py_VISIT(self->get_copy_data);
    Py_VISIT(self->decode);
    Py_VISIT(self->message);
    Py_VISIT(self->failed);
    Py_VISIT(self->no_change);
    return 0;
}

static int changes_clear(Changes *self)
{
    self->vectorcall = NULL; /* a call after this goes to changes_call_entry, which refuses */
    Py_CLEAR(self->get_copy_data);
    Py_CLEAR(self->decode);
    Py_CLEAR(self->message);
    Py_CLEAR(self->failed);
    Py_CLEAR(self->no_change);
    Py_CLEAR(self->one);
    return 0;
}

static void changes_dealloc(Changes *self)
{
    PyObject_GC_UnTrack(self);
    changes_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *changes_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    Changes *self = (Changes *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->vectorcall = NULL; /* tp_call until __init__ succeeded */
    return (PyObject *)self;
}

static PyTypeObject ChangesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc_relay.wal.stream._cstream.Changes",
    .tp_doc = PyDoc_STR("Changes(get_copy_data, decode, message, failed, no_change): the "
                        "replication stream's reader, compiled (docs/design.md, \"The "
                        "compiled reader\")."),
    .tp_basicsize = sizeof(Changes),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Changes, vectorcall),
    .tp_new = changes_new,
    .tp_init = (initproc)changes_init,
    .tp_call = changes_call_entry,
    .tp_dealloc = (destructor)changes_dealloc,
    .tp_traverse = (traverseproc)changes_traverse,
    .tp_clear = (inquiry)changes_clear,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_cstream",
    .m_doc = "The compiled reader of cdc_relay.wal.stream.replication (see Changes).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__cstream(void)
{
    if (PyType_Ready(&ChangesType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "Changes", (PyObject *)&ChangesType) < 0)
        Py_CLEAR(m);
    return m;
}
