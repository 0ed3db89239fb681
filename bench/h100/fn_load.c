// HTTP/1.1 load generator of bench/h100/functions.sh: CLIENTS threads, each one
// keep-alive connection sending the same POST back to back; latency p50/p99 and rate.
//
//   fn_load HOST PORT PATH BODY_FILE CONTENT_TYPE TOKEN CLIENTS SECONDS [WARMUP_SECONDS]
//
// TOKEN `-` sends no Authorization header. Prints `requests N`, `errors N`,
// `rps X`, `p50_us X`, `p99_us X`, `mean_us X`, `reconnects N`, and the first
// failure's status line and body (`first_error ...`). Written in C so that the
// client costs a few microseconds a request and the server is what is measured:
// a Python client holds the GIL for tens of microseconds a request, as much as
// the invocations it would time.
// Build: cc -O2 -pthread -o fn_load fn_load.c
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *host, *port;
static char *request;
static size_t request_len;
static double t_measure, t_end;
static pthread_mutex_t first_lock = PTHREAD_MUTEX_INITIALIZER;
static char first_error[512];

struct client {
    pthread_t thread;
    double *lat;
    size_t n, cap;
    long errors, reconnects;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int dial(void) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0) return -1;
    int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

// A connection's receive buffer: bytes [start, end) not yet consumed.
struct rbuf {
    char *data;
    size_t start, end, cap;
};

static int fill(int fd, struct rbuf *b) {
    if (b->start > 0 && b->start == b->end) b->start = b->end = 0;
    if (b->end == b->cap) {
        if (b->start > 0) {
            memmove(b->data, b->data + b->start, b->end - b->start);
            b->end -= b->start;
            b->start = 0;
        } else {
            b->cap *= 2;
            b->data = realloc(b->data, b->cap);
            if (!b->data) return -1;
        }
    }
    ssize_t r;
    do r = recv(fd, b->data + b->end, b->cap - b->end, 0);
    while (r < 0 && errno == EINTR);
    if (r <= 0) return -1;
    b->end += (size_t)r;
    return 0;
}

// Skips `n` body bytes (reading more as needed).
static int skip(int fd, struct rbuf *b, size_t n) {
    while (n) {
        if (b->start == b->end && fill(fd, b)) return -1;
        size_t have = b->end - b->start, take = have < n ? have : n;
        b->start += take;
        n -= take;
    }
    return 0;
}

// A line ending in CRLF at b->start: its length without the CRLF.
static long line(int fd, struct rbuf *b) {
    for (;;) {
        char *p = memmem(b->data + b->start, b->end - b->start, "\r\n", 2);
        if (p) return p - (b->data + b->start);
        if (fill(fd, b)) return -1;
    }
}

// Reads one response; returns its status (0 on a broken connection); keeps
// the first non-200 status line and body in first_error.
static int response(int fd, struct rbuf *b) {
    char *head_end;
    for (;;) {
        head_end = memmem(b->data + b->start, b->end - b->start, "\r\n\r\n", 4);
        if (head_end) break;
        if (fill(fd, b)) return 0;
    }
    char *head = b->data + b->start;
    size_t head_len = (size_t)(head_end - head) + 4;
    int status = 0;
    if (sscanf(head, "HTTP/1.%*d %d", &status) != 1) return 0;
    long length = -1;
    int chunked = 0;
    for (char *p = head; p < head_end;) {
        char *eol = memmem(p, (size_t)(head_end + 2 - p), "\r\n", 2);
        if (!eol) break;
        if (!strncasecmp(p, "content-length:", 15)) length = strtol(p + 15, NULL, 10);
        if (!strncasecmp(p, "transfer-encoding:", 18) && memmem(p, (size_t)(eol - p), "chunked", 7))
            chunked = 1;
        p = eol + 2;
    }
    char status_line[128];
    snprintf(status_line, sizeof status_line, "%.*s", (int)(strchr(head, '\r') - head), head);
    b->start += head_len;
    size_t body_at = b->start;
    if (chunked) {
        for (;;) {
            long n = line(fd, b);
            if (n < 0) return 0;
            long size = strtol(b->data + b->start, NULL, 16);
            b->start += (size_t)n + 2;
            if (skip(fd, b, (size_t)size)) return 0;
            if (line(fd, b) < 0) return 0;  // the chunk's CRLF
            b->start += 2;
            if (size == 0) break;
        }
    } else if (length > 0) {
        if (status != 200) {  // keep the start of the body for the message
            while (b->end - b->start < (size_t)(length < 300 ? length : 300))
                if (fill(fd, b)) return 0;
            body_at = b->start;
        }
        if (status != 200) {
            pthread_mutex_lock(&first_lock);
            if (!first_error[0])
                snprintf(first_error, sizeof first_error, "%s: %.*s", status_line,
                         (int)(length < 300 ? length : 300), b->data + body_at);
            pthread_mutex_unlock(&first_lock);
        }
        if (skip(fd, b, (size_t)length)) return 0;
        return status;
    }
    if (status != 200) {
        pthread_mutex_lock(&first_lock);
        if (!first_error[0]) snprintf(first_error, sizeof first_error, "%s", status_line);
        pthread_mutex_unlock(&first_lock);
    }
    return status;
}

