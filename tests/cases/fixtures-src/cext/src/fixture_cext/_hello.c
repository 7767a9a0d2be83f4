#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef CEXT_GREETING
#error "CEXT_GREETING is not defined: the build flags did not reach the compiler"
#endif

static PyObject *add(PyObject *self, PyObject *args) {
    long a, b;
    if (!PyArg_ParseTuple(args, "ll", &a, &b)) return NULL;
    return PyLong_FromLong(a + b);
}

static PyObject *greeting(PyObject *self, PyObject *noargs) {
    return PyUnicode_FromString(CEXT_GREETING);
}

static PyMethodDef methods[] = {
    {"add", add, METH_VARARGS, "a + b"},
    {"greeting", greeting, METH_NOARGS, "the CEXT_GREETING the build was given"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hello", NULL, -1, methods};

PyMODINIT_FUNC PyInit__hello(void) { return PyModule_Create(&module); }
