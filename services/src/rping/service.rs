//! The rping-compatible service: drives [`RpingSession`] over a raw connection.

use rdmactor::runtime::{
    BufId, Driver, Flow, Framing, Incoming, MachineCx, MachineSession, Op, PeerInfo, Service,
    Session, SessionError, StateMachine,
};
use rdmactor::transport::Transport;
use rdmactor::verbs::{Access, RemoteRegion};

use super::machine::{RemoteBuf, RpingAction, RpingConfig, RpingError, RpingSession};

/// Serves the unmodified rdma-core `rping -c` client.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rping {
    /// Limits for clients' buffer sizes.
    pub config: RpingConfig,
}

impl<T: Transport> Service<T> for Rping {
    fn framing(&self) -> Framing {
        // rping's messages are 16-byte buffer adverts.
        Framing::Raw { recv_size: 64 }
    }

    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session<T>> {
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

/// The machine's input for a posted operation's completion.
type Completed = fn(&mut RpingSession) -> Result<(), RpingError>;

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

impl<T: Transport> Driver<T> for RpingDriver {
    type Machine = RpingSession;
    type Posted = Completed;

    fn on_message(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        msg: Incoming,
    ) -> Result<(), SessionError> {
        cx.machine.handle_recv(&msg.data).map_err(err)
    }

    fn on_op(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        completed: Completed,
        result: rdmactor::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        result.map_err(err)?;
        completed(cx.machine).map_err(err)
    }

    fn carry(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        action: RpingAction,
    ) -> Result<Flow, SessionError> {
        // Only the local NIC touches this buffer (READ target, WRITE source), so it
        // needs no remote access at all.
        let len = cx.machine.buffer_len() as usize;
        let buf = match self.buf {
            Some(buf) => buf,
            None => *self.buf.insert(cx.conn.register(len, Access::LOCAL_WRITE)?),
        };
        match action {
            RpingAction::Read { remote } => {
                let range = 0..remote.len as usize;
                let src = region(remote);
                cx.post(Op::Read { buf, range, src }, RpingSession::handle_read_done)?;
            }
            RpingAction::Write { remote, len } => {
                let (range, dst, imm) = (0..len as usize, region(remote), None);
                let write = Op::Write {
                    buf,
                    range,
                    dst,
                    imm,
                };
                cx.post(write, RpingSession::handle_write_done)?;
            }
            RpingAction::Send { bytes } => cx.conn.send_raw(&bytes, None)?,
        }
        Ok(Flow::Continue)
    }

    fn error(what: String) -> SessionError {
        err(what)
    }
}
