//! The rping-compatible service: drives [`RpingSession`] over a raw connection.

use rdmactor::runtime::{
    BufId, Framing, Incoming, Op, OpId, PeerInfo, Service, Session, SessionCx, SessionError,
};
use rdmactor::verbs::{Access, RemoteRegion};

use super::machine::{RpingAction, RpingConfig, RpingSession};

/// Serves the unmodified rdma-core `rping -c` client.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rping {
    /// Limits for clients' buffer sizes.
    pub config: RpingConfig,
}

impl Service for Rping {
    fn framing(&self) -> Framing {
        // rping's messages are 16-byte buffer adverts.
        Framing::Raw { recv_size: 64 }
    }

    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
        Box::new(RpingDriver {
            machine: RpingSession::new(self.config),
            buf: None,
            read: None,
            write: None,
        })
    }
}

struct RpingDriver {
    machine: RpingSession,
    buf: Option<BufId>,
    read: Option<OpId>,
    write: Option<OpId>,
}

fn err(e: impl std::fmt::Display) -> SessionError {
    SessionError::new(format!("rping: {e}"))
}

impl RpingDriver {
    /// Turns the machine's pending actions into posts.
    fn drive(&mut self, cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        while let Some(action) = self.machine.poll_action() {
            let buf = match self.buf {
                Some(b) => b,
                None => {
                    // Only the local NIC touches this buffer (READ target, WRITE source),
                    // so it needs no remote access at all.
                    let b = cx.register(self.machine.buffer_len() as usize, Access::LOCAL_WRITE)?;
                    self.buf = Some(b);
                    b
                }
            };
            match action {
                RpingAction::Read { remote } => {
                    let src = RemoteRegion {
                        addr: remote.addr,
                        len: remote.len as u64,
                        rkey: remote.rkey,
                    };
                    let range = 0..remote.len as usize;
                    self.read = Some(cx.post(Op::Read { buf, range, src })?);
                }
                RpingAction::Write { remote, len } => {
                    let dst = RemoteRegion {
                        addr: remote.addr,
                        len: remote.len as u64,
                        rkey: remote.rkey,
                    };
                    let range = 0..len as usize;
                    self.write = Some(cx.post(Op::Write {
                        buf,
                        range,
                        dst,
                        imm: None,
                    })?);
                }
                RpingAction::Send { bytes } => cx.send_raw(&bytes, None)?,
            }
        }
        Ok(())
    }
}

impl Session for RpingDriver {
    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        self.machine.handle_recv(&msg.data).map_err(err)?;
        self.drive(cx)
    }

    fn on_op(
        &mut self,
        cx: &mut SessionCx<'_>,
        op: OpId,
        result: rdmactor::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        result.map_err(err)?;
        if self.read == Some(op) {
            self.read = None;
            self.machine.handle_read_done().map_err(err)?;
        } else if self.write == Some(op) {
            self.write = None;
            self.machine.handle_write_done().map_err(err)?;
        } else {
            return Err(err(format!("completion of unknown {op:?}")));
        }
        self.drive(cx)
    }
}
