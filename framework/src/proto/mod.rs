//! Protocol logic with no I/O: wire framing, connect-time hello, credit flow control.
//! The connection and CM actors drive these; they are unit-tested without RDMA.

pub mod credits;
pub mod frame;
pub mod hello;
