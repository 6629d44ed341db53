/* A small HTTPS load client for `python -m bench compare` (compiled by bench/compare.py).
 *
 * Why not wrk/h2load: they resume TLS sessions on reconnect, which a booting node never
 * does, so they overstate a boot storm. Here every connection gets a fresh SSL object and no
 * session is ever set or stored (SSL_SESS_CACHE_OFF, SSL_OP_NO_TICKET): each new connection
 * is a full handshake. Blocking sockets, one thread per connection in flight: the handshake
 * and AES-GCM dominate the client's CPU, not the I/O loop.
 *
 * usage: loadclient HOST PORT CAFILE|- SECONDS CONNECTIONS MODE(close|keepalive|boot) PATH [HEADER ...]
 * boot: each request is a node booting: a new connection per attempt, a 5xx or a failed
 * connection retried on the real client's schedule (0.2 s doubling to 5 s), a 4xx final; the
 * latency is the boot's (first attempt to payload), and retries and permanent failures are
 * counted. Environment: LOADCLIENT_RATE caps requests (boots) per second in all, for a load
 * below capacity; LOADCLIENT_SOURCE binds the client's address (e.g. 127.0.0.2).
 * prints one JSON object: requests, errors, statuses, latency percentiles, a per-second
 * timeline and the client's own CPU seconds (getrusage), so a caller can tell whether the
 * client was the bottleneck.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_SECONDS 3600
#define MAX_SAMPLES (1 << 22)

static const char *host;
static int port;
static double duration;
static int keepalive;
static int boot_mode;
static double pace; /* seconds between one thread's requests (0: as fast as answered) */
static const char *source_ip;
static long retries, permanent_failures, unfinished;
static SSL_CTX *ctx;
static char request[8192];
static size_t request_len;
static double t_start;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static float *latencies; /* ms */
static long n_lat;
static long ok_count, err_count, bytes_total, resumed;
static long status_200, status_other;
static long per_sec_ok[MAX_SECONDS], per_sec_err[MAX_SECONDS];
static float *per_sec_lat[MAX_SECONDS];
static long per_sec_n[MAX_SECONDS], per_sec_cap[MAX_SECONDS];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void record(double started, int ok, long body) {
    double t = now();
    int sec = (int)(t - t_start);
    if (sec >= MAX_SECONDS) sec = MAX_SECONDS - 1;
    float ms = (float)((t - started) * 1000.0);
    pthread_mutex_lock(&lock);
    if (ok) {
        ok_count++;
        bytes_total += body;
        if (n_lat < MAX_SAMPLES) latencies[n_lat++] = ms;
        per_sec_ok[sec]++;
        if (per_sec_n[sec] == per_sec_cap[sec]) {
            per_sec_cap[sec] = per_sec_cap[sec] ? per_sec_cap[sec] * 2 : 256;
            per_sec_lat[sec] = realloc(per_sec_lat[sec], per_sec_cap[sec] * sizeof(float));
        }
        per_sec_lat[sec][per_sec_n[sec]++] = ms;
    } else {
        err_count++;
        per_sec_err[sec]++;
    }
    pthread_mutex_unlock(&lock);
}

static int tcp_connect(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (source_ip) {
        struct sockaddr_in local = {.sin_family = AF_INET, .sin_port = 0};
        inet_pton(AF_INET, source_ip, &local.sin_addr);
        if (bind(fd, (struct sockaddr *)&local, sizeof local) < 0) {
            close(fd);
            return -1;
        }
    }
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &addr.sin_addr);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Read one response; returns body length, or -1 on error. *status gets the HTTP status;
 * *closes is set when the server said Connection: close. */
