/* The Kafka sink's delivery reports, compiled (docs/design.md, "The compiled delivery
 * report").
 *
 * Owns: Reports, one per KafkaSink, and the callback it hands out per message
 * (``Reports.callback(token)``), which confluent-kafka calls with (error, message) once
 * the broker answered. A success is counted in ``delivered`` and goes to what the sink
 * points at when the report is served: with a ``batch`` handler, its token is kept in a
 * list that ``hand_over()`` passes to ``batch(tokens)`` once the sink's poll returns -
 * one Python call per poll, not per report; else straight to ``handler(token, None)``.
 * A failure first hands over the successes kept before it (reports reach Python in the
 * order they were served), then goes to ``failure(token, error, message)``, the sink's
 * Python code, which classifies it. That is what cdc_relay.sink.kafka.sink.Reports, the pure
 * twin, does, without a Python frame and a functools.partial per report.
 *
 * Also owns Sender, one per KafkaSink: ``send(message, token)`` is KafkaSink.produce
 * without its Python frame - it reads an exact Message's slots (_cslots.h) and calls the
 * producer's produce with them positionally and the token's callback. Any other message
 * goes to ``slow(message, token)`` (KafkaSink's Python produce), and what produce
 * raises goes to ``rejected(exception)``, the sink's Python code, which raises the
 * Sink protocol's error for it.
 *
 * Must not: look into a failure (the sink classifies it), keep the handler a message had
 * when it was produced (a session that has ended must get no report: the sink points
 * ``handler`` elsewhere, handing over first), or do anything else per success.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "../../decoding/_craise.h"
#include "../../decoding/_cslots.h"

#ifndef Py_T_PYSSIZET /* before Python 3.12 the member types are in structmember.h */
#include <structmember.h>
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#endif

typedef struct {
    PyObject_HEAD
    PyObject *handler;    /* handler(token, None): a success */
    PyObject *failure;    /* failure(token, error, message): anything else */
    PyObject *batch;      /* batch(tokens): the successes of a poll, or NULL: per report */
    PyObject *done;       /* with a batch handler: the successes not yet handed over */
    Py_ssize_t delivered; /* successes served (with a batch handler, not yet all handed over) */
} Reports;

/* Pass the kept successes to the batch handler (a fresh list: it may keep the old). */
static int hand_over(Reports *self)
{
    if (self->done == NULL || PyList_GET_SIZE(self->done) == 0)
        return 0;
    PyObject *tokens = self->done, *batch = self->batch, *result;
    if ((self->done = PyList_New(0)) == NULL) {
        self->done = tokens;
        return -1;
    }
    Py_INCREF(batch); /* the batch handler may point the sink elsewhere */
    result = PyObject_CallOneArg(batch, tokens);
    Py_DECREF(batch);
    Py_DECREF(tokens);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Reports *owner;
    PyObject *token;
} Report;

static PyObject *report_call(Report *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a delivery report takes (error, message)");
        return NULL;
    }
    Reports *owner = self->owner;
    if (owner->handler == NULL || owner->failure == NULL || owner->done == NULL) {
        PyErr_SetString(PyExc_TypeError, "a delivery report of Reports that are not "
                        "initialised (or were cleared)");
        return NULL;
    }
    /* call[0] is spare, so a bound method handler can put its self there */
    PyObject *call[4] = {NULL, self->token, Py_None, NULL}, *target, *result;
    size_t count = 2;
    if (args[0] == Py_None) {
        owner->delivered++;
        if (owner->batch != NULL) {
            if (PyList_Append(owner->done, self->token) < 0)
                return NULL;
            Py_RETURN_NONE;
        }
        target = Py_NewRef(owner->handler); /* the handler may point the sink elsewhere */
    }
    else {
        if (hand_over(owner) < 0)
            return NULL;
        call[2] = args[0];
        call[3] = args[1];
        count = 3;
        target = Py_NewRef(owner->failure);
    }
    result = PyObject_Vectorcall(target, call + 1, count | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(target);
    return result;
}

static void report_dealloc(Report *self)
{
    Py_DECREF(self->owner);
    Py_DECREF(self->token);
    PyObject_Free(self);
}

/* Not collected: a Report is held by confluent-kafka alone until its report, and nothing
 * it refers to refers back to it. */
