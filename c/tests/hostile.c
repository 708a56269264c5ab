/* A hostile caller: NULL handles and pointers, made-up handles, a closed handle used
 * again, a buffer too small for a reply, double close and double free. Every one must
 * be an error code (never a crash), and the library must say why.
 *
 *   hostile                  the checks that need no RDMA device
 *   hostile ADDR:PORT        all of them, against a server's `echo` service
 *
 * Prints `ok NAME` per check, `skip NAME: why` for those it cannot run, and
 * `hostile: N ok, M failed`; exits 1 if any failed. */
#include <rdmactor.h>
#include <stdio.h>
#include <string.h>

static int ok_count, failed;

static void expect(const char *name, int got, int want) {
    if (got == want) {
        ok_count++;
        printf("ok %s\n", name);
    } else {
        failed++;
        printf("FAIL %s: %s, expected %s (%s)\n", name, rdmactor_status_name(got),
               rdmactor_status_name(want), rdmactor_last_error());
    }
}

static void expect_true(const char *name, int cond) {
    expect(name, cond ? RDMACTOR_OK : RDMACTOR_INTERNAL, RDMACTOR_OK);
}

int main(int argc, char **argv) {
    rdmactor_ctx zero_ctx = {0}, made_up_ctx = {0xC7000001deadbeefULL}, ctx;
    rdmactor_conn zero_conn = {0}, made_up_conn = {0xC000000100000007ULL}, conn;
    uint8_t buf[16] = {0};
    size_t len = 0;
    int fd = -1;

    expect("a NULL out-parameter to ctx_new", rdmactor_ctx_new(NULL), RDMACTOR_INVALID_ARGUMENT);
    expect_true("last_error names the NULL", strstr(rdmactor_last_error(), "NULL") != NULL);
    expect("free of a zero context", rdmactor_ctx_free(zero_ctx), RDMACTOR_BAD_HANDLE);
    expect("free of a made-up context", rdmactor_ctx_free(made_up_ctx), RDMACTOR_BAD_HANDLE);
    expect("fd of a zero context", rdmactor_ctx_fd(zero_ctx, &fd), RDMACTOR_BAD_HANDLE);
    expect("close of a zero connection", rdmactor_close(zero_conn), RDMACTOR_BAD_HANDLE);
    expect("request on a made-up connection",
           rdmactor_request(made_up_conn, buf, 1, buf, sizeof buf, &len, 100), RDMACTOR_BAD_HANDLE);
    expect("request with a NULL length out-parameter",
           rdmactor_request(zero_conn, buf, 1, buf, sizeof buf, NULL, 100), RDMACTOR_INVALID_ARGUMENT);
    expect("send of NULL bytes with a length", rdmactor_send(zero_conn, NULL, 8, 100),
           RDMACTOR_INVALID_ARGUMENT);
    expect("read with a NULL region name",
           rdmactor_read(zero_conn, NULL, 0, buf, sizeof buf, &len, NULL, 100), RDMACTOR_INVALID_ARGUMENT);
    expect_true("an unknown status has a name", strcmp(rdmactor_status_name(-7), "RDMACTOR_UNKNOWN") == 0);

    int rc = rdmactor_ctx_new(&ctx);
    if (rc != RDMACTOR_OK) {
        printf("skip the checks that need a context: %s: %s\n", rdmactor_status_name(rc), rdmactor_last_error());
    } else {
        expect("connect with a NULL service", rdmactor_connect(ctx, "192.0.2.1:7471", NULL, NULL, 100, &conn),
               RDMACTOR_INVALID_ARGUMENT);
        expect("connect to an address that does not parse",
               rdmactor_connect(ctx, "not an address", "echo", NULL, 100, &conn), RDMACTOR_INVALID_ARGUMENT);
        expect("a context as a connection", rdmactor_close((rdmactor_conn){ctx.id}), RDMACTOR_BAD_HANDLE);
        if (argc < 2) {
            printf("skip the checks that need a server: no ADDR:PORT given\n");
        } else if ((rc = rdmactor_connect(ctx, argv[1], "echo", NULL, 5000, &conn)) != RDMACTOR_OK) {
            expect("connect to the echo service", rc, RDMACTOR_OK);
        } else {
            /* echo's request: a varint length, then the payload (100 bytes of 'x'). */
            uint8_t req[101];
            req[0] = 100;
            memset(req + 1, 'x', 100);
            expect("a reply larger than the buffer",
                   rdmactor_request(conn, req, sizeof req, buf, sizeof buf, &len, 5000), RDMACTOR_BUFFER_TOO_SMALL);
            expect_true("the length it needs", len == sizeof req);
            uint8_t small[4] = {3, 'a', 'b', 'c'};
            expect("the connection goes on", rdmactor_request(conn, small, 4, buf, sizeof buf, &len, 5000), RDMACTOR_OK);
            expect("close", rdmactor_close(conn), RDMACTOR_OK);
            expect("a closed connection used again",
                   rdmactor_request(conn, req, sizeof req, buf, sizeof buf, &len, 5000), RDMACTOR_BAD_HANDLE);
            expect("a second close", rdmactor_close(conn), RDMACTOR_BAD_HANDLE);
        }
        expect("free", rdmactor_ctx_free(ctx), RDMACTOR_OK);
        expect("a second free", rdmactor_ctx_free(ctx), RDMACTOR_BAD_HANDLE);
        expect("fd of a freed context", rdmactor_ctx_fd(ctx, &fd), RDMACTOR_BAD_HANDLE);
    }
    printf("hostile: %d ok, %d failed\n", ok_count, failed);
    return failed ? 1 : 0;
}
