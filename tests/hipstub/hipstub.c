/* A recording stand-in for libamdhip64.so, built by tests/conftest.py (fixture hip_stub).
 *
 * It exports the HIP runtime functions gfxasm's ctypes binding calls, with the C signatures
 * of ROCm's include/hip/hip_runtime_api.h, and nothing runs on a GPU. Each call appends one
 * line, "name key=value ...", to the file named by $HIPSTUB_LOG.
 * $HIPSTUB_FAIL = "hipCall:code" makes that call return that hipError_t (and do nothing).
 * hipstub_reset(device) sets the current device; it is not part of HIP.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;                  /* an enum in HIP: passed and returned as int */
enum { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorInvalidImage = 200,
       hipErrorNotFound = 500, hipErrorLaunchFailure = 719 };

struct module { int device; };
struct function { const struct module *module; char name[128]; };

static int current_device;

void hipstub_reset(int device) { current_device = device; }

static void record(const char *format, ...) {
    FILE *log = fopen(getenv("HIPSTUB_LOG"), "a");
    va_list args;
    va_start(args, format);
    vfprintf(log, format, args);
    va_end(args);
    fputc('\n', log);
    fclose(log);
}

static hipError_t failure(const char *call) {
    const char *spec = getenv("HIPSTUB_FAIL");
    size_t n = strlen(call);
    return spec && strncmp(spec, call, n) == 0 && spec[n] == ':' ? atoi(spec + n + 1) : hipSuccess;
}

hipError_t hipGetDevice(int *device) {
    record("hipGetDevice");
    hipError_t error = failure("hipGetDevice");
    if (!error) *device = current_device;
    return error;
}

hipError_t hipSetDevice(int device) {
    record("hipSetDevice device=%d", device);
    hipError_t error = failure("hipSetDevice");
    if (!error) current_device = device;
    return error;
}

/* The runtime is given no size: it reads the ELF header, as this does (section headers end an
 * LLVM-linked object, so shoff + shnum * shentsize is the file size). */
hipError_t hipModuleLoadData(void **module, const void *image) {
    const unsigned char *elf = image;
    uint64_t shoff;
    uint16_t machine, shentsize, shnum;
    memcpy(&machine, elf + 0x12, 2);
    memcpy(&shoff, elf + 0x28, 8);
    memcpy(&shentsize, elf + 0x3a, 2);
    memcpy(&shnum, elf + 0x3c, 2);
    int is_amdgpu = memcmp(elf, "\177ELF", 4) == 0 && machine == 224;   /* EM_AMDGPU */
    record("hipModuleLoadData device=%d amdgpu=%d bytes=%llu", current_device, is_amdgpu,
           (unsigned long long)(shoff + (uint64_t)shnum * shentsize));
    hipError_t error = is_amdgpu ? failure("hipModuleLoadData") : hipErrorInvalidImage;
    if (!error) {
        struct module *loaded = malloc(sizeof *loaded);
        loaded->device = current_device;
        *module = loaded;
    }
    return error;
}

hipError_t hipModuleGetFunction(void **function, void *module, const char *name) {
    const struct module *from = module;
    record("hipModuleGetFunction module=%d name=%s", from->device, name);
    hipError_t error = failure("hipModuleGetFunction");
    if (!error) {
        struct function *found = calloc(1, sizeof *found);
        found->module = from;
        snprintf(found->name, sizeof found->name, "%s", name);
        *function = found;
    }
    return error;
}

/* `extra` is checked as ROCm's clr (hipamd/src/hip_module.cpp) checks it: exactly
 * {BUFFER_POINTER, kernarg, BUFFER_SIZE, &size, END} = markers 1, 2, 3, else hipErrorInvalidValue. */
hipError_t hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    const struct function *function = f;
    if (params || !extra || extra[0] != (void *)1 || extra[2] != (void *)2 || extra[4] != (void *)3) {
        record("hipModuleLaunchKernel malformed=1");
        return hipErrorInvalidValue;
    }
    const unsigned char *kernarg = extra[1];
    size_t size = *(const size_t *)extra[3];
    char *hex = malloc(2 * size + 1);
    hex[0] = '\0';
    for (size_t i = 0; i < size; i++) sprintf(hex + 2 * i, "%02x", kernarg[i]);
    record("hipModuleLaunchKernel device=%d module=%d function=%s grid=%u,%u,%u block=%u,%u,%u shared=%u "
           "stream=%llu kernarg=%s", current_device, function->module->device, function->name, gx, gy, gz,
           bx, by, bz, shared, (unsigned long long)(uintptr_t)stream, hex);
    free(hex);
    return failure("hipModuleLaunchKernel");
}

/* Names and texts as ROCm's clr (hipamd/src/hip_error.cpp) gives them for these codes. */
const char *hipGetErrorName(hipError_t error) {
    switch (error) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorInvalidImage: return "hipErrorInvalidImage";
    case hipErrorNotFound: return "hipErrorNotFound";
    case hipErrorLaunchFailure: return "hipErrorLaunchFailure";
    default: return "hipErrorUnknown";
    }
}

const char *hipGetErrorString(hipError_t error) {
    switch (error) {
    case hipSuccess: return "no error";
    case hipErrorInvalidValue: return "invalid argument";
    case hipErrorInvalidImage: return "device kernel image is invalid";
    case hipErrorNotFound: return "named symbol not found";
    case hipErrorLaunchFailure: return "unspecified launch failure";
    default: return "hipErrorUnknown";        /* as ROCm 5.2 answers every code: the name again */
    }
}
