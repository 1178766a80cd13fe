/* A stand-in for util-linux's `setpriv --pdeathsig KILL -- CMD...` that loses the race
 * on purpose: it waits until its parent has died, and only then sets its parent-death
 * signal and execs CMD, as setpriv would had the kill landed between fork and prctl.
 * The kernel never signals a process whose parent died before its prctl, so what runs
 * CMD must not depend on that signal (tests/e2e/test_attack_lifetime.py).
 * Waits at most 10 s for the parent's death.
 *
 * Build: cc -o late_setpriv late_setpriv.c
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 5 || strcmp(argv[1], "--pdeathsig") || strcmp(argv[2], "KILL")
        || strcmp(argv[3], "--")) {
        fprintf(stderr, "usage: late_setpriv --pdeathsig KILL -- COMMAND [ARG...]\n");
        return 64;
    }
    pid_t parent = getppid();
    struct timespec tick = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 1000 && getppid() == parent; i++)
        nanosleep(&tick, NULL);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        perror("late_setpriv: prctl");
        return 127;
    }
    execv(argv[4], argv + 4);
    perror("late_setpriv: execv");
    return 127;
}
