//! Services for rdmactor, each a protocol state machine (no I/O, unit-tested) driven by a
//! [`rdmactor::runtime::Session`]:
//!
//! | name | what it does |
//! |---|---|
//! | `echo` | typed request/response: answers an [`echo::EchoRequest`] with its payload |
//! | `raw-echo` | plain verbs clients: every SEND comes back byte for byte |
//! | `pingpong` | numbered pings answered with pongs; gaps or repeats end the connection |
//! | `rping` | serves rdma-core's unmodified `rping -c` client |
//! | `read` | named regions read with one-sided RDMA READs, seqlock-versioned ([`read`]) |
//! | `ingest` | records RDMA-written into a per-connection slot ring with immediates ([`ingest`]) |
//! | `lambda` | WebAssembly or native lambdas run on client-granted regions ([`lambda`]) |

/// The largest message a service whose client messages are only small control
/// messages takes (bulk data moves by one-sided operations): `files`, `read` and
/// `ingest`. A larger offer is refused before any of it moves (`Service::max_message`).
pub const CONTROL_MESSAGE_MAX: usize = 64 << 10;

pub mod echo;
pub mod file_transfer;
#[doc(hidden)]
pub mod fuzz;
pub mod ingest;
pub mod lambda;
mod owner_slot;
pub mod pingpong;
pub mod read;
pub mod rping;
