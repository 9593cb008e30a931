/* placeholder: the compiled fast path of decoding (docs/design.md) */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cwal2json", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__cwal2json(void) { return PyModule_Create(&module); }