static PyTypeObject ReportType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc_relay.sink.kafka._creports.Report",
    .tp_doc = PyDoc_STR("One message's delivery callback (Reports.callback)."),
    .tp_basicsize = sizeof(Report),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Report, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dealloc = (destructor)report_dealloc,
};

PyDoc_STRVAR(callback_doc,
"callback(token, /)\n--\n\n"
"The delivery callback of the message ``token`` names: callback(error, message).");

static PyObject *reports_callback(Reports *self, PyObject *token)
{
    if (self->handler == NULL) {
        PyErr_SetString(PyExc_TypeError, "Reports is not initialised");
        return NULL;
    }
    Report *report = PyObject_New(Report, &ReportType);
    if (report == NULL)
        return NULL;
    report->vectorcall = (vectorcallfunc)report_call;
    report->owner = (Reports *)Py_NewRef(self);
    report->token = Py_NewRef(token);
    return (PyObject *)report;
}

static int reports_init(Reports *self, PyObject *args, PyObject *kwargs)
{
    PyObject *handler, *failure;
    static char *keywords[] = {"handler", "failure", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:Reports", keywords, &handler, &failure))
        return -1;
    if (!PyCallable_Check(handler) || !PyCallable_Check(failure)) {
        PyErr_SetString(PyExc_TypeError, "Reports: handler and failure must be callable");
        return -1;
    }
    Py_XSETREF(self->handler, Py_NewRef(handler));
    Py_XSETREF(self->failure, Py_NewRef(failure));
    Py_CLEAR(self->batch);
    Py_XSETREF(self->done, PyList_New(0));
    self->delivered = 0;
    return self->done == NULL ? -1 : 0;
}

static PyObject *reports_get_handler(Reports *self, void *closure)
{
    if (self->handler == NULL) {
        PyErr_SetString(PyExc_AttributeError, "Reports.handler: not initialised");
        return NULL;
    }
    return Py_NewRef(self->handler);
}

static int reports_set_handler(Reports *self, PyObject *value, void *closure)
{
    if (value == NULL || !PyCallable_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "Reports.handler must be callable");
        return -1;
    }
    Py_SETREF(self->handler, Py_NewRef(value));
    return 0;
}

static PyObject *reports_get_batch(Reports *self, void *closure)
{
    return Py_NewRef(self->batch != NULL ? self->batch : Py_None);
}

/* Set only after hand_over(): the kept successes belong to the batch handler before. */
static int reports_set_batch(Reports *self, PyObject *value, void *closure)
{
    if (value != NULL && value != Py_None && !PyCallable_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "Reports.batch must be callable or None");
        return -1;
    }
    if (self->done != NULL && PyList_GET_SIZE(self->done) > 0) {
        PyErr_SetString(PyExc_RuntimeError, "Reports.batch changed with successes not handed "
                        "over: call hand_over() first");
        return -1;
    }
    if (self->done == NULL && (self->done = PyList_New(0)) == NULL)
        return -1; /* not initialised: the list the callbacks append to */
    Py_XSETREF(self->batch, value == NULL || value == Py_None ? NULL : Py_NewRef(value));
    return 0;
}

PyDoc_STRVAR(hand_over_doc,
"hand_over()\n--\n\n"
"Pass the successes kept since the last hand-over to ``batch(tokens)``, if any.");

