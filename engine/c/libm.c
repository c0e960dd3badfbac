/* engine._libm: the C library's float functions applied to whole float32 buffers.
 *
 * ggml's CPU kernels call the C library (expf, tanhf, erff, ...) one element at a time. numpy's
 * float32 ufuncs do not: they pick a SIMD implementation at run time (AVX-512, AVX2, baseline),
 * each rounding its last bit its own way, so their results depend on the CPU. This module calls
 * the very functions ggml calls, one element at a time, so the engine gets ggml's bits on every
 * CPU that runs ggml's AVX2 build. The loops run without the GIL.
 *
 * Built without -ffast-math and without loop vectorisation, so the compiler keeps one scalar
 * libm call per element (never glibc's vector variants).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

typedef float (*unary_fn)(float);
typedef float (*binary_fn)(float, float);

static float call_expf(float x) { return expf(x); }
static float call_expm1f(float x) { return expm1f(x); }
static float call_logf(float x) { return logf(x); }
static float call_log1pf(float x) { return log1pf(x); }
static float call_log2f(float x) { return log2f(x); }
static float call_sinf(float x) { return sinf(x); }
static float call_cosf(float x) { return cosf(x); }
static float call_tanhf(float x) { return tanhf(x); }
static float call_erff(float x) { return erff(x); }
static float call_powf(float x, float y) { return powf(x, y); }

/* check that `in` holds n floats and `out` room for n floats; returns n or -1 */
static Py_ssize_t float_count(Py_buffer *in, Py_buffer *out)
{
    if (in->len % (Py_ssize_t)sizeof(float) != 0 || in->len != out->len) {
        PyErr_SetString(PyExc_ValueError,
                        "_libm: source and destination must be float32 buffers of equal size");
        return -1;
    }
    return in->len / (Py_ssize_t)sizeof(float);
}

static PyObject *apply_unary(PyObject *args, unary_fn fn)
{
    Py_buffer in, out;
    if (!PyArg_ParseTuple(args, "y*w*", &in, &out))
        return NULL;
    Py_ssize_t n = float_count(&in, &out);
    if (n >= 0) {
        const float *x = (const float *)in.buf;
        float *y = (float *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = fn(x[i]);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    if (n < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *apply_binary(PyObject *args, binary_fn fn)
{
    Py_buffer a, b, out;
    if (!PyArg_ParseTuple(args, "y*y*w*", &a, &b, &out))
        return NULL;
    Py_ssize_t n = float_count(&a, &out);
    if (n >= 0 && b.len != a.len) {
        PyErr_SetString(PyExc_ValueError, "_libm: both operands must have the same size");
        n = -1;
    }
    if (n >= 0) {
        const float *x = (const float *)a.buf, *z = (const float *)b.buf;
        float *y = (float *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = fn(x[i], z[i]);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&out);
    if (n < 0)
        return NULL;
    Py_RETURN_NONE;
}

#define UNARY(name) \
    static PyObject *py_##name(PyObject *self, PyObject *args) \
    { (void)self; return apply_unary(args, call_##name); }

UNARY(expf)
UNARY(expm1f)
UNARY(logf)
UNARY(log1pf)
UNARY(log2f)
UNARY(sinf)
UNARY(cosf)
UNARY(tanhf)
UNARY(erff)

static PyObject *py_powf(PyObject *self, PyObject *args)
{
    (void)self;
    return apply_binary(args, call_powf);
}

#define DOC_UNARY "(src, dst): dst[i] = f(src[i]) for float32 buffers of equal size"

static PyMethodDef methods[] = {
    {"expf", py_expf, METH_VARARGS, "expf" DOC_UNARY},
    {"expm1f", py_expm1f, METH_VARARGS, "expm1f" DOC_UNARY},
    {"logf", py_logf, METH_VARARGS, "logf" DOC_UNARY},
    {"log1pf", py_log1pf, METH_VARARGS, "log1pf" DOC_UNARY},
    {"log2f", py_log2f, METH_VARARGS, "log2f" DOC_UNARY},
    {"sinf", py_sinf, METH_VARARGS, "sinf" DOC_UNARY},
    {"cosf", py_cosf, METH_VARARGS, "cosf" DOC_UNARY},
    {"tanhf", py_tanhf, METH_VARARGS, "tanhf" DOC_UNARY},
    {"erff", py_erff, METH_VARARGS, "erff" DOC_UNARY},
    {"powf", py_powf, METH_VARARGS, "powf(a, b, dst): dst[i] = powf(a[i], b[i])"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_libm",
    "The C library's float functions over float32 buffers, one call per element, as ggml calls "
    "them.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__libm(void) { return PyModule_Create(&module); }
