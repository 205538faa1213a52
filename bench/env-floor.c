/* The floor for `sw-pool run` starts (bench/env-start.sh): N times in one process, clone a child
 * into new user+mount+PID namespaces, map 0 -> the caller, make the mounts private, mount /proc,
 * optionally mount a kernel overlay over a lower the caller owns (MODE=ovl LOWER WORKDIR), and exec
 * /bin/true; wait. Nothing else: no launcher, no layer bookkeeping, no bind of the host's mounts.
 *   env-floor ns N
 *   env-floor init N                   (pid 1 stays as the environment's init: it posix_spawns
 *                                       /bin/true and waits, as sw-pool's pid 1 does; `ns` execs
 *                                       /bin/true as pid 1, as `unshare -f` does)
 *   env-floor ovl N LOWER SCRATCH      (SCRATCH/u<pid>.<i>, SCRATCH/w<pid>.<i>, SCRATCH/m are made here)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void put(const char *path, const char *s) {
    int fd = open(path, O_WRONLY);
    if (fd < 0 || write(fd, s, strlen(s)) < 0) { perror(path); _exit(125); }
    close(fd);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: env-floor ns|init|ovl N [LOWER SCRATCH]\n"); return 2; }
    int ovl = strcmp(argv[1], "ovl") == 0;
    int init = strcmp(argv[1], "init") == 0;
    int n = atoi(argv[2]);
    if (ovl && argc < 5) { fprintf(stderr, "ovl needs LOWER SCRATCH\n"); return 2; }
    char m[4096];
    if (ovl) { snprintf(m, sizeof m, "%s/m", argv[4]); mkdir(m, 0755); }
    unsigned uid = getuid(), gid = getgid();
    for (int i = 0; i < n; i++) {
        char u[4096], w[4096], opts[12288];
        if (ovl) {
            snprintf(u, sizeof u, "%s/u%d.%d", argv[4], (int)getpid(), i); mkdir(u, 0755);
            snprintf(w, sizeof w, "%s/w%d.%d", argv[4], (int)getpid(), i); mkdir(w, 0755);
            snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s,userxattr", argv[3], u, w);
        }
        pid_t pid = syscall(SYS_clone, CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0);
        if (pid < 0) { perror("clone"); return 1; }
        if (pid == 0) {
            char map[64];
            put("/proc/self/setgroups", "deny");
            snprintf(map, sizeof map, "0 %u 1", uid); put("/proc/self/uid_map", map);
            snprintf(map, sizeof map, "0 %u 1", gid); put("/proc/self/gid_map", map);
            if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) { perror("private"); _exit(125); }
            if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL)) { perror("proc"); _exit(125); }
            if (ovl && mount("overlay", m, "overlay", 0, opts)) { perror("overlay"); _exit(125); }
            if (init) {
                char *args[] = {"true", NULL};
                pid_t c;
                int st;
                if (posix_spawn(&c, "/bin/true", NULL, NULL, args, environ) != 0) _exit(126);
                if (waitpid(c, &st, 0) < 0 || !WIFEXITED(st)) _exit(125);
                _exit(WEXITSTATUS(st));
            }
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        int st;
        if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "env-floor: start %d failed\n", i); return 1;
        }
    }
    return 0;
}
