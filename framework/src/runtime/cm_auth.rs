//! The CM actor's part in authentication, as messages: a gate's report (a proof
//! checked, or refused) and a reload of the authorized keys. What to decide is
//! `auth/door.rs`; this applies it to the connections.

use std::time::Instant;

use actix::prelude::*;

use super::auth::{AuthReport, KeySet, KeysError};
use super::close::CloseReason;
use super::cm::CmActor;
use super::connection::CmNotice;
use crate::transport::Transport;

impl<T: Transport> Handler<AuthReport<T::CmIdKey>> for CmActor<T> {
    type Result = ();
    fn handle(&mut self, msg: AuthReport<T::CmIdKey>, _ctx: &mut Context<Self>) {
        let proved = msg.outcome.is_ok();
        if let Some(why) = self
            .door
            .report(msg.key, &msg.service, msg.outcome, Instant::now())
        {
            self.conns
                .notify(msg.key, CmNotice::Close(CloseReason::Local(why)));
        } else if proved {
            // From now on the connection counts against its identity (the gate holds
            // that slot), no longer against its address: see `auth/identities.rs`.
            if let Some(Some(ip)) = self.conns.retag(msg.key, None) {
                self.per_peer.remove(ip);
            }
        }
    }
}

/// Reloads the authorized keys (from their file, or `Some` set given), and closes the
/// connections whose key is gone with "key removed". Answers how many it closed.
#[derive(Message)]
#[rtype(result = "Result<usize, KeysError>")]
pub(crate) struct ReloadKeys(pub Option<KeySet>);

impl<T: Transport> Handler<ReloadKeys> for CmActor<T> {
    type Result = Result<usize, KeysError>;
    fn handle(&mut self, msg: ReloadKeys, _ctx: &mut Context<Self>) -> Self::Result {
        let Some(keys) = self.door.keys().cloned() else {
            return Err(KeysError::NotAuthenticating);
        };
        let set = match msg.0 {
            Some(set) => keys.replace(set),
            None => keys.reload()?,
        };
        let gone = self.door.swept(&set);
        tracing::info!(
            identities = set.len(),
            closed = gone.len(),
            "authorized keys reloaded"
        );
        for key in &gone {
            let why = CloseReason::Local("key removed".into());
            self.conns.notify(*key, CmNotice::Close(why));
        }
        Ok(gone.len())
    }
}
