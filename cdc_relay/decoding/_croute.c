/* The compiled fast path of cdc_relay.routing.Router (docs/design.md, "The compiled
 * router").
 *
 * Owns: Route, whose ``route`` the Router installs as its own when the configuration
 * allows it (the raw message format, no --header and no --partition-column columns). For
 * an OutboxEvent without trace context whose (aggregate_type, event_type) the Router's
 * cache already holds with a legal topic, and whose id and aggregate_id are UTF-8
 * encodable, it builds the Message the Python route builds - the cached topic, the key
 * (aggregate_id as UTF-8), the value (the payload as it is), the headers [("id", id as
 * UTF-8), the cached event_type and aggregate_type headers], the timestamp
 * (created_at_ms), no partition - into the Message's slots directly (_cslots.h), so no
 * Python code runs per event. Every other event is handed to the Python route it was
 * given (``fallback``), which resolves and caches the pair and raises RoutingError.
 *
 * Must not: decide anything the Python route decides (whatever is not the plain case
 * goes to it), change the Router's cache, or build a Message the Python route would not:
 * the tests route every case both ways and compare.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_cslots.h"

typedef struct {
    PyObject_HEAD
    PyObject *cache;              /* the Router's: aggregate_type -> {event_type -> route} */
    PyObject *fallback;           /* the Python route */
    PyTypeObject *event;          /* OutboxEvent */
    Py_ssize_t event_offset[EV_FIELDS];
    PyTypeObject *message;        /* Message */
    Py_ssize_t message_offset[M_FIELDS];
    PyObject *id_name;            /* "id", the first header's name */
} Route;

#define FIELD(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* ``text`` as UTF-8 bytes, or NULL: with an exception set on a real error, without one
 * when it cannot be encoded (lone surrogates: the Python route raises RoutingError). */
