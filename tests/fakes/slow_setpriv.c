/* A stand-in for util-linux's `setpriv --pdeathsig KILL -- CMD...` on a slow machine: it
 * takes SLOW_SETPRIV_MS milliseconds (default 300) before it sets the parent-death signal
 * and execs CMD, longer than the runner's first wait for that exec
 * (tests/unit/test_runner.py: the command is still fed its stdin, once armed).
 *
 * Build: cc -o slow_setpriv slow_setpriv.c
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 5 || strcmp(argv[1], "--pdeathsig") || strcmp(argv[2], "KILL")
        || strcmp(argv[3], "--")) {
        fprintf(stderr, "usage: slow_setpriv --pdeathsig KILL -- COMMAND [ARG...]\n");
        return 64;
    }
    const char *ms = getenv("SLOW_SETPRIV_MS");
    long wait_ms = ms ? atol(ms) : 300;
    struct timespec pause = {wait_ms / 1000, (wait_ms % 1000) * 1000 * 1000};
    nanosleep(&pause, NULL);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        perror("slow_setpriv: prctl");
        return 127;
    }
    execv(argv[4], argv + 4);
    perror("slow_setpriv: execv");
    return 127;
}
