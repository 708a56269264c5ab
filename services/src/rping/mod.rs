//! Server side of the rdma-core `rping` test protocol, so that the stock
//! `rping -c` client can be pointed at an rdmactor server.
//!
//! # The protocol
//!
//! `rping` uses one reliable-connected queue pair and three kinds of
//! operation. The only message format is a 16-byte "buffer advert": a 64-bit
//! virtual address, a 32-bit rkey and a 32-bit length, all big-endian, with
//! no padding and no type tag. Nothing on the wire says whether an advert
//! names the client's source or its sink buffer; both sides infer it from
//! where they are in the cycle.
//!
//! One ping goes like this:
//!
//! 1. The client fills its source buffer with a text line
//!    (`"rdma-ping-N: "` followed by rotating letters, NUL in the last byte)
//!    and SENDs an advert for it.
//! 2. The server RDMA READs the advertised number of bytes into its own
//!    registered buffer.
//! 3. When the READ has completed, the server SENDs a 16-byte "go ahead".
//!    The stock server never fills in its send buffer, so these are 16 zero
//!    bytes; the client checks only that exactly 16 bytes arrived.
//! 4. The client SENDs an advert for its sink buffer.
//! 5. The server RDMA WRITEs what it read back to the sink. The stock server
//!    writes `strlen(buffer) + 1` bytes, which for the stock client is the
//!    whole advertised size, because its only NUL is the last byte.
//! 6. When the WRITE has completed, the server SENDs another 16-zero-byte
//!    "go ahead". With `-V` the client now compares sink and source.
//!
//! The cycle then starts again, until the client has done its `-C` count and
//! disconnects. No message marks the end of a session.
//!
//! [`RpingSession`] holds only this cycle. It does no I/O, so the connection
//! actor owns the queue pair, the registered buffer and the disconnect.

mod machine;
mod service;

pub use machine::*;
pub use service::Rping;
