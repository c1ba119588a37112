/* rota-exec: starts a process of a job as rota's node agent asks, so that the agent never forks itself.
 *
 * Forking the agent (a Python process of tens of megabytes) to run a few system calls before exec costs
 * milliseconds of copied page tables and touched pages on every launch; the agent instead starts this
 * helper with vfork and exec, and the helper does those system calls:
 *
 *   rota-exec REPORT_FD ENV_FD [--cgroup FILE]... [--user UID:GID[:G1,G2...]] [--umask OCTAL]
 *             [--cwd DIR] [--open FD:FLAGS:PATH]... -- COMMAND [ARG...]
 *
 * The helper starts as the agent (root) with an empty environment: the command's environment, which the
 * job's user chose, arrives on ENV_FD (NAME=VALUE entries, each ended by a NUL byte) and is read whole
 * first, then applied only to COMMAND, so nothing in it (LD_PRELOAD, ...) can reach a process running as
 * root. Then, in the order given (the agent gives them in this order): write the helper's pid into each
 * cgroup's FILE (cgroup.procs) while it is still the caller; become the user for good (groups, gid,
 * uid); take the umask; change to DIR, else to /tmp (as slurmstepd does); open each PATH as that user
 * (FLAGS as open(2) takes them, mode 0644) as descriptor FD; execute COMMAND (searched in the command's
 * PATH). REPORT_FD is closed when COMMAND is executed: the caller reads it to its end and finds nothing,
 * or one line saying what failed (the helper then exits with 127).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_GROUPS 65536
#define MAX_ENVIRON (64 << 20)

extern char **environ;

static int report = -1;

static void fail(const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if (n > (int)sizeof line - 2) n = sizeof line - 2;
    line[n++] = '\n';
    if (report < 0 || write(report, line, n) < 0) {
        if (write(2, line, n) < 0) { /* nowhere left to say it */ }
    }
    _exit(127);
}

static long number(const char *s, int base, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, base);
    if (errno || end == s || *end || v < 0) fail("rota-exec: bad %s: %s", what, s);
    return v;
}

/* "N:rest": the number before the first ':' (the rest after it, in *rest) */
static long field(char *s, char **rest, const char *what) {
    char *colon = strchr(s, ':');
    if (colon) *colon = '\0';
    long v = number(s, 10, what);
    *rest = colon ? colon + 1 : NULL;
    return v;
}

static void join_cgroup(const char *file) {
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot join the job's cgroup %s: %s", file, strerror(errno));
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
    if (write(fd, pid, n) != n) fail("cannot join the job's cgroup %s: %s", file, strerror(errno));
    close(fd);
}

static void become(char *spec) {
    char *rest;
    uid_t uid = (uid_t)field(spec, &rest, "uid");
    if (!rest) fail("rota-exec: --user needs UID:GID");
    char *groups_text;
    gid_t gid = (gid_t)field(rest, &groups_text, "gid");
    static gid_t groups[MAX_GROUPS];
    size_t n = 0;
    if (groups_text && *groups_text) {
        for (char *g = strtok(groups_text, ","); g; g = strtok(NULL, ",")) {
            if (n == MAX_GROUPS) fail("rota-exec: too many groups");
            groups[n++] = (gid_t)number(g, 10, "group");
        }
    }
    if (setgroups(n, groups) < 0) fail("cannot set the groups of uid %d: %s", (int)uid, strerror(errno));
    if (setresgid(gid, gid, gid) < 0) fail("cannot become gid %d: %s", (int)gid, strerror(errno));
    if (setresuid(uid, uid, uid) < 0) fail("cannot become uid %d: %s", (int)uid, strerror(errno));
}

static void open_as(char *spec) {
    char *rest, *path;
    int fd = (int)field(spec, &rest, "descriptor");
    if (!rest) fail("rota-exec: --open needs FD:FLAGS:PATH");
    int flags = (int)field(rest, &path, "open flags");
    if (!path || !*path) fail("rota-exec: --open needs FD:FLAGS:PATH");
    int opened = open(path, flags, 0644);
    if (opened < 0) fail("cannot open %s: %s", path, strerror(errno));
    if (opened != fd) {
        if (dup2(opened, fd) < 0) fail("cannot open %s as descriptor %d: %s", path, fd, strerror(errno));
        close(opened);
    }
}

/* The command's environment, read whole from fd: a NULL-ended array of its NUL-ended entries. */
static char **read_environment(int fd) {
    size_t n = 0, cap = 1 << 16;
    char *text = malloc(cap);
    if (!text) fail("rota-exec: out of memory");
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_ENVIRON) fail("rota-exec: the environment is larger than %d bytes", MAX_ENVIRON);
            cap *= 2;
            if (!(text = realloc(text, cap))) fail("rota-exec: out of memory");
        }
        ssize_t got = read(fd, text + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) fail("rota-exec: cannot read the environment: %s", strerror(errno));
        if (got == 0) break;
        n += (size_t)got;
    }
    close(fd);
    size_t entries = 0;
    for (size_t i = 0; i < n; i++) entries += text[i] == '\0';
    char **env = calloc(entries + 1, sizeof *env);
    if (!env) fail("rota-exec: out of memory");
    size_t k = 0, start = 0;
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\0') {
            env[k++] = text + start;
            start = i + 1;
        }
    }
    return env;
}

int main(int argc, char **argv) {
    if (argc < 2) fail("usage: rota-exec REPORT_FD ENV_FD [options] -- COMMAND [ARG...]");
    report = (int)number(argv[1], 10, "report descriptor");
    if (fcntl(report, F_SETFD, FD_CLOEXEC) < 0) {
        report = -1;
        fail("rota-exec: the report descriptor is not open");
    }
    if (argc < 4) fail("usage: rota-exec REPORT_FD ENV_FD [options] -- COMMAND [ARG...]");
    char **command_environment = read_environment((int)number(argv[2], 10, "environment descriptor"));
    int i = 3;
    for (; i < argc && strcmp(argv[i], "--") != 0; i += 2) {
        if (i + 1 >= argc) fail("rota-exec: %s needs a value", argv[i]);
        const char *opt = argv[i];
        char *value = argv[i + 1];
        if (!strcmp(opt, "--cgroup")) {
            join_cgroup(value);
        } else if (!strcmp(opt, "--user")) {
            become(value);
        } else if (!strcmp(opt, "--umask")) {
            umask((mode_t)(number(value, 8, "umask") & 0777));
        } else if (!strcmp(opt, "--cwd")) {
            if (chdir(value) < 0 && chdir("/tmp") < 0) fail("cannot change to %s or /tmp: %s", value, strerror(errno));
        } else if (!strcmp(opt, "--open")) {
            open_as(value);
        } else {
            fail("rota-exec: unknown option %s", opt);
        }
    }
    if (i + 1 >= argc) fail("rota-exec: no command after --");
    for (char **e = command_environment; *e; e++) {   /* SLURM_TASK_PID: this process, which becomes the command */
        if (!strncmp(*e, "SLURM_TASK_PID=", 15)) {
            static char task_pid[40];
            snprintf(task_pid, sizeof task_pid, "SLURM_TASK_PID=%ld", (long)getpid());
            *e = task_pid;
        }
    }
    environ = command_environment;   /* execvp searches this PATH, and the command gets all of it */
    execvp(argv[i + 1], argv + i + 1);
    fail("cannot run %s: %s", argv[i + 1], strerror(errno));
    return 127;
}