static long read_response(SSL *ssl, int *status, int *closes) {
    static __thread char buf[65536];
    size_t have = 0;
    char *end = NULL;
    while (!end) {
        if (have == sizeof buf) return -1;
        int n = SSL_read(ssl, buf + have, (int)(sizeof buf - have));
        if (n <= 0) return -1;
        have += n;
        buf[have < sizeof buf ? have : sizeof buf - 1] = 0;
        end = memmem(buf, have, "\r\n\r\n", 4);
    }
    size_t head_len = end - buf + 4;
    if (sscanf(buf, "HTTP/1.%*d %d", status) != 1) return -1;
    long length = -1;
    *closes = 0;
    for (char *line = buf; line < end; ) {
        char *next = memmem(line, end - line + 2, "\r\n", 2);
        if (!next) break;
        if (strncasecmp(line, "content-length:", 15) == 0) length = strtol(line + 15, NULL, 10);
        if (strncasecmp(line, "connection:", 11) == 0 && memmem(line, next - line, "close", 5)) *closes = 1;
        line = next + 2;
    }
    long body = (long)(have - head_len);
    if (length < 0) { /* read to EOF */
        int n;
        while ((n = SSL_read(ssl, buf, sizeof buf)) > 0) body += n;
        *closes = 1;
        return body;
    }
    while (body < length) {
        int n = SSL_read(ssl, buf, (int)(sizeof buf < (size_t)(length - body) ? sizeof buf : (size_t)(length - body)));
        if (n <= 0) return -1;
        body += n;
    }
    return body;
}

static SSL *tls_open(int *fd_out) {
    int fd = tcp_connect();
    if (fd < 0) return NULL;
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    /* The SNI name: a front proxy routes on it (LOADCLIENT_SNI, e.g. `python -m bench proxy`). */
    const char *sni = getenv("LOADCLIENT_SNI");
    SSL_set_tlsext_host_name(ssl, (char *)(sni && *sni ? sni : "127.0.0.1"));
    if (SSL_connect(ssl) != 1) {
        SSL_free(ssl);
        close(fd);
        return NULL;
    }
    if (SSL_session_reused(ssl)) __sync_fetch_and_add(&resumed, 1);
    *fd_out = fd;
    return ssl;
}

static void tls_close(SSL *ssl, int fd) {
    SSL_shutdown(ssl);
    SSL_free(ssl);
    close(fd);
}

/* One attempt on a fresh connection: the HTTP status, or -1 when no response came. */
static int attempt(long *body_out) {
    int fd;
    SSL *ssl = tls_open(&fd);
    if (!ssl) return -1;
    int status = -1, closes = 0;
    long body = -1;
    if (SSL_write(ssl, request, (int)request_len) == (int)request_len) body = read_response(ssl, &status, &closes);
    tls_close(ssl, fd);
    *body_out = body;
    return body >= 0 ? status : -1;
}

static void *boot_worker(void *arg) {
    (void)arg;
    double next = now();
    while (now() - t_start < duration) {
        if (pace > 0) {
            double wait = next - now();
            if (wait > 0) usleep((useconds_t)(wait * 1e6));
            next += pace;
        }
        double started = now(), delay = 0.2;
        for (;;) {
            long body = -1;
            int status = attempt(&body);
            if (status > 0) __sync_fetch_and_add(status == 200 ? &status_200 : &status_other, 1);
            if (status == 200) {
                record(started, 1, body);
                break;
            }
            if (status >= 400 && status < 500) { /* the real client gives up on any 4xx */
                __sync_fetch_and_add(&permanent_failures, 1);
                record(started, 0, 0);
                break;
            }
            if (now() - t_start > duration + 60) { /* still retrying a minute after the end */
                __sync_fetch_and_add(&unfinished, 1);
                break;
            }
            __sync_fetch_and_add(&retries, 1);
            usleep((useconds_t)(delay * 1e6));
            delay = delay * 2 > 5 ? 5 : delay * 2;
        }
    }
    return NULL;
}

