#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "fixture_gencode.h"

__global__ void scale(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}

extern "C" int fixture_scale(float *x, float a, int n) {
    scale<<<(n + 255) / 256, 256>>>(x, a, n);
    return (int)cudaGetLastError();
}

static PyObject *gencode(PyObject *self, PyObject *noargs) {
    return PyUnicode_FromString(FIXTURE_GENCODE);
}

static PyMethodDef methods[] = {
    {"gencode", gencode, METH_NOARGS, "the -gencode flags nvcc compiled this module with"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernel(void) { return PyModule_Create(&module); }
