//! The `files` service's actor: it owns the [`Ledger`] (per-client shares and the
//! bytes promised but not reserved on disk). Sessions ask it once per offer
//! ([`Admit`], with `SessionCx::ask`) and tell it when an upload's bytes are reserved
//! ([`Backed`]) or when the upload ends ([`Release`], sent by [`Admission`]'s drop).
//! Chunks never reach it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::prelude::*;

use super::quota::{AdmissionId, ClientQuota, Ledger};
use super::wire::RejectReason;

/// Owns the service's [`Ledger`]; a thin driver of it.
#[derive(Debug)]
pub struct QuotaOwner {
    ledger: Ledger,
    /// Uploads admitted now, published after every change for
    /// `FileTransfer::uploads_in_flight` (read by threads outside the actor system).
    uploads: Arc<AtomicU64>,
}

impl QuotaOwner {
    /// An owner of an empty ledger enforcing `quota`, publishing its admitted uploads
    /// to `uploads`.
    pub fn new(quota: ClientQuota, uploads: Arc<AtomicU64>) -> QuotaOwner {
        QuotaOwner {
            ledger: Ledger::new(quota),
            uploads,
        }
    }

    /// Admits at most `max` uploads at once over every client (see
    /// [`Ledger::with_max_uploads`]).
    #[must_use]
    pub fn with_max_uploads(mut self, max: u64) -> QuotaOwner {
        self.ledger = self.ledger.with_max_uploads(max);
        self
    }

    fn publish(&self) {
        self.uploads.store(self.ledger.uploads(), Ordering::Relaxed);
    }
}

impl Actor for QuotaOwner {
    type Context = Context<Self>;
}

/// Asks for an upload of `len` bytes by `client`, when the file system reports `free`
/// bytes available.
#[derive(Message, Debug)]
#[rtype(result = "Result<Admission, RejectReason>")]
pub struct Admit {
    /// The client (peer IP address) whose share it counts against.
    pub client: String,
    /// The offered length.
    pub len: u64,
    /// What the file system reports free in the store's directory.
    pub free: u64,
}

/// The admission's bytes are reserved on disk (`fallocate`).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Backed(pub AdmissionId);

/// The admission ended: its share comes back.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Release(pub AdmissionId);

/// Uploads and bytes a client has admitted now.
#[derive(Message, Debug)]
#[rtype(result = "(u32, u64)")]
pub struct Usage(pub String);

impl Handler<Admit> for QuotaOwner {
    type Result = Result<Admission, RejectReason>;

    fn handle(&mut self, msg: Admit, ctx: &mut Context<Self>) -> Self::Result {
        let id = self.ledger.handle_admit(&msg.client, msg.len, msg.free)?;
        self.publish();
        Ok(Admission {
            id,
            owner: ctx.address(),
            backed: false,
        })
    }
}

impl Handler<Backed> for QuotaOwner {
    type Result = ();

    fn handle(&mut self, msg: Backed, _: &mut Context<Self>) {
        self.ledger.handle_backed(msg.0);
    }
}

impl Handler<Release> for QuotaOwner {
    type Result = ();

    fn handle(&mut self, msg: Release, _: &mut Context<Self>) {
        self.ledger.handle_release(msg.0);
        self.publish();
    }
}

impl Handler<Usage> for QuotaOwner {
    type Result = MessageResult<Usage>;

    fn handle(&mut self, msg: Usage, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.ledger.usage(&msg.0))
    }
}

/// One admitted upload's share of its client's quota: given back (a [`Release`] to
/// the owner) when dropped, whether the upload was stored, refused, aborted or its
/// connection closed. If the answer to an [`Admit`] arrives after its connection
/// closed, dropping it unread gives the share back too.
#[derive(Debug)]
pub struct Admission {
    id: AdmissionId,
    owner: Addr<QuotaOwner>,
    backed: bool,
}

impl Admission {
    /// The upload's bytes are reserved on disk: they no longer count as promised.
    pub fn mark_backed(&mut self) {
        if !self.backed {
            self.backed = true;
            self.owner.do_send(Backed(self.id));
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.owner.do_send(Release(self.id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix::test]
    async fn an_admission_gives_its_share_back_when_dropped() {
        let uploads = Arc::new(AtomicU64::new(0));
        let owner = QuotaOwner::new(
            ClientQuota {
                uploads: 1,
                reserved_bytes: 100,
            },
            uploads.clone(),
        )
        .start();
        let ask = |len| {
            owner.send(Admit {
                client: "a".into(),
                len,
                free: 1000,
            })
        };
        let mut first = ask(10).await.unwrap().unwrap();
        first.mark_backed();
        assert!(matches!(
            ask(1).await.unwrap(),
            Err(RejectReason::Quota { limit: 1, .. })
        ));
        assert_eq!(owner.send(Usage("a".into())).await.unwrap(), (1, 10));
        assert_eq!(uploads.load(Ordering::Relaxed), 1);
        drop(first);
        assert_eq!(owner.send(Usage("a".into())).await.unwrap(), (0, 0));
        assert_eq!(uploads.load(Ordering::Relaxed), 0);
        let _again = ask(100).await.unwrap().unwrap();
    }
}