static PyObject *reports_hand_over(Reports *self, PyObject *unused)
{
    if (hand_over(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The handler is usually a bound method of a session that holds the sink that holds
 * this: a cycle, which the garbage collector must be able to see and break. */
static int reports_traverse(Reports *self, visitproc visit, void *arg)
{
    Py_VISIT(self->handler);
    Py_VISIT(self->failure);
    Py_VISIT(self->batch);
    Py_VISIT(self->done);
    return 0;
}

static int reports_clear(Reports *self)
{
    Py_CLEAR(self->handler);
    Py_CLEAR(self->failure);
    Py_CLEAR(self->batch);
    Py_CLEAR(self->done);
    return 0;
}

static void reports_dealloc(Reports *self)
{
    PyObject_GC_UnTrack(self);
    reports_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef reports_methods[] = {
    {"callback", (PyCFunction)reports_callback, METH_O, callback_doc},
    {"hand_over", (PyCFunction)reports_hand_over, METH_NOARGS, hand_over_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef reports_members[] = {
    {"failure", Py_T_OBJECT_EX, offsetof(Reports, failure), Py_READONLY,
     "failure(token, error, message): what a failed report is handed to."},
    {"delivered", Py_T_PYSSIZET, offsetof(Reports, delivered), 0,
     "How many successes were served (the sink counts its failures in)."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef reports_getset[] = {
    {"handler", (getter)reports_get_handler, (setter)reports_set_handler,
     "handler(token, None): what a success is handed to, when its report is served "
     "(without a batch handler).", NULL},
    {"batch", (getter)reports_get_batch, (setter)reports_set_batch,
     "batch(tokens) or None: what the successes of a poll are handed to, by hand_over().",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ReportsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc_relay.sink.kafka._creports.Reports",
    .tp_doc = PyDoc_STR("Reports(handler, failure): a Kafka sink's delivery reports "
                        "(docs/design.md, \"The compiled delivery report\")."),
    .tp_basicsize = sizeof(Reports),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reports_init,
    .tp_dealloc = (destructor)reports_dealloc,
    .tp_traverse = (traverseproc)reports_traverse,
    .tp_clear = (inquiry)reports_clear,
    .tp_methods = reports_methods,
    .tp_members = reports_members,
    .tp_getset = reports_getset,
};

/* ---- Sender: KafkaSink.produce in C ---------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *produce;       /* the producer's produce (or what raises once it is closed) */
    Reports *reports;        /* whose callback(token) each message carries */
    PyObject *message_class; /* cdc_relay.model.Message: read by its slots */
    PyObject *slow;          /* slow(message, token): any other message */
    PyObject *rejected;      /* rejected(exception): raises the sink's error for it */
    PyObject *zero;          /* 0: the timestamp of a message without one */
    Py_ssize_t at[M_FIELDS];
} Sender;

#define SLOT(object, offset) (*(PyObject **)((char *)(object) + (offset)))

static PyObject *send_fields(Sender *self, PyObject **field, PyObject *token);

static PyObject *sender_send(Sender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "send() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (self->produce == NULL) {
        PyErr_SetString(PyExc_TypeError, "Sender.send(): the Sender is not initialised");
        return NULL;
    }
    PyObject *message = args[0], *token = args[1];
    if ((PyObject *)Py_TYPE(message) != self->message_class)
        return PyObject_Vectorcall(self->slow, args, 2, NULL);
    PyObject *field[M_FIELDS];
    for (int k = 0; k < M_FIELDS; k++)
        if ((field[k] = SLOT(message, self->at[k])) == NULL) /* never set: the slow path */
            return PyObject_Vectorcall(self->slow, args, 2, NULL);
    /* Held, not borrowed: the callback's allocation and produce itself may run Python code
     * (the garbage collector's finalizers, a closed sink's stub) that changes the slots. */
    for (int k = 0; k < M_FIELDS; k++)
        Py_INCREF(field[k]);
    PyObject *result = send_fields(self, field, token);
    for (int k = 0; k < M_FIELDS; k++)
        Py_DECREF(field[k]);
    return result;
}

/* produce(...) with the message's ``field`` values and the callback of ``token``. */
static PyObject *send_fields(Sender *self, PyObject **field, PyObject *token)
{
    PyObject *callback = reports_callback(self->reports, token);
    if (callback == NULL)
        return NULL;
    PyObject *timestamp = field[M_TIMESTAMP_MS];
    if (timestamp == Py_None)
        timestamp = self->zero;
    PyObject *partition = field[M_PARTITION];
    PyObject *minus_one = NULL;
    if (partition == Py_None && (partition = minus_one = PyLong_FromLong(-1)) == NULL) {
        Py_DECREF(callback);
        return NULL;
    }
    /* confluent-kafka's keyword order: topic, value, key, partition, callback,
     * on_delivery, timestamp, headers (docs/design.md, WAL mode's hot path) */
    PyObject *call[9] = {NULL, field[M_TOPIC], field[M_VALUE], field[M_KEY], partition,
                         callback, Py_None, timestamp, field[M_HEADERS]};
    PyObject *target = Py_NewRef(self->produce);
    PyObject *result = PyObject_Vectorcall(target, call + 1, 8 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                           NULL);
    Py_DECREF(target);
    Py_XDECREF(minus_one);
    Py_DECREF(callback);
    if (result != NULL)
        return result;
    return raise_through(self->rejected); /* rejected() raises the Sink protocol's error */
}

static int sender_init(Sender *self, PyObject *args, PyObject *kwargs)
{
    PyObject *produce, *reports, *message_class, *slow, *rejected;
    static char *keywords[] = {"produce", "reports", "message_class", "slow", "rejected", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OOO:Sender", keywords, &produce,
                                     &ReportsType, &reports, &message_class, &slow, &rejected))
        return -1;
    if (!PyCallable_Check(produce) || !PyCallable_Check(slow) || !PyCallable_Check(rejected)) {
        PyErr_SetString(PyExc_TypeError, "Sender: produce, slow and rejected must be callable");
        return -1;
    }
    if (slots_class(message_class, message_fields, M_FIELDS, self->at, "_creports.c") < 0)
        return -1;
    Py_XSETREF(self->produce, Py_NewRef(produce));
    Py_XSETREF(self->reports, (Reports *)Py_NewRef(reports));
    Py_XSETREF(self->message_class, Py_NewRef(message_class));
    Py_XSETREF(self->slow, Py_NewRef(slow));
    Py_XSETREF(self->rejected, Py_NewRef(rejected));
    Py_XSETREF(self->zero, PyLong_FromLong(0));
    return self->zero == NULL ? -1 : 0;
}

static PyObject *sender_get_produce(Sender *self, void *closure)
{
    return Py_NewRef(self->produce != NULL ? self->produce : Py_None);
}

static int sender_set_produce(Sender *self, PyObject *value, void *closure)
{
    if (value == NULL || !PyCallable_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "Sender.produce must be callable");
        return -1;
    }
    Py_SETREF(self->produce, Py_NewRef(value));
    return 0;
}

/* slow and rejected are bound methods of the sink that holds this: a cycle. */
static int sender_traverse(Sender *self, visitproc visit, void *arg)
{
    Py_VISIT(self->produce);
    Py_VISIT(self->reports);
    Py_VISIT(self->message_class);
    Py_VISIT(self->slow);
    Py_VISIT(self->rejected);
    return 0;
}

static int sender_clear(Sender *self)
{
    Py_CLEAR(self->produce);
    Py_CLEAR(self->reports);
    Py_CLEAR(self->message_class);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->rejected);
    Py_CLEAR(self->zero);
    return 0;
}

static void sender_dealloc(Sender *self)
{
    PyObject_GC_UnTrack(self);
    sender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(send_doc,
"send(message, token, /)\n--\n\n"
"Queue ``message`` with the callback of ``token``, as KafkaSink.produce does.");

static PyMethodDef sender_methods[] = {
    {"send", (PyCFunction)(void (*)(void))sender_send, METH_FASTCALL, send_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef sender_getset[] = {
    {"produce", (getter)sender_get_produce, (setter)sender_set_produce,
     "What send() calls: the producer's produce, or what raises once the sink is closed.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc_relay.sink.kafka._creports.Sender",
    .tp_doc = PyDoc_STR("Sender(produce, reports, message_class, slow, rejected): "
                        "KafkaSink.produce in C (docs/design.md, \"The compiled delivery "
                        "report\")."),
    .tp_basicsize = sizeof(Sender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sender_init,
    .tp_dealloc = (destructor)sender_dealloc,
    .tp_traverse = (traverseproc)sender_traverse,
    .tp_clear = (inquiry)sender_clear,
    .tp_methods = sender_methods,
    .tp_getset = sender_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_creports",
    .m_doc = "The compiled delivery reports of cdc_relay.sink.kafka.sink (see Reports).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__creports(void)
{
    if (PyType_Ready(&ReportType) < 0 || PyType_Ready(&ReportsType) < 0
        || PyType_Ready(&SenderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddObjectRef(m, "Reports", (PyObject *)&ReportsType) < 0
                      || PyModule_AddObjectRef(m, "Sender", (PyObject *)&SenderType) < 0
                      || slots_export(m, "MESSAGE_FIELDS", message_fields, M_FIELDS) < 0))
        Py_CLEAR(m);
    return m;
}
