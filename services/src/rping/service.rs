//! The rping-compatible service: drives [`RpingSession`] over a raw connection.

use rdmactor::runtime::{
    BufId, Driver, Flow, Framing, Incoming, MachineCx, MachineSession, Op, PeerInfo, Service,
    Session, SessionCx, SessionError, StateMachine,
};
use rdmactor::verbs::{Access, RemoteRegion};

use super::machine::{RemoteBuf, RpingAction, RpingConfig, RpingSession};

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
        Box::new(MachineSession::new(
            RpingSession::new(self.config),
            RpingDriver { buf: None },
        ))
    }
}

impl StateMachine for RpingSession {
    type Output = RpingAction;
    fn poll_output(&mut self) -> Option<RpingAction> {
        self.poll_action()
    }
}

/// Carries out the machine's actions: the one registered buffer, READs, WRITEs, SENDs.
struct RpingDriver {
    buf: Option<BufId>,
}

/// Which of the machine's operations completed.
enum Posted {
    Read,
    Write,
}

fn err(e: impl std::fmt::Display) -> SessionError {
    SessionError::new(format!("rping: {e}"))
}

fn region(remote: RemoteBuf) -> RemoteRegion {
    RemoteRegion {
        addr: remote.addr,
        len: remote.len as u64,
        rkey: remote.rkey,
    }
}

impl Driver for RpingDriver {
    type Machine = RpingSession;
    type Posted = Posted;

    fn on_message(
        &mut self,
        m: &mut MachineCx<'_, RpingSession, Posted>,
        _cx: &mut SessionCx<'_>,
        msg: Incoming,
    ) -> Result<(), SessionError> {
        m.machine.handle_recv(&msg.data).map_err(err)
    }

    fn on_op(
        &mut self,
        m: &mut MachineCx<'_, RpingSession, Posted>,
        _cx: &mut SessionCx<'_>,
        posted: Posted,
        result: rdmactor::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        result.map_err(err)?;
        match posted {
            Posted::Read => m.machine.handle_read_done(),
            Posted::Write => m.machine.handle_write_done(),
        }
        .map_err(err)
    }

    fn carry(
        &mut self,
        m: &mut MachineCx<'_, RpingSession, Posted>,
        cx: &mut SessionCx<'_>,
        action: RpingAction,
    ) -> Result<Flow, SessionError> {
        let buf = match self.buf {
            Some(b) => b,
            None => {
                // Only the local NIC touches this buffer (READ target, WRITE source),
                // so it needs no remote access at all.
                let b = cx.register(m.machine.buffer_len() as usize, Access::LOCAL_WRITE)?;
                self.buf = Some(b);
                b
            }
        };
        match action {
            RpingAction::Read { remote } => {
                let range = 0..remote.len as usize;
                let src = region(remote);
                m.post(cx, Op::Read { buf, range, src }, Posted::Read)?;
            }
            RpingAction::Write { remote, len } => {
                let (range, dst) = (0..len as usize, region(remote));
                let write = Op::Write {
                    buf,
                    range,
                    dst,
                    imm: None,
                };
                m.post(cx, write, Posted::Write)?;
            }
            RpingAction::Send { bytes } => cx.send_raw(&bytes, None)?,
        }
        Ok(Flow::Continue)
    }

    fn error(what: String) -> SessionError {
        err(what)
    }
}
