//! The process-wide handle tables: contexts and connections.
//!
//! Process-wide rather than per context so that a connection handle alone names its
//! connection (the calls on a connection take no context), and so that any id C passes
//! is checked against one place.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::handles::{Kind, Shared};
use crate::link::Link;
use crate::runtime::Context;

pub(crate) static CONTEXTS: Shared<Context> = Shared::new(Kind::Context);
pub(crate) static CONNECTIONS: Shared<ConnEntry> = Shared::new(Kind::Connection);

/// What a connection handle stands for.
pub(crate) struct ConnEntry {
    /// The context's id, for its shutdown to find its connections.
    pub ctx_id: u64,
    /// Its runtime (file transfers and submitted operations run there) and completion
    /// queue.
    pub ctx: Arc<Context>,
    pub link: Arc<dyn Link>,
    /// A file transfer is running: the files client reads every message of the
    /// connection as part of it, so a second one would steal the first's.
    pub transfer: AtomicBool,
}

/// Takes every connection of context `ctx_id` out of the table and closes them, all at
/// once. On the context's runtime thread, during its shutdown.
pub(crate) async fn close_connections_of(ctx_id: u64) {
    let entries: Vec<_> = {
        let mut table = CONNECTIONS.lock();
        let ids = table.ids_where(|e| e.ctx_id == ctx_id);
        ids.into_iter().filter_map(|id| table.remove(id)).collect()
    };
    futures::future::join_all(entries.iter().map(|e| e.link.close())).await;
}
