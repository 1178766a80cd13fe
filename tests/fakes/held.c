/* Runs a program held at its exec under ptrace: none of its code ever runs (tests only).
 *
 * What any user can do with a world-executable binary such as nvidia-cuda-mps-server:
 * the child asks to be traced (PTRACE_TRACEME) and execs argv[1..] with this program's
 * environment; the kernel stops it right after the exec, before its first instruction.
 * /proc/CHILD/exe then names the binary, its cmdline and comm are the binary's, and
 * /proc/CHILD/status shows state "t (tracing stop)" and TracerPid (this program). The
 * parent then sleeps holding it there until killed; the child dies with it (the parent
 * sets PTRACE_O_EXITKILL, and the child PR_SET_PDEATHSIG before its exec).
 *
 * Prints the child's pid on a line once it is held. Build (tests/helpers/hostile.py does it):
 *   cc -O1 -o held held.c
 * Use: held PROGRAM [ARGS...]
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: held PROGRAM [ARGS...]\n");
        return 2;
    }
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)  /* the parent died before the death signal was set */
            _exit(1);
        if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) != 0) {
            perror("ptrace(PTRACE_TRACEME)");
            _exit(1);
        }
        execve(argv[1], argv + 1, environ);
        perror("execve");
        _exit(127);
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFSTOPPED(status)) {
        fprintf(stderr, "held: the child did not stop at its exec\n");
        kill(child, SIGKILL);
        return 1;
    }
    /* Kill the tracee if this tracer ends in any way; leave it in its exec stop. */
    ptrace(PTRACE_SETOPTIONS, child, NULL, (void *)PTRACE_O_EXITKILL);
    printf("%d\n", (int)child);
    fflush(stdout);
    for (;;)
        pause();
}
