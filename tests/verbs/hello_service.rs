//! `examples/hello_service.rs`, the README's first service, on real verbs: the same
//! code that runs over loopback natively (`scripts/test` runs that), with `--verbs`.

use std::process::Command;

use rdmactor_tests::{assert_released, rdma_context, resource_counts, target_bin, test_addr};

#[test]
fn hello_service_runs_unchanged_over_verbs() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let mut addr = test_addr();
    addr.set_port(7391);
    let bin = target_bin("examples/hello_service");
    let out = Command::new(&bin)
        .args(["--verbs", &addr.to_string()])
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e} (scripts/test builds it)", bin.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} exited {}\n{stdout}\n{}",
        bin.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "hello, ada (visit 1)",
            "hello, grace (visit 1)",
            "hello, ada (visit 2)",
            "refused: no name given"
        ],
        "the visits are counted across connections, the handler's error reaches the client"
    );
    assert_released(&base);
}
