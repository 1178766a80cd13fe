/* An executable stand-in for one of NVIDIA's MPS binaries, on machines without a GPU.
 *
 * mps-health tells a real control daemon or server from a process that only takes its
 * name by /proc/PID/exe, which must be the configured binary. So the fakes run as an
 * executable file at that path, as the real binaries do: this program embeds the Python
 * interpreter and runs the fake script FAKE inside its own process. /proc/PID/exe is
 * this file; the command line and comm are the ones it was started with
 * ("nvidia-cuda-mps-control -d", comm "nvidia-cuda-mps"), as with the real binary.
 * sys.executable is this file, so the fake can start itself again.
 *
 * With -DFAST_CLIENT (benchmarks: tests/helpers/fakebin.py fake_bin(fast_client=True)), the
 * control binary is the client in C when started without -d, -f or -h, so a query costs
 * what the real (C) client costs, not a Python start-up; same protocol as the fake's
 * client: one command per connection, the answer until EOF. That build is not linked
 * with libpython (-DLIBPYTHON names it; the daemon modes open it).
 *
 * Build (tests/helpers/fakebin.py does it): cc -o nvidia-cuda-mps-control launcher.c
 *   -DFAKE='"/path/to/tests/fakes/nvidia-cuda-mps-control"' -DPYHOME='"/usr"'
 *   $(python3-config --embed --cflags --ldflags)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#if !defined(FAKE) || !defined(PYHOME)
#error "define FAKE (the fake script) and PYHOME (the interpreter's prefix)"
#endif

#ifdef FAST_CLIENT
/* The client must cost what a plain C client costs (the real one is one): this build is
 * not linked with libpython, which would be loaded and relocated on every query (about
 * a millisecond and 350 page faults); the daemon modes open it (LIBPYTHON, beside this
 * binary, as the linked build finds it through its rpath) and call it through these. */
#include <dlfcn.h>
#define PY_FUNCTIONS(X) X(PyConfig_InitPythonConfig) X(PyConfig_SetBytesString) \
    X(PyConfig_SetBytesArgv) X(Py_InitializeFromConfig) X(PyConfig_Clear) X(Py_RunMain) \
    X(PyStatus_Exception) X(PyStatus_IsExit) X(Py_ExitStatusException)
#define DECLARE(f) static __typeof__(f) *p_##f;
PY_FUNCTIONS(DECLARE)

static int open_python(const char *self) {
    char lib[PATH_MAX];
    const char *slash = strrchr(self, '/');
    if (!slash || snprintf(lib, sizeof lib, "%.*s/%s", (int)(slash - self), self,
                           LIBPYTHON) >= (int)sizeof lib)
        return -1;
    /* RTLD_GLOBAL: the standard library's extension modules take their Py* symbols
     * from the process, as from a binary linked with libpython. A copy elsewhere (the
     * benchmark's bin dir) takes the system's, as the linked build's rpath would. */
    void *python = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!python)
        python = dlopen(LIBPYTHON, RTLD_NOW | RTLD_GLOBAL);
    if (!python) {
        fprintf(stderr, "%s\n", dlerror());
        return -1;
    }
#define LOAD(f) if (!(p_##f = (__typeof__(f) *)dlsym(python, #f))) return -1;
    PY_FUNCTIONS(LOAD)
    return 0;
}
#define PyConfig_InitPythonConfig p_PyConfig_InitPythonConfig
#define PyConfig_SetBytesString p_PyConfig_SetBytesString
#define PyConfig_SetBytesArgv p_PyConfig_SetBytesArgv
#define Py_InitializeFromConfig p_Py_InitializeFromConfig
#define PyConfig_Clear p_PyConfig_Clear
#define Py_RunMain p_Py_RunMain
#define PyStatus_Exception p_PyStatus_Exception
#define PyStatus_IsExit p_PyStatus_IsExit
#define Py_ExitStatusException p_Py_ExitStatusException
#endif

static int fail(PyConfig *config, PyStatus status) {
    PyConfig_Clear(config);
    if (PyStatus_IsExit(status))
        return status.exitcode;
    Py_ExitStatusException(status); /* prints why and exits */
    return 1;
}

#ifdef FAST_CLIENT
static int client(void) {
    const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (!dir || !*dir) dir = "/tmp/nvidia-mps";
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (snprintf(addr.sun_path, sizeof addr.sun_path, "%s/control", dir) >= (int)sizeof addr.sun_path)
        return 1; /* as the real client: silent when the path cannot fit sockaddr_un */
    char line[4096];
    while (fgets(line, sizeof line - 1, stdin)) {
        if (line[0] == '\n') continue;
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) < 0) {
            puts("Cannot find MPS control daemon process");
            return 1;
        }
        size_t n = strlen(line);
        if (line[n - 1] != '\n') { line[n++] = '\n'; line[n] = 0; }
        if (write(s, line, n) != (ssize_t)n) return 1;
        char buf[65536];
        ssize_t got;
        while ((got = read(s, buf, sizeof buf)) > 0) fwrite(buf, 1, (size_t)got, stdout);
        fflush(stdout);
        close(s);
    }
    return 0;
}
#endif

int main(int argc, char **argv) {
#ifdef FAST_CLIENT
    int flags = 0;
    for (int i = 1; i < argc; i++)
        flags |= !strcmp(argv[i], "-d") || !strcmp(argv[i], "-f") || !strcmp(argv[i], "-h");
    if (!flags)
        return client();
#endif
    /* What python itself would be given: this program's name, the script, our args. */
    char **args = calloc((size_t)argc + 2, sizeof *args);
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (args == NULL || n <= 0)
        return 1;
    self[n] = '\0';
#ifdef FAST_CLIENT
    if (open_python(self) != 0)
        return 1;
#endif
    args[0] = argv[0];
    args[1] = FAKE;
    for (int i = 1; i < argc; i++)
        args[i + 1] = argv[i];

    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    PyStatus status = PyConfig_SetBytesString(&config, &config.home, PYHOME);
    if (!PyStatus_Exception(status))
        status = PyConfig_SetBytesString(&config, &config.executable, self);
    if (!PyStatus_Exception(status))
        status = PyConfig_SetBytesArgv(&config, argc + 1, args);
    if (!PyStatus_Exception(status))
        status = Py_InitializeFromConfig(&config);
    if (PyStatus_Exception(status))
        return fail(&config, status);
    PyConfig_Clear(&config);
    return Py_RunMain();
}
