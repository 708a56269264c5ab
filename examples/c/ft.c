/* ft: uploads a file to a server's `files` service and prints the verdict, the way a
 * lab's own transfer tool would (the Rust `ft` does more: fetch, delete, progress).
 *
 *   cc -Wall -Werror ft.c $(pkg-config --cflags --libs rdmactor) -o ft
 *   ./ft 192.0.2.1:7471 big.iso [KEY_FILE]
 *
 * Prints `GOOD big.iso sha256:HEX BYTES` (the digest is what sha256sum prints) and
 * exits 0 only then. */
#include <rdmactor.h>
#include <stdio.h>

static int fail(const char *what, int rc) {
    fprintf(stderr, "ft: %s: %s: %s\n", what, rdmactor_status_name(rc), rdmactor_last_error());
    return 2;
}

int main(int argc, char **argv) {
    static const char *verdicts[] = {"GOOD", "BAD", "REJECTED", "ABORTED"};
    if (argc < 3) {
        fprintf(stderr, "usage: ft ADDR:PORT FILE [KEY_FILE]\n");
        return 2;
    }
    rdmactor_ctx ctx;
    rdmactor_conn conn;
    rdmactor_file_result r;
    int rc = rdmactor_ctx_new(&ctx);
    if (rc != RDMACTOR_OK) return fail("starting", rc);
    /* The key file proves an identity to a server that asks (NULL: anonymous). */
    rc = rdmactor_connect(ctx, argv[1], "files", argc > 3 ? argv[3] : NULL, 10000, &conn);
    if (rc != RDMACTOR_OK) return fail("connecting to files", rc);
    /* NULL name: stored under the path's file name. No timeout: as long as it takes. */
    rc = rdmactor_file_send(conn, argv[2], NULL, 0, &r, 0);
    if (rc != RDMACTOR_OK) return fail(argv[2], rc);
    if (r.verdict == RDMACTOR_VERDICT_GOOD)
        printf("GOOD %s sha256:%s %llu\n", argv[2], r.sha256_hex, (unsigned long long)r.bytes);
    else
        printf("%s %s: %s\n", verdicts[r.verdict], argv[2], r.reason);
    rdmactor_close(conn);
    rdmactor_ctx_free(ctx);
    return r.verdict == RDMACTOR_VERDICT_GOOD ? 0 : 1;
}
