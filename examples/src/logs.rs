//! Logging for the binaries: to stderr, because their stdout carries the lines scripts
//! and tests parse (`RESULT`, `GOOD`, `OPEN`, ...).

/// Sends logs to stderr, filtered by `RUST_LOG` or else by `default` (`"info"`, `"warn"`,
/// ...). Call it once, first thing in `main`.
pub fn init(default: &str) {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default.into()),
        )
        .init();
}
