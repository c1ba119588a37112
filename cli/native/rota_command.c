/* The native thin client of rota's Slurm-named commands (sbatch, squeue, ...; installed under each name).
 *
 * It hands argv, the working directory, the environment, the umask and its stdin, stdout and stderr to
 * this host's command server (rota.programs.commandserver, beside the local signer), forwards signals to the
 * command's process there, and exits with the command's status. The protocol is described in that
 * module. When no server runs, or the server asks it to, it runs the Python command itself
 * (ROTA_PYTHON -I -m rota.cli.NAME): ROTA_PYTHON is the absolute path written when it was built, and -I keeps
 * the working directory, PYTHONPATH and the other PYTHON* variables and the user's site folder off the path,
 * so a `rota` package planted where the caller happens to be (root in /tmp) is never imported.
 *
 * The socket is found as rota.wire.paths.socket_path() finds the signer's: $ROTA_SOCKET, else
 * $ROTA_STATE_DIR/run, else this user's own state directory when its socket exists, else /var/lib/rota/run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <unistd.h>

#define ANSWER_WAIT 5 /* seconds to wait for the server to take the command before running it here */

#ifndef ROTA_PYTHON
#define ROTA_PYTHON "python3"
#endif

extern char **environ;

static const char *COMMANDS[] = {"sbatch", "squeue", "sacct", "sinfo", "scancel", "scontrol", "srun", "salloc",
                                 "sacctmgr", "sshare", "sprio", NULL};
static volatile pid_t child = 0;

typedef struct {
    char *p;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { perror("rota"); exit(1); }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void puts_(buf_t *b, const char *s) { put(b, s, strlen(s)); }

static void put_json(buf_t *b, const char *s, size_t n) {
    put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') { esc[0] = '\\'; esc[1] = (char)c; put(b, esc, 2); }
        else if (c < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", c); put(b, esc, 6); }
        else put(b, (const char *)&s[i], 1);
    }
    put(b, "\"", 1);
}

static void fall_back(const char *name, char **argv) {
    int argc = 0;
    while (argv[argc]) argc++;
    char **args = calloc((size_t)argc + 5, sizeof(char *));
    char module[64];
    if (!args) { perror(name); exit(1); }
    snprintf(module, sizeof module, "rota.cli.%s", name);
    args[0] = (char *)ROTA_PYTHON;
    args[1] = "-I";
    args[2] = "-m";
    args[3] = module;
    for (int i = 1; i < argc; i++) args[i + 3] = argv[i];
    if (ROTA_PYTHON[0] != '/') {
        fprintf(stderr, "%s: error: no rota command server runs here, and this client was built without the absolute "
                        "path of rota's Python (rebuild it with rota install-commands)\n", name);
        exit(1);
    }
    execv(ROTA_PYTHON, args);
    fprintf(stderr, "%s: error: no rota command server runs here and %s cannot be run: %s\n", name, ROTA_PYTHON,
            strerror(errno));
    exit(1);
}

static int socket_dir(char *out, size_t size) {
    const char *env = getenv("ROTA_SOCKET");
    if (env && *env) {
        const char *slash = strrchr(env, '/');
        if (!slash) return snprintf(out, size, ".") < (int)size;
        return snprintf(out, size, "%.*s", (int)(slash - env), env) < (int)size;
    }
    env = getenv("ROTA_STATE_DIR");
    if (env && *env) return snprintf(out, size, "%s/run", env) < (int)size;
    if (geteuid() != 0) {
        char own[4096];
        const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
        int n = (xdg && *xdg) ? snprintf(own, sizeof own, "%s/rota/run", xdg)
                              : snprintf(own, sizeof own, "%s/.local/share/rota/run", home ? home : "");
        char sock[4200];
        struct stat st;
        snprintf(sock, sizeof sock, "%s/rota.sock", own);
        if (n < (int)sizeof own && stat(sock, &st) == 0) return snprintf(out, size, "%s", own) < (int)size;
    }
    return snprintf(out, size, "/var/lib/rota/run") < (int)size;
}

static int read_exactly(int fd, void *dst, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)dst + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        got += (size_t)r;
    }
    return 1;
}

