/* fastload._C.build_info(): csrc/core/observe/build_info.c's facts as a dict, for
 * `python -m fastload`. */
#include "bind/fastload.h"

#include "core/observe/build_info.h"
#include "core/source/squashfs_read.h"
#include "core/status.h"

#include <string.h>

int fl__check_image_libraries(void)
{
    char msg[2048];
    int rc = fl_check_image_libraries(msg, sizeof msg);
    if (rc == FL_OK)
        return 0;
    /* The message holds a file name: undecodable bytes survive as os.fsdecode keeps them. */
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "surrogateescape");
    if (text) {
        PyErr_SetObject(rc == FL_ERR_NOMEM ? PyExc_MemoryError : PyExc_ImportError, text);
        Py_DECREF(text);
    }
    return -1;
}

PyObject *fl__build_info(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    const char *features[8];
    int n_features = fl_cpu_simd_features(features, (int)(sizeof features / sizeof *features));
    const char *path = fl_libjpeg_path();
    PyObject *simd = NULL, *info = NULL;

    simd = PyTuple_New(n_features);
    if (!simd)
        goto error;
    for (int i = 0; i < n_features; i++) {
        PyObject *name = PyUnicode_FromString(features[i]);
        if (!name)
            goto error;
        PyTuple_SET_ITEM(simd, i, name); /* steals the reference */
    }
    /* The path is a file name from the loader: decode it as os.fsdecode would. */
    info = Py_BuildValue("{s:i, s:l, s:O, s:N, s:O, s:s, s:s, s:i}", "jpeg_lib_version",
                         fl_jpeg_lib_version(), "libjpeg_turbo_version",
                         fl_libjpeg_turbo_version(), "libjpeg_with_simd",
                         fl_libjpeg_with_simd() ? Py_True : Py_False, "libjpeg_path",
                         path ? PyUnicode_DecodeFSDefault(path) : Py_NewRef(Py_None),
                         "cpu_simd_features", simd, "libpng_version", fl_libpng_version(),
                         "libpng_built_version", fl_libpng_built_version(), "libwebp_version",
                         fl_libwebp_version());
    /* Whether libsquashfs was found when fastload was built. */
    if (info && PyDict_SetItemString(info, "squashfs",
                                     fl_sqfs_available() ? Py_True : Py_False) < 0)
        Py_CLEAR(info);
error:
    Py_XDECREF(simd);
    return info;
}
