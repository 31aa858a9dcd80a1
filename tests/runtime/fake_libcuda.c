/* A stand-in for the CUDA driver, for testing and timing minicomp's launch path on the CPU.
 * It keeps what the last launch was given; a launch from a thread without a current context
 * fails the way the driver does. */
#include <stdint.h>
#include <string.h>

typedef int CUresult;
enum { OK = 0, INVALID_VALUE = 1, INVALID_CONTEXT = 201, NOT_FOUND = 500 };

static __thread void *current;
static int param_count;
static uint64_t last_params[32];
static unsigned last_dims[7];
static void *last_stream, *last_function;
static long launches;

CUresult cuInit(unsigned flags) { return flags == 0 ? OK : INVALID_VALUE; }
CUresult cuDriverGetVersion(int *version) { *version = 13010; return OK; }
CUresult cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return OK; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    *ctx = (void *)(uintptr_t)(0x1000 + dev);
    return OK;
}
CUresult cuCtxGetCurrent(void **ctx) { *ctx = current; return OK; }
CUresult cuCtxSetCurrent(void *ctx) { current = ctx; return OK; }
CUresult cuModuleLoadData(void **module, const void *image) {
    if (!current) return INVALID_CONTEXT;
    *module = (void *)image;
    return OK;
}
CUresult cuModuleGetFunction(void **fn, void *module, const char *name) {
    (void)module;
    if (strncmp(name, "k", 1) != 0) return NOT_FOUND;  /* minicomp's kernels are k<N>_... */
    *fn = (void *)(uintptr_t)(0x2000 + strlen(name));
    return OK;
}
CUresult cuModuleUnload(void *module) { (void)module; return OK; }
CUresult cuFuncGetAttribute(int *value, int attribute, void *fn) {
    (void)attribute; (void)fn;
    *value = 1024;
    return OK;
}
CUresult cuFuncSetAttribute(void *fn, int attribute, int value) {
    (void)fn; (void)attribute; (void)value;
    return OK;
}
CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned smem, void *stream, void **params,
                        void **extra) {
    if (!current) return INVALID_CONTEXT;
    if (extra || gx == 0 || bx == 0 || bx * by * bz > 1024) return INVALID_VALUE;
    unsigned dims[7] = {gx, gy, gz, bx, by, bz, smem};
    memcpy(last_dims, dims, sizeof dims);
    for (int i = 0; i < param_count; i++) memcpy(&last_params[i], params[i], 8);
    last_function = fn;
    last_stream = stream;
    launches++;
    return OK;
}
CUresult cuGetErrorName(CUresult code, const char **text) {
    *text = code == INVALID_CONTEXT ? "CUDA_ERROR_INVALID_CONTEXT" : "CUDA_ERROR_FAKE";
    return OK;
}
CUresult cuGetErrorString(CUresult code, const char **text) {
    *text = code == INVALID_CONTEXT ? "invalid device context" : "an error of the fake driver";
    return OK;
}

/* For the test: how many 8-byte parameters to keep, and what the last launch got. */
void fake_keep_params(int n) { param_count = n; }
uint64_t fake_param(int i) { return last_params[i]; }
unsigned fake_dim(int i) { return last_dims[i]; }
void *fake_stream(void) { return last_stream; }
long fake_launches(void) { return launches; }
