//! The session behind a [`ClientConnection`](super::ClientConnection): requests matched
//! to their replies by tag, one-sided operations to their completions by id, the calls
//! a connection's handles make on its actor ([`ClientCall`]), and why a call failed
//! ([`RequestError`]).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::{mpsc, oneshot};

use super::auth::{self, Authenticated, Credential, AUTH_TAG, NONCE_LEN, REFUSED_PREFIX};
use super::close::CloseReason;
use super::connection::{BufId, ConnectionActor, Op};
use super::service::{Identity, Incoming, OpId, Session, SessionError};
use super::SessionCx;
use crate::transport::{Transport, Verbs};
use crate::verbs::{RemoteRegion, VerbsError};

/// Why a request or one-sided operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The connection closed before the answer arrived.
    #[error("connection closed: {0}")]
    Closed(CloseReason),
    /// The server refused the message: larger than the service takes, or than the
    /// connection's budget. Nothing of it was delivered; the connection goes on.
    #[error("refused by the peer: {0}")]
    Refused(crate::proto::budget::BudgetError),
    /// The operation completed with an error status (for example a remote access error).
    #[error("operation failed: {0}")]
    Failed(String),
    /// The request could not be queued.
    #[error("{0}")]
    Invalid(String),
}

pub(super) type Reply<T> = oneshot::Sender<Result<T, RequestError>>;

#[derive(Debug, Clone, Copy)]
pub(crate) enum AtomicOp {
    CompareSwap { compare: u64, swap: u64 },
    FetchAdd { add: u64 },
}

pub(crate) enum ClientCall<Tr: Transport = Verbs> {
    Send {
        data: Vec<u8>,
        reply: Reply<()>,
    },
    SendAll {
        data: Vec<Vec<u8>>,
        reply: Reply<()>,
    },
    Request {
        data: Vec<u8>,
        reply: Reply<Vec<u8>>,
    },
    Read {
        remote: RemoteRegion,
        len: usize,
        reply: Reply<Vec<u8>>,
    },
    Write {
        remote: RemoteRegion,
        data: Vec<u8>,
        imm: Option<u32>,
        reply: Reply<()>,
    },
    WriteFrom {
        src: Tr::Region,
        range: Range<usize>,
        remote: RemoteRegion,
        imm: Option<u32>,
        reply: Reply<Tr::Region>,
    },
    Atomic {
        op: AtomicOp,
        remote: RemoteRegion,
        reply: Reply<u64>,
    },
    Close {
        done: oneshot::Sender<()>,
    },
}

impl<Tr: Transport> Message for ClientCall<Tr> {
    type Result = ();
}

enum PendingOp<Tr: Transport> {
    Read(BufId, usize, Reply<Vec<u8>>),
    Write(BufId, Reply<()>),
    WriteFrom(BufId, Reply<Tr::Region>),
    Atomic(BufId, Reply<u64>),
}

/// Where a client connection's close reason is kept for its handles.
pub(super) type ClosedReason = Arc<std::sync::Mutex<Option<CloseReason>>>;

/// What a [`ClientConnection`](super::ClientConnection) reads from its session:
/// unsolicited messages, and the close reason.
pub(super) struct ClientEnds {
    pub inbox: mpsc::UnboundedReceiver<Incoming>,
    pub closed: ClosedReason,
    /// Who the server knows this connection as once it is established (anonymous when
    /// the service asked no proof), or the server's reason for refusing the proof.
    pub authenticated: oneshot::Receiver<Result<Identity, String>>,
}

/// Where the dialer puts the nonce of the server's welcome, for the session to prove
/// its identity over when the connection is established.
pub(super) type NonceSlot = Arc<std::sync::Mutex<Option<[u8; NONCE_LEN]>>>;

/// What a client proves with.
#[derive(Clone)]
pub(super) enum Prover {
    /// Its credential.
    Credential(Arc<Credential>),
    /// Bytes of the caller's own making, from the nonce and the service: for tests that
    /// play a hostile client (a replayed, truncated or oversized proof).
    Raw(RawProof),
}

/// See [`Client::with_raw_proof`](super::Client::with_raw_proof).
pub type RawProof = Arc<dyn Fn(&[u8; NONCE_LEN], &str) -> Vec<u8> + Send + Sync>;

