//! The driver's half of posting: takes the batches the core decided
//! ([`Core::poll_transmit`]) and rings the QP's doorbell for each, in order, telling the
//! core how each went ([`Core::transmitted`]). The core decides and never posts; this is
//! the one place a connection's work reaches its QP (`post.rs` says how work is batched).
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use super::{Core, Work};
use crate::runtime::close::CloseReason;
use crate::transport::{QueuePair as _, Transport};

/// Posts everything the core has decided. A refused post (the QP is broken) ends with the
/// reason the connection must close for; what was queued after it is forgotten.
pub(crate) fn ring<T: Transport>(core: &mut Core<T>) -> Result<(), CloseReason> {
    while let Some(t) = core.poll_transmit() {
        let qp = t.qp;
        let posted = match t.work {
            Work::Recvs(recvs) => recvs
                .with_wrs(|wrs| qp.post_recv(wrs))
                .map_err(CloseReason::from_verbs),
            Work::Sends(sends) => sends
                .with_wrs(|wrs| match wrs {
                    [one] => qp.post_send(one),
                    chain => qp.post_send_list(chain),
                })
                .map_err(CloseReason::from_verbs),
            Work::Bind {
                wr_id,
                window,
                region,
                access,
                expect,
            } => match qp.bind_window(wr_id, window, region, access) {
                Ok(got) if got == expect => Ok(()),
                Ok(got) => Err(CloseReason::Verbs(format!(
                    "a window bind gave rkey {:#x}, not the {:#x} its frame carries",
                    got.rkey, expect.rkey
                ))),
                Err(e) => Err(CloseReason::from_verbs(e)),
            },
        };
        core.transmitted(posted)?;
    }
    Ok(())
}
