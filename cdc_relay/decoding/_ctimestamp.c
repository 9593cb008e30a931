/* The compiled fast path of TimestampParser (docs/design.md, "The compiled decoders",
 * "Timestamps").
 *
 * Owns one function, epoch_ms(): cdc_relay/decoding/values.py's created_at parse for a str,
 * by _ctimestamp.h's ts_epoch_ms (the shapes it reads, and why, are described there; the
 * compiled decoders include the same header and parse their rows' created_at bytes
 * themselves).
 *
 * Must not: raise for any text, word an error, or accept a shape the pure path might read
 * differently. Everything else (infinity, BC, 5-digit years, a 'T', 'Z', offsets without
 * colons, 7+ fractional digits, trailing text, non-ASCII) returns None, and the pure path
 * then decides: None for infinity, its ValueError and hint for the rest.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_ctimestamp.h"

PyDoc_STRVAR(epoch_ms_doc,
"epoch_ms(text, /)\n--\n\n"
"The epoch milliseconds (floor-rounded) of a timestamp in PostgreSQL's ISO output\n"
"shape, or None: not a shape this function reads, let the pure parser decide.");

static PyObject *epoch_ms(PyObject *module, PyObject *text) {
    if (!PyUnicode_Check(text)) Py_RETURN_NONE;
    Py_ssize_t len;
    /* A compact ASCII str hands out its own buffer; any other str fails below anyway. */
    const char *s = PyUnicode_AsUTF8AndSize(text, &len);
    if (s == NULL) { /* lone surrogates: not a timestamp this function reads */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int64_t ms;
    if (ts_epoch_ms(s, len, &ms) < 0) Py_RETURN_NONE;
    return PyLong_FromLongLong((long long)ms);
}

static PyMethodDef methods[] = {
    {"epoch_ms", epoch_ms, METH_O, epoch_ms_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_ctimestamp",
    .m_doc = "The compiled fast path of cdc_relay.decoding.values.TimestampParser (epoch_ms).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__ctimestamp(void) { return PyModule_Create(&module); }
