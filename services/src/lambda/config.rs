//! The service's limits.

use std::time::Duration;

use super::sandbox::Limits;

/// The service's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LambdaConfig {
    /// Caps every invocation's limits, field by field (and is used when the client asks
    /// for none).
    pub cap: Limits,
    /// Largest input an invocation may name, in bytes.
    pub max_input: usize,
    /// Jobs (uploads and invocations) one connection may have under way.
    pub max_jobs_per_connection: usize,
    /// Job threads the whole service may run at once (native lambdas have no other
    /// bound; modules are also bounded by the sandbox's `max_workers`).
    pub max_jobs: usize,
    /// The least wall clock an invocation gets, whatever the client asks for (at most
    /// `cap.wall_clock`). Without a floor, `wall_clock_ms = 0` made every invocation a
    /// free instant timeout: the client's job slot came back at once while work was
    /// still being set up and torn down, so one client could keep the workers busy.
    pub min_wall_clock: Duration,
    /// Bytes of input one RDMA READ fetches: inputs larger than this are read in chunks
    /// (at most the largest pool class, so that chunks use pooled buffers, not a
    /// registration each).
    pub read_chunk: usize,
    /// Chunk READs one invocation keeps in flight.
    pub reads_in_flight: usize,
    /// Chunk READs the whole service keeps in flight, across its connections; more
    /// wait in line, first come first served. Everything else on the link (a polite
    /// client's request, its small input) waits behind the bytes in flight: on
    /// Soft-RoCE, with 16 inputs × 4 READs of 1 MiB in flight a 4 KiB invocation waited
    /// 8-10 s; with 4 READs across the service, about 0.4 s.
    pub max_reads_in_flight: usize,
    /// Bytes of input the service's running jobs may hold together (a job alone may
    /// always run, and an input of at most `read_chunk` bytes needs only a slot: the
    /// slots bound those). Kept under the server's heap budget, so that a full service refuses
    /// in its own line, by turn, rather than at the heap, where any client's input is
    /// refused alike.
    pub max_input_running: usize,
    /// Jobs that may wait for a slot (or for room for their input), served in turn by
    /// tenant: a proved identity, else the client's address. Past it, the tenant with
    /// the most waiting gives up its newest.
    pub max_waiting_jobs: usize,
    /// How long a job waits in line before it is refused `Busy`.
    pub job_wait: Duration,
}

impl Default for LambdaConfig {
    /// [`Limits::default`] as the cap, 16 MiB inputs, 4 jobs per connection, 64 in all,
    /// at least 10 ms of wall clock per invocation, inputs read 1 MiB at a time with 4
    /// READs in flight (4 across the service); 256 MiB of inputs running (half the
    /// server's default heap budget), 1,024 jobs in line, each waiting at most 2 s.
    fn default() -> Self {
        LambdaConfig {
            cap: Limits::default(),
            max_input: 16 << 20,
            max_jobs_per_connection: 4,
            max_jobs: 64,
            min_wall_clock: Duration::from_millis(10),
            read_chunk: 1 << 20,
            reads_in_flight: 4,
            max_reads_in_flight: 4,
            max_input_running: 256 << 20,
            max_waiting_jobs: 1024,
            job_wait: Duration::from_secs(2),
        }
    }
}
