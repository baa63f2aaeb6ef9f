/*
 * weft: the file a container runtime executes for weft's CNI plugin
 * ("type": "weft"). Built static, without the Go runtime (make build:
 * gcc -static -Os), it costs a fraction of a Go process's start and exit.
 *
 * It hands the command (the environment and stdin) to the node's resident
 * command server, `weft-plugin serve-cni`, on the abstract unix socket
 * @weft-cni-server of its network namespace, and relays the answer: what
 * the plugin would have printed on stdout and stderr, and its exit status.
 * When no server answers, when the one that does runs another binary than
 * the weft-plugin installed next to this file (it answers 'S'), or when
 * the exchange fails before the server has accepted the command, it
 * executes weft-plugin with the same arguments, environment and stdin,
 * asking it (WEFT_CNI_SERVE=1) to start a server for the next commands.
 * Once the server has accepted the command, the command is never run a
 * second time: a broken exchange is a CNI error (JSON on stdout, exit 1).
 * The exchange is described in cni/server.go.
 *
 * A server not listening as root is never used (a squatter on the name).
 *
 * Anything but a CNI command with no arguments (VERSION, a person running
 * it without CNI_COMMAND, an older DEL running `weft reap-veth`), or
 * WEFT_CNI_DIRECT set, goes straight to weft-plugin.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;

#define SERVER_NAME "weft-cni-server" /* abstract: a leading NUL */
#define PLUGIN_NAME "weft-plugin"
#define MAX_PART (4u << 20) /* cni/server.go: maxRequestPart */

static char plugin[PATH_MAX];

/* cni_error prints a CNI error as the Go plugin does and exits 1. */
static void cni_error(const char *msg, const char *details) {
	/* msg and details are ours: no characters that need escaping, but
	 * details may hold a path; keep only safe characters. */
	char safe[PATH_MAX + 64];
	size_t n = 0;
	for (const char *p = details; *p && n < sizeof safe - 1; p++)
		safe[n++] = (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) ? '?' : *p;
	safe[n] = 0;
	printf("{\"code\":999,\"msg\":\"%s\",\"details\":\"%s\"}\n", msg, safe);
	fflush(stdout);
	exit(1);
}

/* run_plugin executes weft-plugin in this process's stead. stdin, if
 * already read, is handed to it in a memory file. */
static void run_plugin(char **argv, const char *in, size_t in_len, int have_in, int serve) {
	if (have_in) {
		int fd = memfd_create("weft-cni-stdin", MFD_CLOEXEC);
		if (fd < 0)
			cni_error("weft: passing stdin to weft-plugin", strerror(errno));
		size_t off = 0;
		while (off < in_len) {
			ssize_t w = write(fd, in + off, in_len - off);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				cni_error("weft: passing stdin to weft-plugin", strerror(errno));
			off += (size_t)w;
		}
		if (lseek(fd, 0, SEEK_SET) != 0 || dup2(fd, 0) != 0)
			cni_error("weft: passing stdin to weft-plugin", strerror(errno));
		close(fd);
	}
	if (serve)
		setenv("WEFT_CNI_SERVE", "1", 1);
	argv[0] = plugin;
	execv(plugin, argv);
	cni_error("weft: cannot execute weft-plugin", plugin);
}

