//! The table the demo ends with: a row per step that passed or was skipped (a failed
//! step has its `FAILED` line and the verdict instead).

/// One line of the final table.
pub struct Row {
    /// The step, and the service it used.
    pub service: &'static str,
    /// Clients (connections or processes) the step ran at once.
    pub clients: usize,
    /// What the clients did.
    pub operations: String,
    /// What was checked, and how much of it held.
    pub verified: String,
    /// How long the step took (set by the verifier).
    pub secs: f64,
}

/// Prints the table's header and a line per row.
pub fn print(rows: &[Row]) {
    println!("{}", header());
    for r in rows {
        println!("{}", line(r));
    }
}

fn header() -> String {
    format!(
        "{:<8} {:>7}  {:<38} {:<26} {:>6}",
        "service", "clients", "operations", "verified", "time"
    )
}

fn line(r: &Row) -> String {
    format!(
        "{:<8} {:>7}  {:<38} {:<26} {:>5.1}s",
        r.service, r.clients, r.operations, r.verified, r.secs
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout readers of the demo's output rely on.
    #[test]
    fn columns() {
        let row = Row {
            service: "echo",
            clients: 100,
            operations: "2000 round trips, 24.6 MiB".into(),
            verified: "2000/2000 replies".into(),
            secs: 1.25,
        };
        assert_eq!(
            header(),
            "service  clients  operations                             verified                     time"
        );
        assert_eq!(
            line(&row),
            "echo         100  2000 round trips, 24.6 MiB             2000/2000 replies            1.2s"
        );
    }
}
