/* The Kafka sink's delivery reports, compiled (docs/design.md, "The compiled delivery
 * report").
 *
 * Owns: Reports, one per KafkaSink, and the callback it hands out per message
 * (``Reports.callback(token)``), which confluent-kafka calls with (error, message) once
 * the broker answered. A success goes straight to the handler the sink points at when the
 * report is served - ``handler(token, None)`` - and is counted in ``delivered``; a failure
 * goes to ``failure(token, error, message)``, the sink's Python code, which classifies
 * it. That is what cdc_relay.sink.kafka.Reports, the pure twin, does, without a Python
 * frame and a functools.partial per report.
 *
 * Must not: look into a failure (the sink classifies it), keep the handler a message had
 * when it was produced (a session that has ended must get no report: the sink points
 * ``handler`` elsewhere), or do anything else per success.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

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
    Py_ssize_t delivered; /* successes handed to a handler */
} Reports;

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
    /* call[0] is spare, so a bound method handler can put its self there */
    PyObject *call[4] = {NULL, self->token, Py_None, NULL}, *target, *result;
    size_t count = 2;
    if (args[0] == Py_None) {
        owner->delivered++;
        target = Py_NewRef(owner->handler); /* the handler may point the sink elsewhere */
    }
    else {
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
    .tp_name = "cdc_relay.sink._creports.Report",
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
    self->delivered = 0;
    return 0;
}

static PyObject *reports_get_handler(Reports *self, void *closure)
{
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

/* The handler is usually a bound method of a session that holds the sink that holds
 * this: a cycle, which the garbage collector must be able to see and break. */
static int reports_traverse(Reports *self, visitproc visit, void *arg)
{
    Py_VISIT(self->handler);
    Py_VISIT(self->failure);
    return 0;
}

static int reports_clear(Reports *self)
{
    Py_CLEAR(self->handler);
    Py_CLEAR(self->failure);
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
    {NULL, NULL, 0, NULL},
};

static PyMemberDef reports_members[] = {
    {"failure", Py_T_OBJECT_EX, offsetof(Reports, failure), Py_READONLY,
     "failure(token, error, message): what a failed report is handed to."},
    {"delivered", Py_T_PYSSIZET, offsetof(Reports, delivered), 0,
     "How many successes were handed to a handler (the sink counts its failures in)."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef reports_getset[] = {
    {"handler", (getter)reports_get_handler, (setter)reports_set_handler,
     "handler(token, None): what a success is handed to, when its report is served.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ReportsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc_relay.sink._creports.Reports",
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

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_creports",
    .m_doc = "The compiled delivery reports of cdc_relay.sink.kafka (see Reports).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__creports(void)
{
    if (PyType_Ready(&ReportType) < 0 || PyType_Ready(&ReportsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "Reports", (PyObject *)&ReportsType) < 0)
        Py_CLEAR(m);
    return m;
}
