//! `loopback`: an in-memory RDMA transport for one process, so that rdmactor can be
//! developed and tested on any machine (issue 29, item 2).
//!
//! A [`Fabric`] holds [`Device`]s; each device registers memory ([`Mr`], windows
//! [`Mw`]), creates CQs ([`Cq`], [`Channel`]), shared receive queues ([`Srq`]), QPs
//! ([`Qp`]) and connection-manager ids ([`CmId`], [`EventChannel`]), with the verbs
//! wrapper's work requests and completions. [`Loopback`] names them for the
//! [`Transport`](super::Transport) traits. There is no NIC thread: the thread that posts
//! a request executes it, in order, and a clock thread retries what has to wait.
//!
//! # Faithful where rdmactor depends on it
//!
//! - RC ordering: a QP's requests execute and complete in the order posted.
//! - A SEND (or WRITE_WITH_IMM) that finds no receive gets RNR: it is retried after the
//!   responder's RNR timer, `rnr_retry_count` times (7: for ever), then fails with
//!   `RnrRetryExceeded` and the QP goes to the error state.
//! - WRITE, READ and atomics are checked against the rkey, the bounds and the access
//!   flags of the region or window; a failure completes with `RemoteAccessError`
//!   (misaligned atomics `RemoteInvalidRequestError`), and both QPs go to the error
//!   state, flushing the rest.
//! - WRITE_WITH_IMM consumes a receive (`RecvRdmaWithImm`, the immediate, the length).
//! - A memory window is bound to one QP: only that QP's peer can use the rkey, until
//!   the window is bound again or dropped. A window over a range of a shared region
//!   ([`Shared`]) reaches exactly that range (rxe checks the whole registration's).
//! - A shared region's in-place updates race with peers' READs word by word, so a READ
//!   can see an update half done, and the versioned layout's check is what prevents a
//!   torn value.
//! - A zero-length WRITE succeeds without any key check.
//! - A QP moved to the error state flushes its outstanding work with `WrFlushError`.
//! - A peer that vanishes without a DISCONNECT is seen only through timeouts:
//!   `RetryExceeded` after the ACK timeout × (retry count + 1).
//!
//! Fault hooks (`faults.rs`): [`Device::vanish`], [`Device::remove`],
//! [`Device::refuse_registrations`], [`Qp::stall`], [`Cq::delay_completions`].
//!
//! # Where loopback differs from a NIC
//!
//! | | a NIC (rxe, mlx5) | loopback |
//! |---|---|---|
//! | who moves bytes | the NIC, asynchronously | the posting thread, before `post_send` returns (when nothing waits) |
//! | ordering of a SEND after a READ | may pass the READ unless fenced | never passes it (stricter) |
//! | RNR retry | after the RNR timer, counted by the NIC | the same, counted by the clock thread; a receive posted meanwhile is found at the next retry |
//! | send-queue slots | freed by a later signaled completion being polled | freed when the request executes |
//! | inline data | up to the device's cap (often hundreds of bytes) | up to 64 bytes |
//! | registered memory | the application's pages, read as `&[u8]` | the transport's atomic words, reached by `read`/`write` copies; torn reads still possible |
//! | a window over part of a region | rxe: bounded by the region, not the window | bounded by the window's own range |
//! | a shared region of a file | a private mapping, pinned | the file's bytes copied in at registration |
//! | addresses and keys | virtual addresses, keys from the NIC | made-up page-aligned addresses, keys `(slot + 1) << 8 \| tag`; lkey = rkey |
//! | responder errors | an async event on the responder (`QP_ACCESS_ERR`) | the responder QP goes to the error state, no async event |
//! | disconnect | DREQ/DREP, TIMEWAIT_EXIT later | DISCONNECTED on both sides at once; no TIMEWAIT_EXIT |
//! | a requester's QP in error | its packets stop; the peer times out | the same: requests to a QP in error go unanswered |
//! | CQ overrun | async event, QPs in error | the completion is lost and `poll` fails from then on |
//! | completion channel | a file descriptor (`poll`, epoll, tokio) | a condition variable for threads (`Channel::wait`) and a `tokio::sync::Notify` for tasks (`Channel::wait_ready`); no fd |
//! | SRQ limit event | `IBV_EVENT_SRQ_LIMIT_REACHED` | not raised |
//! | private data | padded to the CM message's size | exactly what was sent |
//! | speed | wire and PCIe latency | a function call and a copy (see `docs/loopback.md`) |

mod api;
mod clock;
mod cm;
mod core;
mod cq;
mod error;
mod fabric;
mod faults;
mod keys;
mod memory;
mod mr;
mod qp;
mod responder;
mod shared;
mod srq;
mod work;

#[cfg(test)]
pub(crate) mod tests;

pub use api::Loopback;
pub use cm::{CmEvent, CmId, CmIdKey, EventChannel};
pub use core::Config;
pub use cq::{Channel, Cq, CqKey};
pub use error::{LoopbackError, Result};
pub use fabric::{Device, Fabric};
pub use mr::{Mr, Mw, Sge};
pub use qp::{connect_pair, Qp};
pub use shared::Shared;
pub use srq::Srq;
pub use work::MAX_INLINE;
