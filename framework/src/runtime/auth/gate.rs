//! The session an authenticated-only service's connection starts with: it holds the
//! nonce the accept carried, takes the connection's first message as the proof, and
//! only once the proof is verified makes the service's own session (with the identity in
//! its [`PeerInfo`]) and hands it every callback after. Anything else first, or a proof
//! that fails, closes the connection with the reason (a `Close` frame the client reads);
//! the service never sees a message of an unauthenticated peer.
//!
//! The connection core is unchanged but for one limit: this is one more [`Session`],
//! and while it waits the connection reads no message larger than a proof (the CM actor
//! shuts that gate, `Core::gate_messages`; this session opens it once the proof is
//! good, and hears of a larger first message as a refusal). The CM actor hears
//! how it ended ([`AuthReport`]) to count failures per address, to time out a gate that
//! never hears a proof, and to close connections whose key a reload removed.

use std::sync::Arc;

use actix::prelude::*;

use super::identities::{IdentityCounts, IdentitySlot};
use super::keys::Keys;
use super::proof::{self, AuthRefusal, Authenticated, Verified, AUTH_TAG, NONCE_LEN};
use crate::proto::budget::BudgetError;
use crate::runtime::close::CloseReason;
use crate::runtime::service::{Identity, Incoming, OpId, PeerInfo, Service, Session, SessionError};
use crate::runtime::SessionCx;
use crate::transport::{Transport, Verbs};

/// What the close reason of a refused connection starts with; the client's
/// `ConnectError::Auth` carries what follows.
pub const REFUSED_PREFIX: &str = "authentication refused: ";

/// How a gate ended, for the CM actor.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct AuthReport<K: Send + 'static> {
    /// The connection.
    pub key: K,
    /// The service it asked for.
    pub service: String,
    /// Who it proved to be, or why it was refused.
    pub outcome: Result<Verified, AuthRefusal>,
}

enum State<T: Transport> {
    /// Waiting for the proof.
    Waiting {
        nonce: [u8; NONCE_LEN],
        service: Arc<dyn Service<T>>,
        peer: PeerInfo,
        keys: Arc<Keys>,
        identities: Arc<IdentityCounts>,
    },
    /// Proved: the service's session, and the identity's slot it holds until the
    /// connection is dropped.
    Open(
        Box<dyn Session<T>>,
        #[allow(dead_code, reason = "held for its drop, which gives the slot back")] IdentitySlot,
    ),
    /// Refused, closing.
    Refused,
}

/// The authenticating session (see the module's doc).
pub(crate) struct Gate<T: Transport = Verbs, K: Send + 'static = crate::verbs::CmIdKey> {
    state: State<T>,
    /// Whether the connection's `on_established` came (it can come after the proof:
    /// the client's first message may arrive before the server's ESTABLISHED), so the
    /// service's session hears it exactly once, after it exists.
    established: bool,
    key: K,
    report: Recipient<AuthReport<K>>,
}