static void *run(void *arg) {
    struct client *c = arg;
    struct rbuf b = {malloc(1 << 16), 0, 0, 1 << 16};
    int fd = dial();
    while (fd >= 0 || (fd = dial()) >= 0) {
        double t0 = now();
        if (t0 >= t_end) break;
        int status = 0;
        if (send_all(fd, request, request_len) == 0) status = response(fd, &b);
        double t1 = now();
        if (status == 0) {  // the connection broke: another, counted
            close(fd);
            fd = -1;
            b.start = b.end = 0;
            c->reconnects++;
            if (c->reconnects > 1000) break;
        }
        if (t0 < t_measure) continue;
        if (status != 200) {
            c->errors++;
            continue;
        }
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 1 << 16;
            c->lat = realloc(c->lat, c->cap * sizeof *c->lat);
            if (!c->lat) exit(3);
        }
        c->lat[c->n++] = (t1 - t0) * 1e6;
    }
    if (fd >= 0) close(fd);
    free(b.data);
    return NULL;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 9) {
        fprintf(stderr, "usage: %s HOST PORT PATH BODY_FILE CONTENT_TYPE TOKEN CLIENTS SECONDS [WARMUP]\n", argv[0]);
        return 64;
    }
    host = argv[1];
    port = argv[2];
    const char *path = argv[3], *type = argv[5], *token = argv[6];
    int clients = atoi(argv[7]);
    double seconds = atof(argv[8]), warmup = argc > 9 ? atof(argv[9]) : 1.0;
    FILE *f = fopen(argv[4], "rb");
    if (!f) {
        perror(argv[4]);
        return 66;
    }
    fseek(f, 0, SEEK_END);
    long body_len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char auth[512] = "";
    if (strcmp(token, "-")) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", token);
    char head[2048];
    int head_len = snprintf(head, sizeof head,
                            "POST %s HTTP/1.1\r\nHost: %s:%s\r\n%sContent-Type: %s\r\nAccept: %s\r\n"
                            "Content-Length: %ld\r\n\r\n",
                            path, host, port, auth, type, type, body_len);
    request_len = (size_t)head_len + (size_t)body_len;
    request = malloc(request_len);
    memcpy(request, head, (size_t)head_len);
    if (fread(request + head_len, 1, (size_t)body_len, f) != (size_t)body_len) {
        perror("fread");
        return 66;
    }
    fclose(f);

    double t0 = now();
    t_measure = t0 + warmup;
    t_end = t_measure + seconds;
    struct client *cs = calloc((size_t)clients, sizeof *cs);
    for (int i = 0; i < clients; i++) pthread_create(&cs[i].thread, NULL, run, &cs[i]);
    size_t total = 0;
    long errors = 0, reconnects = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(cs[i].thread, NULL);
        total += cs[i].n;
        errors += cs[i].errors;
        reconnects += cs[i].reconnects;
    }
    double *all = malloc((total ? total : 1) * sizeof *all), sum = 0;
    size_t k = 0;
    for (int i = 0; i < clients; i++)
        for (size_t j = 0; j < cs[i].n; j++) sum += (all[k++] = cs[i].lat[j]);
    qsort(all, total, sizeof *all, by_value);
    printf("requests %zu\nerrors %ld\nreconnects %ld\nrps %.1f\n", total, errors, reconnects,
           total / seconds);
    if (total) {
        size_t p99 = (size_t)(0.99 * total);
        printf("p50_us %.1f\np99_us %.1f\nmean_us %.1f\n", all[total / 2],
               all[p99 < total ? p99 : total - 1], sum / total);
    }
    if (first_error[0]) printf("first_error %s\n", first_error);
    return 0;
}
