/* fastload core: the resample kernel's source text (see resample_kernel.h).
 *
 * setup.py writes fl_resample_kernel_text.h into the build folder (and puts
 * that folder on the include path) from core/cuda/kernels/resample.cu: the
 * file's text as string literals, one a line, named
 * FL_RESAMPLE_KERNEL_TEXT.  Generated rather than kept by hand, so the
 * string cannot drift from the file gcc compiles as the host reference. */
#include "core/cuda/resample_kernel.h"

#include <fl_resample_kernel_text.h>

const char fl_resample_kernel_source[] = FL_RESAMPLE_KERNEL_TEXT;