static void forward(int sig) {
    if (child > 0) kill(child, sig);
}

int main(int argc, char **argv) {
    const char *name = strrchr(argv[0], '/');
    name = name ? name + 1 : argv[0];
    int known = 0;
    for (int i = 0; COMMANDS[i]; i++) known |= strcmp(COMMANDS[i], name) == 0;
    if (!known) {
        fprintf(stderr, "rota-command: run me as one of sbatch, squeue, sacct, sinfo, scancel, scontrol, srun, "
                        "salloc, sacctmgr, sshare, sprio (a link with that name)\n");
        return 2;
    }
    const char *thin = getenv("ROTA_THIN");
    char dir[4096], cwd[8192];
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if ((thin && strcmp(thin, "0") == 0) || !socket_dir(dir, sizeof dir) || !getcwd(cwd, sizeof cwd) ||
        snprintf(addr.sun_path, sizeof addr.sun_path, "%s/commands.sock", dir) >= (int)sizeof addr.sun_path)
        fall_back(name, argv);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) < 0) fall_back(name, argv);

    buf_t b = {0};
    put(&b, "\0\0\0\0", 4);
    puts_(&b, "{\"cmd\":");
    put_json(&b, name, strlen(name));
    puts_(&b, ",\"argv\":[");
    for (int i = 1; i < argc; i++) {
        if (i > 1) put(&b, ",", 1);
        put_json(&b, argv[i], strlen(argv[i]));
    }
    puts_(&b, "],\"cwd\":");
    put_json(&b, cwd, strlen(cwd));
    puts_(&b, ",\"env\":{");
    int first = 1;
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq) continue;
        if (!first) put(&b, ",", 1);
        first = 0;
        put_json(&b, *e, (size_t)(eq - *e));
        put(&b, ":", 1);
        put_json(&b, eq + 1, strlen(eq + 1));
    }
    mode_t mask = umask(022);
    umask(mask);
    char tail[32];
    snprintf(tail, sizeof tail, "},\"umask\":%u}", (unsigned)mask);
    puts_(&b, tail);
    uint32_t len = htonl((uint32_t)(b.n - 4));
    memcpy(b.p, &len, 4);

    int fds[3];
    for (int fd = 0; fd < 3; fd++)
        fds[fd] = fcntl(fd, F_GETFD) < 0 ? open("/dev/null", O_RDWR) : fd;
    char control[CMSG_SPACE(sizeof fds)];
    memset(control, 0, sizeof control);
    struct iovec iov = {.iov_base = b.p, .iov_len = b.n};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cm), fds, sizeof fds);
    ssize_t sent = sendmsg(s, &msg, MSG_NOSIGNAL);
    if (sent < 0) fall_back(name, argv);
    while ((size_t)sent < b.n) {
        ssize_t r = send(s, b.p + sent, b.n - (size_t)sent, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) fall_back(name, argv);
        sent += r;
    }
    char answer[5];
    uint32_t pid;
    struct timeval wait = {.tv_sec = ANSWER_WAIT};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    if (!read_exactly(s, answer, 5) || answer[0] != 'A') {
        close(s);                    /* no 'G' was sent: the server runs nothing */
        fall_back(name, argv);
    }
    struct timeval forever = {0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof forever);
    if (send(s, "G", 1, MSG_NOSIGNAL) != 1) {
        close(s);
        fall_back(name, argv);
    }
    memcpy(&pid, answer + 1, 4);
    child = (pid_t)ntohl(pid);
    struct sigaction sa = {.sa_handler = forward, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT};
    for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++) sigaction(forwarded[i], &sa, NULL);
    char end[5];
    if (!read_exactly(s, end, 5) || end[0] != 'X') {
        fprintf(stderr, "%s: error: the command server stopped before the command ended\n", name);
        return 1;
    }
    int32_t code;
    memcpy(&code, end + 1, 4);
    return (int)(int32_t)ntohl((uint32_t)code) & 0xff;
}
