//! Memory figures of a process from `/proc/<pid>/status`, for tests that bound what a
//! server holds (in-process, or a child process such as `kv serve`).

/// One `KEY:   N kB` line of `/proc/<pid>/status` (`pid` may be `"self"`), in KiB; `None`
/// when the process or the line is gone.
pub fn status_kib(pid: &str, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The resident set of process `pid` (or `"self"`) in MiB; 0 when it cannot be read.
pub fn rss_mib(pid: &str) -> u64 {
    status_kib(pid, "VmRSS").map_or(0, |kib| kib / 1024)
}
