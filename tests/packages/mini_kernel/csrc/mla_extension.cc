#include <Python.h>
extern "C" const void* mla_kernel_address();
static PyMethodDef methods[] = {{nullptr, nullptr, 0, nullptr}};
static PyModuleDef module = {PyModuleDef_HEAD_INIT, "flashmla_ops", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_flashmla_ops(void) { (void)mla_kernel_address(); return PyModule_Create(&module); }