impl<T: Transport, K: Copy + Send + 'static> Gate<T, K> {
    /// A gate for connection `key` to `service`, whose accept carries `nonce`.
    pub fn new(
        nonce: [u8; NONCE_LEN],
        service: Arc<dyn Service<T>>,
        peer: PeerInfo,
        keys: Arc<Keys>,
        identities: Arc<IdentityCounts>,
        key: K,
        report: Recipient<AuthReport<K>>,
    ) -> Self {
        Gate {
            state: State::Waiting {
                nonce,
                service,
                peer,
                keys,
                identities,
            },
            established: false,
            key,
            report,
        }
    }

    fn refuse(&mut self, cx: &mut SessionCx<'_, T>, service: String, why: AuthRefusal) {
        cx.close(format!("{REFUSED_PREFIX}{why}"));
        self.state = State::Refused;
        self.report.do_send(AuthReport {
            key: self.key,
            service,
            outcome: Err(why),
        });
    }

    /// The first message: the proof, checked.
    fn admit(&mut self, cx: &mut SessionCx<'_, T>, msg: Incoming) -> Result<(), SessionError> {
        let State::Waiting {
            nonce,
            service,
            peer,
            keys,
            identities,
        } = std::mem::replace(&mut self.state, State::Refused)
        else {
            unreachable!("admit only while waiting");
        };
        let name = peer.service.clone();
        // An empty proof is an honest client saying it has no credential.
        if msg.tag != AUTH_TAG || msg.data.is_empty() {
            self.refuse(cx, name, AuthRefusal::NeedsAuthentication);
            return Ok(());
        }
        let verified = proof::decode(&msg.data)
            .and_then(|p| proof::verify(&p, &keys.current(), &nonce, &name));
        let (verified, slot) = match verified.and_then(|v| {
            let slot = identities.take(&v.identity)?;
            Ok((v, slot))
        }) {
            Ok(v) => v,
            Err(why) => {
                self.refuse(cx, name, why);
                return Ok(());
            }
        };
        // Proved: the service's own message limit from now on.
        cx.open_gate();
        let peer = PeerInfo {
            identity: Identity::Key(verified.identity.clone()),
            ..peer
        };
        // The service's code, on the connection's thread: a panic ends this connection
        // only (the caller catches it), with the panic's message as the reason.
        let mut session = service.session(&peer);
        let answer = Authenticated {
            identity: verified.identity.clone(),
        };
        // The CM actor hears first, so that the connection counts against its identity
        // (and no longer its address) before the client can know it was served.
        self.report.do_send(AuthReport {
            key: self.key,
            service: name,
            outcome: Ok(verified),
        });
        cx.reply_typed(&msg, &answer)?;
        let started = if self.established {
            session.on_established(cx)
        } else {
            Ok(())
        };
        self.state = State::Open(session, slot);
        started
    }
}

impl<T: Transport, K: Copy + Send + Unpin + 'static> Session<T> for Gate<T, K> {
    fn on_established(&mut self, cx: &mut SessionCx<'_, T>) -> Result<(), SessionError> {
        self.established = true;
        match &mut self.state {
            State::Open(s, _) => s.on_established(cx),
            _ => Ok(()),
        }
    }

    fn on_message(&mut self, cx: &mut SessionCx<'_, T>, msg: Incoming) -> Result<(), SessionError> {
        match &mut self.state {
            State::Open(s, _) => s.on_message(cx, msg),
            State::Waiting { .. } => self.admit(cx, msg),
            State::Refused => Ok(()),
        }
    }

    fn on_op(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        op: OpId,
        result: crate::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        match &mut self.state {
            State::Open(s, _) => s.on_op(cx, op, result),
            _ => Err(SessionError::new(format!(
                "completion of {op:?} before authentication"
            ))),
        }
    }

    fn on_refused(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        tag: u32,
        why: BudgetError,
    ) -> Result<(), SessionError> {
        match &mut self.state {
            State::Open(s, _) => s.on_refused(cx, tag, why),
            // This session sent nothing yet: the refusal is the connection's, of the
            // peer's first message, offered larger than any proof and not read.
            State::Waiting { peer, .. } => {
                let service = peer.service.clone();
                let why = match why {
                    BudgetError::TooLarge { len, .. } => proof::oversized(len),
                    other => AuthRefusal::Malformed(other.to_string()),
                };
                self.refuse(cx, service, why);
                Ok(())
            }
            State::Refused => Ok(()),
        }
    }

    fn on_wake(&mut self, cx: &mut SessionCx<'_, T>, token: u64) -> Result<(), SessionError> {
        match &mut self.state {
            State::Open(s, _) => s.on_wake(cx, token),
            _ => Ok(()),
        }
    }

    fn on_close(&mut self, reason: &CloseReason) {
        if let State::Open(s, _) = &mut self.state {
            s.on_close(reason);
        }
    }
}