/// A client connection's part in authentication.
struct ClientAuth {
    credential: Option<Prover>,
    service: String,
    nonce: NonceSlot,
    /// Answered once: at establishment (no proof asked), on the server's answer to the
    /// proof, or at close.
    done: Option<oneshot::Sender<Result<Identity, String>>>,
}

impl ClientAuth {
    fn answer(&mut self, outcome: Result<Identity, String>) {
        if let Some(done) = self.done.take() {
            let _ = done.send(outcome);
        }
    }
}

/// The server's reason in a close reason: what follows "authentication refused: " in
/// its `Close` frame, or the whole reason when it closed for something else.
fn refusal_text(reason: &CloseReason) -> String {
    let text = reason.to_string();
    match text.find(REFUSED_PREFIX) {
        Some(at) => text[at + REFUSED_PREFIX.len()..].to_owned(),
        None => text,
    }
}

/// The session behind a [`ClientConnection`](super::ClientConnection): matches replies
/// to requests by tag and completions to one-sided operations by id.
pub(super) struct ClientSession<Tr: Transport = Verbs> {
    next_tag: u32,
    requests: HashMap<u32, Reply<Vec<u8>>>,
    ops: HashMap<OpId, PendingOp<Tr>>,
    inbox: mpsc::UnboundedSender<Incoming>,
    closed: ClosedReason,
    /// The application's session (see
    /// [`Client::connect_session`](super::Client::connect_session)), which then gets every
    /// message and the completions of its own operations.
    user: Option<Box<dyn Session<Tr>>>,
    auth: ClientAuth,
}

impl<Tr: Transport> ClientSession<Tr> {
    /// A session and the ends its [`ClientConnection`](super::ClientConnection) reads.
    /// `credential` proves the connection's identity to `service` when the server's
    /// welcome asks for it (a nonce in `nonce`, put there by the dialer).
    pub fn new(
        user: Option<Box<dyn Session<Tr>>>,
        credential: Option<Prover>,
        service: String,
        nonce: NonceSlot,
    ) -> (ClientSession<Tr>, ClientEnds) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (auth_tx, auth_rx) = oneshot::channel();
        let closed = ClosedReason::default();
        let session = ClientSession {
            // Tag 0 is reserved for one-way messages in both directions.
            next_tag: 1,
            requests: HashMap::new(),
            ops: HashMap::new(),
            inbox: tx,
            closed: closed.clone(),
            user,
            auth: ClientAuth {
                credential,
                service,
                nonce,
                done: Some(auth_tx),
            },
        };
        let ends = ClientEnds {
            inbox: rx,
            closed,
            authenticated: auth_rx,
        };
        (session, ends)
    }

    /// The connection is established: proves the identity as its first message when
    /// the welcome carried a nonce (an empty proof, when this client has no
    /// credential: the server then refuses with its reason, rather than waiting for a
    /// proof that will not come), else it is anonymous now.
    fn prove(&mut self, cx: &mut SessionCx<'_, Tr>) -> Result<(), SessionError> {
        let nonce = self.auth.nonce.lock().expect("not poisoned").take();
        let Some(nonce) = nonce else {
            self.auth.answer(Ok(Identity::Anonymous));
            return Ok(());
        };
        let proof = match &self.auth.credential {
            Some(Prover::Credential(c)) => auth::encode_proof(&c.prove(&nonce, &self.auth.service)),
            Some(Prover::Raw(make)) => make(&nonce, &self.auth.service),
            None => Vec::new(),
        };
        cx.send(AUTH_TAG, proof)
    }

    /// The server's answer to the proof.
    fn proved(&mut self, msg: &Incoming) -> Result<(), SessionError> {
        let answer: Authenticated = msg.decode()?;
        self.auth.answer(Ok(Identity::Key(answer.identity)));
        Ok(())
    }
}

impl<Tr: Transport> Session<Tr> for ClientSession<Tr> {
    fn on_established(&mut self, cx: &mut SessionCx<'_, Tr>) -> Result<(), SessionError> {
        self.prove(cx)?;
        match &mut self.user {
            Some(user) => user.on_established(cx),
            None => Ok(()),
        }
    }