static void *worker(void *arg) {
    (void)arg;
    if (boot_mode) return boot_worker(arg);
    SSL *ssl = NULL;
    int fd = -1;
    while (now() - t_start < duration) {
        double started = now();
        if (!ssl) {
            ssl = tls_open(&fd);
            if (!ssl) {
                record(started, 0, 0);
                usleep(10000);
                continue;
            }
        }
        if (pace > 0) usleep((useconds_t)(pace * 1e6));
        int status = 0, closes = 0;
        long body = -1;
        if (SSL_write(ssl, request, (int)request_len) == (int)request_len) body = read_response(ssl, &status, &closes);
        int ok = body >= 0 && status == 200;
        if (body >= 0) __sync_fetch_and_add(status == 200 ? &status_200 : &status_other, 1);
        record(started, ok, body);
        if (!keepalive || closes || body < 0) {
            tls_close(ssl, fd);
            ssl = NULL;
        }
    }
    if (ssl) tls_close(ssl, fd);
    return NULL;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double pct(float *v, long n, double q) {
    if (n == 0) return -1;
    long i = (long)(q * n);
    if (i >= n) i = n - 1;
    return v[i];
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: %s HOST PORT CAFILE SECONDS CONNECTIONS close|keepalive|boot PATH [HEADER ...]\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN); /* a server killed mid-response is a failed attempt, not the client's end */
    host = argv[1];
    port = atoi(argv[2]);
    const char *cafile = argv[3];
    duration = atof(argv[4]);
    int connections = atoi(argv[5]);
    keepalive = strcmp(argv[6], "keepalive") == 0;
    boot_mode = strcmp(argv[6], "boot") == 0;
    source_ip = getenv("LOADCLIENT_SOURCE");
    const char *rate = getenv("LOADCLIENT_RATE");
    if (rate && atof(rate) > 0) pace = connections / atof(rate);
    int off = snprintf(request, sizeof request, "GET %s HTTP/1.1\r\nHost: %s:%d\r\n%s", argv[7], host, port,
                       keepalive ? "" : "Connection: close\r\n");
    for (int i = 8; i < argc; i++) off += snprintf(request + off, sizeof request - off, "%s\r\n", argv[i]);
    off += snprintf(request + off, sizeof request - off, "\r\n");
    request_len = off;
    latencies = malloc(sizeof(float) * MAX_SAMPLES);

    ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* Never resume: no client session cache, no tickets. */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    /* CAFILE "-": no certificate verification, so the client spends its CPU on the handshake
     * the server also pays (ECDHE), not on an ECDSA verify the server never does. */
    if (strcmp(cafile, "-") != 0) {
        if (SSL_CTX_load_verify_locations(ctx, cafile, NULL) != 1) {
            fprintf(stderr, "cannot load CA %s\n", cafile);
            return 2;
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    }

    pthread_t *threads = calloc(connections, sizeof(pthread_t));
    t_start = now();
    for (int i = 0; i < connections; i++) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        pthread_create(&threads[i], &attr, worker, NULL);
    }
    for (int i = 0; i < connections; i++) pthread_join(threads[i], NULL);
    double elapsed = now() - t_start;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;

    qsort(latencies, n_lat, sizeof(float), cmp_float);
    printf("{\"elapsed_s\": %.3f, \"requests\": %ld, \"errors\": %ld, \"status_200\": %ld, \"status_other\": %ld, "
           "\"resumed_sessions\": %ld, \"bytes\": %ld, \"rps\": %.1f, \"p50_ms\": %.2f, \"p99_ms\": %.2f, "
           "\"client_cpu_s\": %.3f, \"client_cpu_share\": %.3f, \"retries\": %ld, \"permanent_failures\": %ld, "
           "\"unfinished\": %ld, \"timeline\": [",
           elapsed, ok_count, err_count, status_200, status_other, resumed, bytes_total, ok_count / elapsed,
           pct(latencies, n_lat, 0.5), pct(latencies, n_lat, 0.99), cpu, cpu / elapsed, retries, permanent_failures,
           unfinished);
    int last = (int)elapsed;
    if (last >= MAX_SECONDS) last = MAX_SECONDS - 1;
    for (int s = 0; s <= last; s++) {
        qsort(per_sec_lat[s], per_sec_n[s], sizeof(float), cmp_float);
        printf("%s[%d, %ld, %ld, %.2f, %.2f]", s ? ", " : "", s, per_sec_ok[s], per_sec_err[s],
               pct(per_sec_lat[s], per_sec_n[s], 0.5), pct(per_sec_lat[s], per_sec_n[s], 0.99));
    }
    printf("]}\n");
    return 0;
}
