/* The fake nvidia-cuda-mps-control's client side in C, so benchmarks on machines
 * without a GPU pay what the real (C) client costs, not a Python start-up.
 * Same protocol as tests/fakes/nvidia-cuda-mps-control: one command per connection,
 * answer until EOF. "-d" and "-f" hand over to the Python fake, which daemonises.
 * Build: cc -O2 -o nvidia-cuda-mps-control fast_client.c -DFAKE=\"/path/to/fake\" */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef FAKE
#error "define FAKE as the path of the Python fake"
#endif

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-d") || !strcmp(argv[i], "-f") || !strcmp(argv[i], "-h")) {
            char *args[] = {"python3", FAKE, argv[i], NULL};
            execvp("python3", args);
            perror("python3");
            return 1;
        }
    const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (!dir || !*dir) dir = "/tmp/nvidia-mps";
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (snprintf(addr.sun_path, sizeof addr.sun_path, "%s/control", dir) >= (int)sizeof addr.sun_path) {
        puts("Cannot find MPS control daemon process");
        return 1;
    }
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
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