    fn on_message(
        &mut self,
        cx: &mut SessionCx<'_, Tr>,
        msg: Incoming,
    ) -> Result<(), SessionError> {
        if msg.tag == AUTH_TAG && self.auth.done.is_some() {
            return self.proved(&msg);
        }
        if let Some(user) = &mut self.user {
            return user.on_message(cx, msg);
        }
        if msg.tag == 0 {
            // Unsolicited (one-way message or WRITE_WITH_IMM); nobody listening is fine.
            let _ = self.inbox.send(msg);
            return Ok(());
        }
        match self.requests.remove(&msg.tag) {
            Some(reply) => {
                let _ = reply.send(Ok(msg.data));
                Ok(())
            }
            None => Err(SessionError::new(format!(
                "reply with unknown tag {}",
                msg.tag
            ))),
        }
    }

    fn on_op(
        &mut self,
        cx: &mut SessionCx<'_, Tr>,
        op: OpId,
        result: crate::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        let Some(pending) = self.ops.remove(&op) else {
            return match &mut self.user {
                Some(user) => user.on_op(cx, op, result),
                None => Err(SessionError::new(format!("completion of unknown {op:?}"))),
            };
        };
        let fail = |e: &VerbsError| RequestError::Failed(e.to_string());
        match pending {
            PendingOp::Read(buf, len, reply) => {
                let out = match &result {
                    Ok(()) => {
                        let mut data = vec![0; len];
                        cx.copy_out(buf, 0, &mut data)?;
                        Ok(data)
                    }
                    Err(e) => Err(fail(e)),
                };
                cx.free(buf);
                let _ = reply.send(out);
            }
            PendingOp::Write(buf, reply) => {
                cx.free(buf);
                let _ = reply.send(result.as_ref().map(|_| ()).map_err(fail));
            }
            PendingOp::WriteFrom(buf, reply) => {
                let out = match &result {
                    Ok(()) => cx.take_back(buf).ok_or_else(|| {
                        RequestError::Invalid("the written region could not be handed back".into())
                    }),
                    Err(e) => Err(fail(e)),
                };
                if out.is_err() {
                    // Not handed back: the connection keeps (and drops) it.
                    cx.free(buf);
                }
                let _ = reply.send(out);
            }
            PendingOp::Atomic(buf, reply) => {
                let out = match &result {
                    Ok(()) => {
                        let mut old = [0; 8];
                        cx.copy_out(buf, 0, &mut old)?;
                        Ok(u64::from_ne_bytes(old))
                    }
                    Err(e) => Err(fail(e)),
                };
                cx.free(buf);
                let _ = reply.send(out);
            }
        }
        Ok(())
    }

    fn on_refused(
        &mut self,
        cx: &mut SessionCx<'_, Tr>,
        tag: u32,
        why: crate::proto::budget::BudgetError,
    ) -> Result<(), SessionError> {
        if let Some(user) = &mut self.user {
            return user.on_refused(cx, tag, why);
        }
        match self.requests.remove(&tag) {
            Some(reply) => drop(reply.send(Err(RequestError::Refused(why)))),
            // A one-way message: nobody waits for it, so the log is where it shows.
            None => tracing::warn!(tag, %why, "the peer refused a message"),
        }
        Ok(())
    }

    fn on_close(&mut self, reason: &CloseReason) {
        *self.closed.lock().expect("not poisoned") = Some(reason.clone());
        self.auth.answer(Err(refusal_text(reason)));
        if let Some(user) = &mut self.user {
            user.on_close(reason);
        }
        // Replies will not come any more. One-sided operations still get their own
        // completion (their real status, or a flush) while the connection drains; any
        // left unanswered end with the session, as "connection gone".
        for (_, reply) in self.requests.drain() {
            let _ = reply.send(Err(RequestError::Closed(reason.clone())));
        }
    }
}

