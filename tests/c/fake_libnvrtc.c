/* A stand-in for libnvrtc, so the tests can exercise fastload's run-time
 * NVRTC loading and kernel compilation (csrc/core/cuda/nvrtc.c) without a
 * GPU.  "Compiling" a source writes a text the fake driver
 * (tests/c/fake_libcuda.c) accepts as PTX: a "// fake PTX" line, the
 * target architecture, and one ".visible .entry NAME(" line per
 * `__global__` function of the source.  A source holding "#error" fails to
 * compile, with a log naming the program and the line.  The options of the
 * last compile are kept for the tests (fake_nvrtc_last_options).
 *
 * FAKE_NVRTC_VERSION: "major.minor" nvrtcVersion reports (default "12.4").
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvrtcResult;

typedef struct {
    char *source;
    char *name;
    char *ptx;
    char *log;
} program;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char last_options[1024]; /* guarded by lock: one option a line */
static long long compiles;      /* guarded by lock */

/* The options of the last nvrtcCompileProgram, one a line, into `out`;
 * returns the number of compiles so far. */
long long fake_nvrtc_last_options(char *out, int size)
{
    pthread_mutex_lock(&lock);
    snprintf(out, (size_t)size, "%s", last_options);
    long long n = compiles;
    pthread_mutex_unlock(&lock);
    return n;
}

const char *nvrtcGetErrorString(nvrtcResult result)
{
    switch (result) {
    case 0: return "NVRTC_SUCCESS";
    case 1: return "NVRTC_ERROR_OUT_OF_MEMORY";
    case 3: return "NVRTC_ERROR_INVALID_INPUT";
    case 4: return "NVRTC_ERROR_INVALID_PROGRAM";
    case 5: return "NVRTC_ERROR_INVALID_OPTION";
    case 6: return "NVRTC_ERROR_COMPILATION";
    default: return "NVRTC_ERROR unknown";
    }
}

nvrtcResult nvrtcVersion(int *major, int *minor)
{
    const char *v = getenv("FAKE_NVRTC_VERSION");
    *major = 12;
    *minor = 4;
    if (v && *v && sscanf(v, "%d.%d", major, minor) != 2)
        return 3;
    return 0;
}

static char *copy(const char *text)
{
    char *out = malloc(strlen(text) + 1);
    if (out)
        strcpy(out, text);
    return out;
}

nvrtcResult nvrtcCreateProgram(void **out, const char *source, const char *name, int headers,
                               const char *const *header_sources, const char *const *names)
{
    (void)header_sources;
    (void)names;
    if (!out || !source || headers != 0)
        return 3;
    program *p = calloc(1, sizeof *p);
    if (!p || !(p->source = copy(source)) || !(p->name = copy(name ? name : "default_program"))) {
        if (p)
            free(p->source);
        free(p);
        return 1;
    }
    *out = p;
    return 0;
}

nvrtcResult nvrtcDestroyProgram(void **handle)
{
    program *p = *handle;
    if (!p)
        return 4;
    free(p->source);
    free(p->name);
    free(p->ptx);
    free(p->log);
    free(p);
    *handle = NULL;
    return 0;
}

nvrtcResult nvrtcCompileProgram(void *handle, int count, const char *const *options)
{
    program *p = handle;
    const char *arch = "compute_52";
    pthread_mutex_lock(&lock);
    compiles++;
    last_options[0] = '\0';
    for (int i = 0; i < count; i++) {
        size_t used = strlen(last_options);
        snprintf(last_options + used, sizeof last_options - used, "%s\n", options[i]);
        if (strncmp(options[i], "--gpu-architecture=", 19) == 0)
            arch = options[i] + 19;
        else if (strcmp(options[i], "--fmad=false") != 0 && strcmp(options[i], "--fmad=true") != 0)
            return pthread_mutex_unlock(&lock), 5; /* NVRTC_ERROR_INVALID_OPTION */
    }
    pthread_mutex_unlock(&lock);
    free(p->ptx);
    free(p->log);
    p->ptx = p->log = NULL;
    const char *error = strstr(p->source, "#error");
    if (error) {
        int line = 1;
        for (const char *c = p->source; c < error; c++)
            line += *c == '\n';
        size_t size = strlen(p->name) + 128;
        if (!(p->log = malloc(size)))
            return 1;
        snprintf(p->log, size, "%s(%d): error: #error directive\n1 error detected\n", p->name,
                 line);
        return 6; /* NVRTC_ERROR_COMPILATION */
    }
    size_t size = strlen(p->source) + 256, used = 0;
    if (!(p->ptx = malloc(size)) || !(p->log = copy("")))
        return 1;
    used += (size_t)snprintf(p->ptx, size, "// fake PTX\n.version 8.4\n.target %s\n", arch);
    for (const char *g = strstr(p->source, "__global__"); g; g = strstr(g + 1, "__global__")) {
        const char *paren = strchr(g, '(');
        if (!paren)
            break;
        const char *end = paren;
        while (end > g && end[-1] == ' ')
            end--;
        const char *start = end;
        while (start > g && (start[-1] == '_' || (start[-1] >= 'a' && start[-1] <= 'z') ||
                             (start[-1] >= 'A' && start[-1] <= 'Z') ||
                             (start[-1] >= '0' && start[-1] <= '9')))
            start--;
        used += (size_t)snprintf(p->ptx + used, size - used, ".visible .entry %.*s(\n",
                                 (int)(end - start), start);
    }
    return 0;
}

nvrtcResult nvrtcGetPTXSize(void *handle, size_t *size)
{
    program *p = handle;
    if (!p->ptx)
        return 4;
    *size = strlen(p->ptx) + 1;
    return 0;
}

nvrtcResult nvrtcGetPTX(void *handle, char *out)
{
    program *p = handle;
    if (!p->ptx)
        return 4;
    strcpy(out, p->ptx);
    return 0;
}

nvrtcResult nvrtcGetProgramLogSize(void *handle, size_t *size)
{
    program *p = handle;
    *size = (p->log ? strlen(p->log) : 0) + 1;
    return 0;
}

nvrtcResult nvrtcGetProgramLog(void *handle, char *out)
{
    program *p = handle;
    strcpy(out, p->log ? p->log : "");
    return 0;
}
