// Python module "common_ops": magic() returns a value computed from both dependencies' headers.
#include <Python.h>

extern "C" int mini_magic();
extern "C" const void* mini_kernel_address();

static PyObject* magic(PyObject*, PyObject*) {
  return PyLong_FromLong(mini_kernel_address() != nullptr ? mini_magic() : -1);
}

static PyMethodDef methods[] = {{"magic", magic, METH_NOARGS, "dependency check value"}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef module = {PyModuleDef_HEAD_INIT, "common_ops", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_common_ops(void) { return PyModule_Create(&module); }