impl<Tr: Transport> ClientSession<Tr> {
    fn handle(
        &mut self,
        call: ClientCall<Tr>,
        cx: &mut SessionCx<'_, Tr>,
    ) -> Result<(), SessionError> {
        let invalid = |e: SessionError| RequestError::Invalid(e.0);
        match call {
            ClientCall::Send { data, reply } => {
                let _ = reply.send(cx.send(0, data).map_err(invalid));
            }
            ClientCall::SendAll { data, reply } => {
                let sent = data.into_iter().try_for_each(|d| cx.send(0, d));
                let _ = reply.send(sent.map_err(invalid));
            }
            ClientCall::Request { reply, .. } if self.user.is_some() => {
                let why = "this connection's messages go to its own session";
                drop(reply.send(Err(RequestError::Invalid(why.into()))));
            }
            ClientCall::Request { data, reply } => {
                let tag = self.next_tag;
                // Wraps to 1 before AUTH_TAG: that tag is the proof's, never a request's.
                self.next_tag = match self.next_tag.checked_add(1) {
                    Some(next) if next != AUTH_TAG => next,
                    _ => 1,
                };
                match cx.send(tag, data) {
                    Ok(()) => {
                        self.requests.insert(tag, reply);
                    }
                    Err(e) => drop(reply.send(Err(invalid(e)))),
                }
            }
            ClientCall::Read { remote, len, reply } => {
                let started = cx.alloc(len.max(1)).and_then(|buf| {
                    cx.post(Op::Read {
                        buf,
                        range: 0..len,
                        src: remote,
                    })
                    .map(|op| (op, buf))
                });
                match started {
                    Ok((op, buf)) => drop(self.ops.insert(op, PendingOp::Read(buf, len, reply))),
                    Err(e) => drop(reply.send(Err(invalid(e)))),
                }
            }
            ClientCall::Write {
                remote,
                data,
                imm,
                reply,
            } => {
                let started = cx.alloc(data.len().max(1)).and_then(|buf| {
                    cx.copy_in(buf, 0, &data)?;
                    cx.post(Op::Write {
                        buf,
                        range: 0..data.len(),
                        dst: remote,
                        imm,
                    })
                    .map(|op| (op, buf))
                });
                match started {
                    Ok((op, buf)) => drop(self.ops.insert(op, PendingOp::Write(buf, reply))),
                    Err(e) => drop(reply.send(Err(invalid(e)))),
                }
            }
            ClientCall::WriteFrom {
                src,
                range,
                remote,
                imm,
                reply,
            } => {
                let started = cx.adopt(src).and_then(|buf| {
                    let posted = cx.post(Op::Write {
                        buf,
                        range,
                        dst: remote,
                        imm,
                    });
                    if posted.is_err() {
                        cx.free(buf);
                    }
                    posted.map(|op| (op, buf))
                });
                match started {
                    Ok((op, buf)) => drop(self.ops.insert(op, PendingOp::WriteFrom(buf, reply))),
                    Err(e) => drop(reply.send(Err(invalid(e)))),
                }
            }
            ClientCall::Atomic { op, remote, reply } => {
                let started = cx.alloc(8).and_then(|buf| {
                    let spec = match op {
                        AtomicOp::CompareSwap { compare, swap } => Op::CompareSwap {
                            buf,
                            offset: 0,
                            remote,
                            compare,
                            swap,
                        },
                        AtomicOp::FetchAdd { add } => Op::FetchAdd {
                            buf,
                            offset: 0,
                            remote,
                            add,
                        },
                    };
                    cx.post(spec).map(|op| (op, buf))
                });
                match started {
                    Ok((op, buf)) => drop(self.ops.insert(op, PendingOp::Atomic(buf, reply))),
                    Err(e) => drop(reply.send(Err(invalid(e)))),
                }
            }
            ClientCall::Close { .. } => unreachable!("handled by the actor"),
        }
        Ok(())
    }
}

impl<Tr: Transport> Handler<ClientCall<Tr>> for ConnectionActor<ClientSession<Tr>, Tr> {
    type Result = ();

    fn handle(&mut self, call: ClientCall<Tr>, _: &mut Context<Self>) {
        let _guard = super::poller::AbortOnUnwind::new("client connection actor");
        let mut conn = self.conn();
        if let ClientCall::Close { done } = call {
            conn.when_released(done);
            conn.begin_close(CloseReason::Local("closed by the client".into()));
            return;
        }
        let mut call = Some(call);
        conn.with_session(|s, cx| s.handle(call.take().expect("once"), cx));
        if let Some(call) = call {
            // The connection is closing: answer instead of dropping the caller.
            let reason = conn.close_reason().cloned();
            let err = RequestError::Closed(
                reason.unwrap_or_else(|| CloseReason::Local("connection closing".into())),
            );
            match call {
                ClientCall::Request { reply, .. } | ClientCall::Read { reply, .. } => {
                    drop(reply.send(Err(err)))
                }
                ClientCall::Write { reply, .. }
                | ClientCall::Send { reply, .. }
                | ClientCall::SendAll { reply, .. } => drop(reply.send(Err(err))),
                ClientCall::Atomic { reply, .. } => drop(reply.send(Err(err))),
                ClientCall::WriteFrom { reply, .. } => drop(reply.send(Err(err))),
                ClientCall::Close { .. } => {}
            }
        }
    }
}
