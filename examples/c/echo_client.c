/* echo_client: calls a server's `echo` service from C.
 *
 *   cc -Wall -Werror echo_client.c $(pkg-config --cflags --libs rdmactor) -o echo_client
 *   ./echo_client 192.0.2.1:7471 "hello"          one request, its reply printed
 *   ./echo_client 192.0.2.1:7471 "" 10000 64      10000 round trips of 64 bytes, timed
 *   ./echo_client --seeds 192.0.2.1:7471,192.0.2.2:7471 "hello"
 *                         any server of a cluster (`server --cluster`) the seeds list
 *
 * `echo` takes a postcard-encoded struct { payload: bytes }, which is the payload's
 * length as a LEB128 varint and then the payload; its reply has the same encoding. */
#include <rdmactor.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t put_varint(uint8_t *out, size_t n) {
    size_t i = 0;
    for (; n >= 0x80; n >>= 7) out[i++] = (uint8_t)(n | 0x80);
    out[i++] = (uint8_t)n;
    return i;
}

static int fail(const char *what, int rc) {
    fprintf(stderr, "echo_client: %s: %s: %s\n", what, rdmactor_status_name(rc), rdmactor_last_error());
    return 1;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int seeds = argc > 1 && strcmp(argv[1], "--seeds") == 0;
    if (seeds) argc--, argv++;
    const char *addr = argc > 1 ? argv[1] : "192.0.2.1:7471";
    const char *text = argc > 2 ? argv[2] : "hello from C";
    long rounds = argc > 3 ? atol(argv[3]) : 1;
    size_t len = argc > 4 ? (size_t)atol(argv[4]) : strlen(text);
    uint8_t *req = calloc(len + 10, 1), *reply = malloc(len + 10);
    double *us = calloc(rounds > 0 ? (size_t)rounds : 1, sizeof *us);
    size_t head = put_varint(req, len), reply_len = 0;
    memcpy(req + head, text, strlen(text) < len ? strlen(text) : len);

    rdmactor_ctx ctx;
    rdmactor_conn conn;
    int rc = rdmactor_ctx_new(&ctx);
    if (rc != RDMACTOR_OK) return fail("rdmactor_ctx_new", rc);
    rc = seeds ? rdmactor_connect_cluster(ctx, addr, "echo", NULL, 20000, &conn)
               : rdmactor_connect(ctx, addr, "echo", NULL, 5000, &conn);
    if (rc != RDMACTOR_OK) return fail(seeds ? "rdmactor_connect_cluster" : "rdmactor_connect", rc);
    for (long i = 0; i < rounds; i++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rc = rdmactor_request(conn, req, head + len, reply, len + 10, &reply_len, 5000);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (rc != RDMACTOR_OK) return fail("rdmactor_request", rc);
        if (reply_len != head + len || memcmp(reply, req, reply_len) != 0) {
            fprintf(stderr, "echo_client: the reply differs from the request\n");
            return 1;
        }
        us[i] = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
    }
    if (rounds == 1) {
        printf("echo: %.*s\n", (int)(reply_len - head), (const char *)reply + head);
    } else if (rounds > 1) {
        qsort(us, (size_t)rounds, sizeof *us, by_value);
        printf("RESULT kind=c-echo size=%zu rounds=%ld p50_us=%.1f p99_us=%.1f\n", len, rounds,
               us[rounds / 2], us[rounds * 99 / 100]);
    }
    rc = rdmactor_close(conn);
    if (rc != RDMACTOR_OK) return fail("rdmactor_close", rc);
    rc = rdmactor_ctx_free(ctx);
    if (rc != RDMACTOR_OK) return fail("rdmactor_ctx_free", rc);
    free(req);
    free(reply);
    free(us);
    return 0;
}