static PyObject *utf8(PyObject *text)
{
    PyObject *data = PyUnicode_AsUTF8String(text);
    if (data == NULL && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
        PyErr_Clear();
    return data;
}

/* The cached (topic, None, event_type header, aggregate_type header) of the event's pair,
 * borrowed; NULL (no exception) when the Python route must decide. */
static PyObject *cached(Route *self, PyObject *aggregate_type, PyObject *event_type)
{
    PyObject *inner = PyDict_GetItemWithError(self->cache, aggregate_type);
    if (inner == NULL || !PyDict_CheckExact(inner))
        return NULL;
    PyObject *entry = PyDict_GetItemWithError(inner, event_type);
    if (entry == NULL || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 4
        || PyTuple_GET_ITEM(entry, 1) != Py_None)
        return NULL;
    return entry;
}

PyDoc_STRVAR(route_doc,
"route(event, /)\n--\n\n"
"The Message of ``event``, exactly as the Python route builds it; the Python route's\n"
"answer (or exception) for everything but the plain case.");

/* The Message of the plain case, from the event's texts and the cached ``entry`` (all
 * strong references the caller holds: an allocation here may run the garbage collector,
 * and a finalizer may change the event's slots or clear the cache). NULL with no exception
 * set when the Python route must decide (a text that is not UTF-8 encodable). */
static PyObject *plain_message(Route *self, PyObject *const *f, PyObject *entry)
{
    PyObject *key = utf8(f[EV_AGGREGATE_ID]), *id = NULL, *id_header = NULL, *headers = NULL;
    if (key == NULL || (id = utf8(f[EV_ID])) == NULL) {
        Py_XDECREF(key);
        return NULL;
    }
    if ((id_header = PyTuple_Pack(2, self->id_name, id)) == NULL
        || (headers = PyList_New(3)) == NULL)
        goto error;
    PyList_SET_ITEM(headers, 0, id_header);
    id_header = NULL;
    PyList_SET_ITEM(headers, 1, Py_NewRef(PyTuple_GET_ITEM(entry, 2)));
    PyList_SET_ITEM(headers, 2, Py_NewRef(PyTuple_GET_ITEM(entry, 3)));
    PyObject *message = self->message->tp_alloc(self->message, 0); /* as object.__new__ */
    if (message == NULL)
        goto error;
    Py_DECREF(id);
    const Py_ssize_t *at = self->message_offset;
    FIELD(message, at[M_TOPIC]) = Py_NewRef(PyTuple_GET_ITEM(entry, 0));
    FIELD(message, at[M_KEY]) = key;
    FIELD(message, at[M_VALUE]) = Py_NewRef(f[EV_PAYLOAD]);
    FIELD(message, at[M_HEADERS]) = headers;
    FIELD(message, at[M_TIMESTAMP_MS]) = Py_NewRef(f[EV_CREATED_AT_MS]);
    FIELD(message, at[M_PARTITION]) = Py_NewRef(Py_None);
    return message;
error:
    Py_DECREF(key);
    Py_XDECREF(id);
    Py_XDECREF(id_header);
    Py_XDECREF(headers);
    return NULL;
}

/* The event's fields plain_message reads. */
enum { USED = 4 };
static const int used_fields[USED] = {EV_ID, EV_AGGREGATE_ID, EV_PAYLOAD, EV_CREATED_AT_MS};

static PyObject *route_route(Route *self, PyObject *event)
{
    if (self->fallback == NULL) { /* Route.__new__ without __init__, or cleared */
        PyErr_SetString(PyExc_TypeError, "Route is not initialised");
        return NULL;
    }
    if (!Py_IS_TYPE(event, self->event))
        return PyObject_CallOneArg(self->fallback, event);
    PyObject *f[EV_FIELDS];
    for (int k = 0; k < EV_FIELDS; k++)
        if ((f[k] = FIELD(event, self->event_offset[k])) == NULL) /* unset: let Python say */
            return PyObject_CallOneArg(self->fallback, event);
    if (f[EV_TRACEPARENT] != Py_None || !PyTuple_CheckExact(f[EV_EXTRA])
        || PyTuple_GET_SIZE(f[EV_EXTRA]) != 0 || !PyUnicode_CheckExact(f[EV_AGGREGATE_TYPE])
        || !PyUnicode_CheckExact(f[EV_EVENT_TYPE]) || !PyUnicode_CheckExact(f[EV_ID])
        || !PyUnicode_CheckExact(f[EV_AGGREGATE_ID]))
        return PyObject_CallOneArg(self->fallback, event);
    PyObject *entry = cached(self, f[EV_AGGREGATE_TYPE], f[EV_EVENT_TYPE]);
    if (entry == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_CallOneArg(self->fallback, event);
    }
    /* from here on allocations happen: hold what they read */
    Py_INCREF(entry);
    for (int k = 0; k < USED; k++)
        Py_INCREF(f[used_fields[k]]);
    PyObject *message = plain_message(self, f, entry);
    for (int k = 0; k < USED; k++)
        Py_DECREF(f[used_fields[k]]);
    Py_DECREF(entry);
    if (message != NULL || PyErr_Occurred())
        return message;
    return PyObject_CallOneArg(self->fallback, event);
}

static int route_init(Route *self, PyObject *args, PyObject *kwargs)
{
    PyObject *cache, *fallback, *event_class, *message_class;
    static char *keywords[] = {"cache", "fallback", "event_class", "message_class", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOO:Route", keywords, &PyDict_Type,
                                     &cache, &fallback, &event_class, &message_class))
        return -1;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "Route: fallback must be callable (the Python route)");
        return -1;
    }
    if (slots_class(event_class, outbox_fields, EV_FIELDS, self->event_offset, "_croute.c") < 0
        || slots_class(message_class, message_fields, M_FIELDS, self->message_offset,
                       "_croute.c") < 0)
        return -1;
    PyObject *id_name = PyUnicode_InternFromString("id");
    if (id_name == NULL)
        return -1;
    Py_XSETREF(self->id_name, id_name);
    Py_XSETREF(self->cache, Py_NewRef(cache));
    Py_XSETREF(self->fallback, Py_NewRef(fallback));
    Py_XSETREF(self->event, (PyTypeObject *)Py_NewRef(event_class));
    Py_XSETREF(self->message, (PyTypeObject *)Py_NewRef(message_class));
    return 0;
}

/* The fallback is a bound method of the Router that holds this Route's ``route``: a
 * cycle, which the garbage collector must be able to see and break. */
static int route_traverse(Route *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cache);
    Py_VISIT(self->fallback);
    Py_VISIT(self->event);
    Py_VISIT(self->message);
    return 0;
}

static int route_clear(Route *self)
{ /* route() refuses once fallback is NULL */
    Py_CLEAR(self->cache);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->event);
    Py_CLEAR(self->message);
    Py_CLEAR(self->id_name);
    return 0;
}

static void route_dealloc(Route *self)
{
    PyObject_GC_UnTrack(self);
    route_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef route_methods[] = {
    {"route", (PyCFunction)route_route, METH_O, route_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RouteType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc_relay.decoding._croute.Route",
    .tp_doc = PyDoc_STR("Route(cache, fallback, event_class, message_class): the Router's "
                        "per-event common case (docs/design.md, \"The compiled router\")."),
    .tp_basicsize = sizeof(Route),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)route_init,
    .tp_dealloc = (destructor)route_dealloc,
    .tp_traverse = (traverseproc)route_traverse,
    .tp_clear = (inquiry)route_clear,
    .tp_methods = route_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_croute",
    .m_doc = "The compiled fast path of cdc_relay.routing.Router (see Route.route()).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__croute(void)
{
    if (PyType_Ready(&RouteType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddObjectRef(m, "Route", (PyObject *)&RouteType) < 0
                      || slots_export(m, "OUTBOX_FIELDS", outbox_fields, EV_FIELDS) < 0
                      || slots_export(m, "MESSAGE_FIELDS", message_fields, M_FIELDS) < 0))
        Py_CLEAR(m);
    return m;
}
