//! Protocol logic with no I/O: wire framing, connect-time hello, credit flow control,
//! rendezvous budgets.
//! The connection and CM actors drive these; they are unit-tested without RDMA.

pub mod budget;
pub mod credits;
pub mod frame;
pub mod hello;
pub mod oob;
