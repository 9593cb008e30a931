/* Filling and reading a slots dataclass straight from C (docs/design.md, "The compiled
 * decoders").
 *
 * Owns, for _coutbox.h (the OutboxEvent the decoders build) and _croute.c (the Message
 * the router builds, from the OutboxEvent it reads): the field lists of those two classes
 * of cdc_relay/model.py, in declaration order (the one place C mirrors them), the check
 * that a class is a slots
 * dataclass of exactly the given fields, in that order, that object.__new__ creates and
 * no __post_init__ completes (slots_class), and where each field's slot lies in an
 * instance (slot_offset). An instance allocated as object.__new__ does and given every
 * slot is then the object the dataclass' __init__ would have made, with no Python code run.
 *
 * Must not: accept a class with a field more, less or reordered (a slot left unset would
 * raise AttributeError far from here): the caller names itself in the error, so a field
 * added in cdc_relay/model.py points at the C code to change with it.
 */
#ifndef CDC_RELAY_CSLOTS_H
#define CDC_RELAY_CSLOTS_H

#ifndef Py_T_OBJECT_EX /* before Python 3.12 the member flags are in structmember.h */
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#endif

/* OutboxEvent's fields, in declaration order (cdc_relay/model.py). */
enum {
    EV_ID, EV_AGGREGATE_TYPE, EV_AGGREGATE_ID, EV_EVENT_TYPE, EV_PAYLOAD, EV_CREATED_AT_MS,
    EV_LSN, EV_ATTEMPT, EV_EXTRA, EV_TRACEPARENT, EV_TRACESTATE, EV_FIELDS
};

static const char *const outbox_fields[EV_FIELDS] = {
    "id", "aggregate_type", "aggregate_id", "event_type", "payload", "created_at_ms", "lsn",
    "attempt", "extra", "traceparent", "tracestate",
};

/* Message's fields, in declaration order (cdc_relay/model.py). */
enum { M_TOPIC, M_KEY, M_VALUE, M_HEADERS, M_TIMESTAMP_MS, M_PARTITION, M_FIELDS };

static const char *const message_fields[M_FIELDS] = {
    "topic", "key", "value", "headers", "timestamp_ms", "partition",
};

/* The offset in an instance of ``type``'s own writable object slot ``name``, or -1 with
 * TypeError. */
static Py_ssize_t slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *descr = PyDict_GetItemString(type->tp_dict, name); /* borrowed */
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)
        || ((PyDescrObject *)descr)->d_type != type) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a slot of its own", type->tp_name, name);
        return -1;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != Py_T_OBJECT_EX || (member->flags & Py_READONLY)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a writable object slot", type->tp_name,
                     name);
        return -1;
    }
    return member->offset;
}

/* ``fields`` as a tuple of str (a new reference), or NULL. */
static PyObject *field_names(const char *const *fields, int count)
{
    PyObject *names = PyTuple_New(count);
    if (names == NULL)
        return NULL;
    for (int k = 0; k < count; k++) {
        PyObject *name = PyUnicode_FromString(fields[k]);
        if (name == NULL) {
            Py_DECREF(names);
            return NULL;
        }
        PyTuple_SET_ITEM(names, k, name);
    }
    return names;
}

/* Check that ``cls`` is the slots dataclass of exactly ``fields`` (``count`` of them, in
 * order) and put each one's slot offset into ``offset``: 0, or -1 with TypeError naming
 * ``owner``, the C code that must change with the class. */
static int slots_class(PyObject *cls, const char *const *fields, int count, Py_ssize_t *offset,
                       const char *owner)
{
    if (!PyType_Check(cls)) {
        PyErr_Format(PyExc_TypeError, "%s needs a class, not %.100s", owner,
                     Py_TYPE(cls)->tp_name);
        return -1;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    /* a dataclass is a heap type; a static one (object, int ...) has no tp_dict on 3.12+ */
    if (!(type->tp_flags & Py_TPFLAGS_HEAPTYPE) || type->tp_dict == NULL) {
        PyErr_Format(PyExc_TypeError, "%s needs a dataclass, not the built-in %s", owner,
                     type->tp_name);
        return -1;
    }
    PyObject *expected = field_names(fields, count), *slots;
    if (expected == NULL)
        return -1;
    slots = PyDict_GetItemString(type->tp_dict, "__slots__"); /* borrowed */
    int same = slots == NULL ? 0 : PyObject_RichCompareBool(slots, expected, Py_EQ);
    Py_DECREF(expected);
    if (same < 0)
        return -1;
    /* exactly these slots on a plain object base, no instance dict, object's __new__, and
     * no __post_init__ that dataclass' __init__ would run */
    if (!same || type->tp_base != &PyBaseObject_Type || type->tp_dictoffset != 0
        || type->tp_new != PyBaseObject_Type.tp_new
        || PyDict_GetItemString(type->tp_dict, "__post_init__") != NULL) {
        PyErr_Format(PyExc_TypeError, "%s is not the slots dataclass of the fields %s fills "
                     "(%s ... %s): update %s with cdc_relay/model.py", type->tp_name, owner,
                     fields[0], fields[count - 1], owner);
        return -1;
    }
    for (int k = 0; k < count; k++)
        if ((offset[k] = slot_offset(type, fields[k])) < 0)
            return -1;
    return 0;
}

/* Add ``fields`` to ``module`` as the tuple ``attr`` (OUTBOX_FIELDS, MESSAGE_FIELDS):
 * cdc_relay/accel.py compares it with cdc_relay/model.py before it uses the module, so a
 * field added there takes the pure path with a warning instead of failing here. 0 or -1. */
static int slots_export(PyObject *module, const char *attr, const char *const *fields,
                        int count)
{
    PyObject *names = field_names(fields, count);
    if (names == NULL)
        return -1;
    int status = PyModule_AddObjectRef(module, attr, names);
    Py_DECREF(names);
    return status;
}

#endif /* CDC_RELAY_CSLOTS_H */
