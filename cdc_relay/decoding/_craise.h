/* The exception a compiled path hands to Python code to word (docs/design.md, "The
 * compiled delivery report" and "The compiled reader").
 *
 * Owns, for _creports.c and _cstream.c (included after Python.h): raise_through(handler),
 * which takes the exception being raised and calls ``handler(exception)``, Python code
 * that raises the error the caller should see. A handler that returns instead leaves the
 * original exception standing.
 *
 * Must not: look at the exception (the handler decides), or swallow it.
 */
#ifndef CDC_RELAY_CRAISE_H
#define CDC_RELAY_CRAISE_H

/* The exception being raised, taken (a new reference; the error indicator is cleared). */
static PyObject *take_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL && value != NULL)
        PyException_SetTraceback(value, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return value;
#endif
}

/* Pass the exception being raised to ``handler``; always NULL, with an exception set. */
static PyObject *raise_through(PyObject *handler)
{
    PyObject *exc = take_exception();
    PyObject *result = PyObject_CallOneArg(handler, exc);
    if (result != NULL) { /* the handler must raise: if it did not, the original stands */
        Py_DECREF(result);
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    }
    Py_DECREF(exc);
    return NULL;
}

#endif