static int read_all(int fd, char *buf, size_t len) {
	size_t off = 0;
	while (off < len) {
		ssize_t r = read(fd, buf + off, len - off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		off += (size_t)r;
	}
	return 0;
}

static int write_all(int fd, const char *buf, size_t len) {
	size_t off = 0;
	while (off < len) {
		ssize_t w = write(fd, buf + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		off += (size_t)w;
	}
	return 0;
}

/* read_stdin reads all of stdin into a buffer; NULL if it is too large. */
static char *read_stdin(size_t *len) {
	size_t cap = 8192, n = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (!buf)
			return NULL;
		if (n == cap) {
			if (cap >= MAX_PART) {
				free(buf);
				return NULL;
			}
			cap *= 2;
			buf = realloc(buf, cap);
			continue;
		}
		ssize_t r = read(0, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			free(buf);
			return NULL;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	*len = n;
	return buf;
}

static int is_command(const char *c) {
	return c && (!strcmp(c, "ADD") || !strcmp(c, "DEL") || !strcmp(c, "CHECK") ||
		     !strcmp(c, "GC") || !strcmp(c, "STATUS"));
}

int main(int argc, char **argv) {
	ssize_t n = readlink("/proc/self/exe", plugin, sizeof plugin - sizeof PLUGIN_NAME - 1);
	if (n <= 0)
		cni_error("weft: cannot find its own file", strerror(errno));
	plugin[n] = 0;
	char *slash = strrchr(plugin, '/');
	strcpy(slash ? slash + 1 : plugin, PLUGIN_NAME);

	if (argc != 1 || !is_command(getenv("CNI_COMMAND")) || getenv("WEFT_CNI_DIRECT"))
		run_plugin(argv, NULL, 0, 0, 0);

	size_t in_len = 0;
	char *in = read_stdin(&in_len);
	if (!in)
		cni_error("weft: reading stdin", "too large or unreadable");

	struct stat st;
	if (stat(plugin, &st) != 0)
		run_plugin(argv, in, in_len, 1, 1); /* reports the missing file */

	size_t env_len = 0;
	for (char **e = environ; *e; e++)
		env_len += strlen(*e) + 1;
	if (env_len > MAX_PART)
		run_plugin(argv, in, in_len, 1, 1);
	char *env = malloc(env_len ? env_len : 1), *p = env;
	if (!env)
		run_plugin(argv, in, in_len, 1, 1);
	for (char **e = environ; *e; e++) {
		size_t l = strlen(*e) + 1;
		memcpy(p, *e, l);
		p += l;
	}

	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	memcpy(addr.sun_path + 1, SERVER_NAME, sizeof SERVER_NAME - 1);
	socklen_t alen = offsetof(struct sockaddr_un, sun_path) + 1 + sizeof SERVER_NAME - 1;
	if (fd < 0 || connect(fd, (struct sockaddr *)&addr, alen) != 0)
		run_plugin(argv, in, in_len, 1, 1);
	/* Abstract socket names have no permissions: anyone in the network
	 * namespace could listen on this one first. Only a server that root
	 * started is trusted with the command and its answer. */
	struct ucred cred;
	socklen_t cred_len = sizeof cred;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0 || cred.uid != 0) {
		close(fd);
		run_plugin(argv, in, in_len, 1, 1);
	}

	unsigned char head[44];
	uint64_t id[4] = {(uint64_t)st.st_dev, (uint64_t)st.st_ino, (uint64_t)st.st_mtim.tv_sec,
			  (uint64_t)st.st_mtim.tv_nsec};
	uint32_t lens[2] = {(uint32_t)env_len, (uint32_t)in_len};
	memcpy(head, "WFT1", 4);
	memcpy(head + 4, id, sizeof id);
	memcpy(head + 36, lens, sizeof lens);
	struct iovec iov[3] = {{head, sizeof head}, {env, env_len}, {in, in_len}};
	struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 3};
	size_t left = sizeof head + env_len + in_len;
	while (left > 0) {
		ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			run_plugin(argv, in, in_len, 1, 1);
		left -= (size_t)w;
		while (w > 0) { /* skip what was sent */
			size_t take = (size_t)w < msg.msg_iov->iov_len ? (size_t)w : msg.msg_iov->iov_len;
			msg.msg_iov->iov_base = (char *)msg.msg_iov->iov_base + take;
			msg.msg_iov->iov_len -= take;
			w -= (ssize_t)take;
			if (msg.msg_iov->iov_len == 0 && msg.msg_iovlen > 0) {
				msg.msg_iov++;
				msg.msg_iovlen--;
			}
		}
	}

	char verdict;
	if (read_all(fd, &verdict, 1) != 0 || verdict != 'A') {
		close(fd);
		run_plugin(argv, in, in_len, 1, 1); /* stale, refused or gone */
	}

	/* The command has started: from here on, never run it again. */
	uint32_t ans[3];
	if (read_all(fd, (char *)ans, sizeof ans) != 0)
		cni_error("weft: the plugin server failed during the command", "no answer");
	if (ans[1] > MAX_PART || ans[2] > MAX_PART)
		cni_error("weft: the plugin server failed during the command", "answer too large");
	char *out = malloc((size_t)ans[1] + ans[2] + 1);
	if (!out || read_all(fd, out, (size_t)ans[1] + ans[2]) != 0)
		cni_error("weft: the plugin server failed during the command", "answer cut short");
	if (write_all(1, out, ans[1]) != 0 || write_all(2, out + ans[1], ans[2]) != 0)
		return 1;
	return (int)ans[0];
}
