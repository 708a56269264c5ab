//! Sessions written as state machines, in the style of quinn-proto: the protocol is a
//! [`StateMachine`] that does no I/O (inputs go in through its own methods, outputs come
//! out of [`poll_output`](StateMachine::poll_output)), and a [`Driver`] only carries
//! each output out with the connection's [`SessionCx`]. [`MachineSession`] is the
//! [`Session`] that joins the two.
//!
//! Why a protocol is worth writing this way: the machine makes no verbs call and reads
//! no clock, so every state and every malformed input is tested natively and fuzzed,
//! without a device; the driver is then too thin to hide a protocol bug. Why the
//! adapter: every such session repeated the same plumbing around its machine, and
//! repeated it slightly differently. Each callback fed the machine and then had to end
//! in the same drain, in order, or an output waited for the next event; completions
//! had to be matched to what their operation was for, an unknown one being a bug; a
//! driver that carries an output out off the poller thread (a chunk read from disk)
//! had to stop draining until it was done, or later outputs would overtake it; and
//! after the connection closed, no callback could reach the machine. Here that is done
//! once, so a driver is "map callbacks to inputs" plus "carry out one output".
//!
//! What stays the driver's: what each callback means to the machine (decoding,
//! finding the bytes of a chunk), the resources an output needs (buffers, jobs, asks
//! of an owner actor, timers), and how errors are worded. The machine and the driver
//! are apart so that a driver may hold its own state and borrow the machine at once.
//!
//! `rdmactor-services`' `rping` is the smallest user (a machine with three outputs),
//! `lambda` a middling one, `files` the largest (it pauses while a chunk is read).
//!
//! ```
//! use std::collections::VecDeque;
//!
//! use rdmactor::runtime::{
//!     Driver, Flow, Incoming, MachineCx, MachineSession, PeerInfo, Service, Session,
//!     SessionCx, SessionError, StateMachine,
//! };
//!
//! /// The protocol: every message is answered with its length, as text. No I/O.
//! #[derive(Default)]
//! struct Lengths {
//!     out: VecDeque<String>,
//! }
//!
//! impl Lengths {
//!     fn handle_message(&mut self, bytes: &[u8]) {
//!         self.out.push_back(bytes.len().to_string());
//!     }
//! }
//!
//! impl StateMachine for Lengths {
//!     type Output = String;
//!     fn poll_output(&mut self) -> Option<String> {
//!         self.out.pop_front()
//!     }
//! }
//!
//! /// Carries the answers out.
//! struct LengthsDriver;
//!
//! impl Driver for LengthsDriver {
//!     type Machine = Lengths;
//!     type Posted = ();
//!
//!     fn on_message(
//!         &mut self,
//!         m: &mut MachineCx<'_, Lengths, ()>,
//!         _cx: &mut SessionCx<'_>,
//!         msg: Incoming,
//!     ) -> Result<(), SessionError> {
//!         m.machine.handle_message(&msg.data);
//!         Ok(())
//!     }
//!
//!     fn carry(
//!         &mut self,
//!         _m: &mut MachineCx<'_, Lengths, ()>,
//!         cx: &mut SessionCx<'_>,
//!         answer: String,
//!     ) -> Result<Flow, SessionError> {
//!         cx.send(0, answer.into_bytes())?;
//!         Ok(Flow::Continue)
//!     }
//! }
//!
//! struct LengthsService;
//!
//! impl Service for LengthsService {
//!     fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
//!         Box::new(MachineSession::new(Lengths::default(), LengthsDriver))
//!     }
//! }
//! ```

use std::collections::HashMap;

use super::connection::{Op, SessionCx};
use super::service::{refused_by_default, Incoming, OpId, Session, SessionError};
use super::CloseReason;
use crate::proto::budget::BudgetError;

/// A protocol with no I/O: inputs go in through its own methods (called by the
/// [`Driver`]'s callbacks), actions come out here, in the order they must be carried out.
pub trait StateMachine {
    /// One action for the driver.
    type Output;

    /// The next action, or `None` until an input makes more. [`MachineSession`] calls it
    /// after every callback until it returns `None` (or the driver pauses).
    fn poll_output(&mut self) -> Option<Self::Output>;
}

/// What the drain does after [`Driver::carry`] carried out one output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Carry out the next one.
    Continue,
    /// Stop here: this output is still being carried out (off the poller thread, say)
    /// and the outputs after it must wait for it, to keep their order. No output is
    /// polled until the driver calls [`MachineCx::resume`] in a later callback.
    Pause,
}

/// The machine, as a [`Driver`]'s callbacks see it: the machine itself, and the
/// adapter's record of the operations posted and of a pause.
pub struct MachineCx<'s, M, P> {
    /// The state machine, to feed inputs to.
    pub machine: &'s mut M,
    posted: &'s mut HashMap<OpId, P>,
    paused: &'s mut bool,
}

impl<M, P> MachineCx<'_, M, P> {
    /// Posts a one-sided operation (see [`SessionCx::post`]) and remembers `what` it is
    /// for: its completion comes to [`Driver::on_op`] with `what`.
    pub fn post(&mut self, cx: &mut SessionCx<'_>, op: Op, what: P) -> Result<OpId, SessionError> {
        let id = cx.post(op)?;
        self.track(id, what);
        Ok(id)
    }

    fn track(&mut self, id: OpId, what: P) {
        self.posted.insert(id, what);
    }

    /// Ends a [`Flow::Pause`]: the outputs waiting are carried out after this callback.
    pub fn resume(&mut self) {
        *self.paused = false;
    }

    /// True between a [`Flow::Pause`] and [`resume`](Self::resume).
    pub fn is_paused(&self) -> bool {
        *self.paused
    }
}

/// The service's half of a [`MachineSession`]: what each callback means to the machine,
/// and how each output is carried out. Every callback is followed by a drain of the
/// machine's outputs through [`carry`](Self::carry); an error from either closes the
/// connection with it as the reason, as a [`Session`]'s does.
pub trait Driver: Sized + Send + Unpin + 'static {
    /// The protocol.
    type Machine: StateMachine + Send + Unpin + 'static;
    /// What a posted operation was for (see [`MachineCx::post`]).
    type Posted: Send + Unpin + 'static;

    /// Carries out one output. [`Flow::Pause`] stops the drain until
    /// [`MachineCx::resume`].
    fn carry(
        &mut self,
        m: &mut MachineCx<'_, Self::Machine, Self::Posted>,
        cx: &mut SessionCx<'_>,
        out: <Self::Machine as StateMachine>::Output,
    ) -> Result<Flow, SessionError>;

    /// A message arrived ([`Session::on_message`]).
    fn on_message(
        &mut self,
        m: &mut MachineCx<'_, Self::Machine, Self::Posted>,
        cx: &mut SessionCx<'_>,
        msg: Incoming,
    ) -> Result<(), SessionError>;

    /// The connection is established ([`Session::on_established`]). The drain after it
    /// carries out what the machine had to say first.
    fn on_established(
        &mut self,
        _m: &mut MachineCx<'_, Self::Machine, Self::Posted>,
        _cx: &mut SessionCx<'_>,
    ) -> Result<(), SessionError> {
        Ok(())
    }

    /// An operation posted with [`MachineCx::post`] completed, and `posted` is what it
    /// was for. A completion of any other operation closes the connection before this
    /// is called. By default a failed one closes it too, as [`Session::on_op`]'s does.
    fn on_op(
        &mut self,
        _m: &mut MachineCx<'_, Self::Machine, Self::Posted>,
        _cx: &mut SessionCx<'_>,
        _posted: Self::Posted,
        result: crate::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        result.map_err(|e| Self::error(format!("a one-sided operation failed: {e}")))
    }

    /// A wake-up ([`Session::on_wake`]): a job, an ask or a timer of the driver's.
    fn on_wake(
        &mut self,
        _m: &mut MachineCx<'_, Self::Machine, Self::Posted>,
        _cx: &mut SessionCx<'_>,
        _token: u64,
    ) -> Result<(), SessionError> {
        Ok(())
    }

    /// A message was not delivered ([`Session::on_refused`], whose default this is).
    fn on_refused(
        &mut self,
        _m: &mut MachineCx<'_, Self::Machine, Self::Posted>,
        _cx: &mut SessionCx<'_>,
        tag: u32,
        why: BudgetError,
    ) -> Result<(), SessionError> {
        refused_by_default(tag, why)
    }

    /// A drain ended with nothing left to carry out (not paused): the place for what
    /// follows the machine's state rather than one output, such as a deadline while it
    /// waits on the peer.
    fn drained(
        &mut self,
        _m: &mut MachineCx<'_, Self::Machine, Self::Posted>,
        _cx: &mut SessionCx<'_>,
    ) -> Result<(), SessionError> {
        Ok(())
    }

    /// The connection is closing ([`Session::on_close`]); the machine is handed over to
    /// be dropped (or looked at one last time). No callback comes after this one.
    fn on_close(&mut self, _machine: Self::Machine, _reason: &CloseReason) {}

    /// The adapter's own errors (the completion of an operation not posted through
    /// [`MachineCx::post`], a callback after the close), worded as the service words
    /// its others: override to name the service.
    fn error(what: String) -> SessionError {
        SessionError::new(what)
    }
}

/// The adapter's own state: the machine (gone once closed), the posted operations and
/// the pause. Apart from [`MachineSession`] so that its logic is tested without a
/// connection.
struct Engine<M, P> {
    machine: Option<M>,
    posted: HashMap<OpId, P>,
    paused: bool,
}

impl<M: StateMachine, P> Engine<M, P> {
    fn new(machine: M) -> Self {
        Engine {
            machine: Some(machine),
            posted: HashMap::new(),
            paused: false,
        }
    }

    /// The machine for a callback; `None` once closed.
    fn cx(&mut self) -> Option<MachineCx<'_, M, P>> {
        Some(MachineCx {
            machine: self.machine.as_mut()?,
            posted: &mut self.posted,
            paused: &mut self.paused,
        })
    }

    /// Carries out the pending outputs in order until there are none (`Ok(true)`), one
    /// pauses or the drain is paused or closed already (`Ok(false)`), or one fails.
    fn drain(
        &mut self,
        mut carry: impl FnMut(&mut MachineCx<'_, M, P>, M::Output) -> Result<Flow, SessionError>,
    ) -> Result<bool, SessionError> {
        let Some(mut m) = self.cx() else {
            return Ok(false);
        };
        if m.is_paused() {
            return Ok(false);
        }
        while let Some(out) = m.machine.poll_output() {
            if carry(&mut m, out)? == Flow::Pause {
                *m.paused = true;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// What the operation `op` was for, once: `None` for one not posted through
    /// [`MachineCx::post`] (or whose completion came already).
    fn take_posted(&mut self, op: OpId) -> Option<P> {
        self.posted.remove(&op)
    }

    /// Ends the machine: the posted operations are forgotten, and it is handed back
    /// (once).
    fn close(&mut self) -> Option<M> {
        self.posted.clear();
        self.machine.take()
    }
}

/// A [`Session`] made of a [`StateMachine`] and its [`Driver`]: every callback goes to
/// the driver, and then the machine's outputs are carried out, in order, until none is
/// left or the driver pauses. See the [module docs](self).
pub struct MachineSession<D: Driver> {
    driver: D,
    engine: Engine<D::Machine, D::Posted>,
}

impl<D: Driver> MachineSession<D> {
    /// A session driving `machine` with `driver`. Nothing is polled before the
    /// connection is established.
    pub fn new(machine: D::Machine, driver: D) -> Self {
        MachineSession {
            driver,
            engine: Engine::new(machine),
        }
    }

    /// Runs one driver callback, then drains.
    fn run(
        &mut self,
        cx: &mut SessionCx<'_>,
        callback: impl FnOnce(
            &mut D,
            &mut MachineCx<'_, D::Machine, D::Posted>,
            &mut SessionCx<'_>,
        ) -> Result<(), SessionError>,
    ) -> Result<(), SessionError> {
        let mut m = self
            .engine
            .cx()
            .ok_or_else(|| D::error("connection closed".into()))?;
        callback(&mut self.driver, &mut m, cx)?;
        let driver = &mut self.driver;
        if self.engine.drain(|m, out| driver.carry(m, cx, out))? {
            if let Some(mut m) = self.engine.cx() {
                driver.drained(&mut m, cx)?;
            }
        }
        Ok(())
    }
}

impl<D: Driver> Session for MachineSession<D> {
    fn on_established(&mut self, cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        self.run(cx, |d, m, cx| d.on_established(m, cx))
    }

    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        self.run(cx, |d, m, cx| d.on_message(m, cx, msg))
    }

    fn on_op(
        &mut self,
        cx: &mut SessionCx<'_>,
        op: OpId,
        result: crate::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        let posted = self
            .engine
            .take_posted(op)
            .ok_or_else(|| D::error(format!("completion of unknown {op:?}")))?;
        self.run(cx, |d, m, cx| d.on_op(m, cx, posted, result))
    }

    fn on_wake(&mut self, cx: &mut SessionCx<'_>, token: u64) -> Result<(), SessionError> {
        self.run(cx, |d, m, cx| d.on_wake(m, cx, token))
    }

    fn on_refused(
        &mut self,
        cx: &mut SessionCx<'_>,
        tag: u32,
        why: BudgetError,
    ) -> Result<(), SessionError> {
        self.run(cx, |d, m, cx| d.on_refused(m, cx, tag, why))
    }

    fn on_close(&mut self, reason: &CloseReason) {
        if let Some(machine) = self.engine.close() {
            self.driver.on_close(machine, reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// Outputs as queued; an input queues more.
    struct Toy(VecDeque<u32>);

    impl StateMachine for Toy {
        type Output = u32;
        fn poll_output(&mut self) -> Option<u32> {
            self.0.pop_front()
        }
    }

    fn engine(outputs: &[u32]) -> Engine<Toy, &'static str> {
        Engine::new(Toy(outputs.iter().copied().collect()))
    }

    #[test]
    fn drains_in_order_until_none_is_left() {
        let mut e = engine(&[1, 2, 3]);
        let mut carried = Vec::new();
        let drained = e.drain(|_, out| {
            carried.push(out);
            Ok(Flow::Continue)
        });
        assert_eq!(drained, Ok(true));
        assert_eq!(carried, [1, 2, 3]);
        assert_eq!(e.drain(|_, _| unreachable!()), Ok(true));
    }

    #[test]
    fn a_pause_holds_the_later_outputs_until_resumed() {
        let mut e = engine(&[1, 2, 3]);
        let mut carried = Vec::new();
        let mut carry = |_: &mut MachineCx<'_, Toy, &str>, out| {
            carried.push(out);
            Ok(if out == 1 {
                Flow::Pause
            } else {
                Flow::Continue
            })
        };
        assert_eq!(e.drain(&mut carry), Ok(false));
        // Inputs while paused queue behind; nothing is carried out.
        e.cx().unwrap().machine.0.push_back(4);
        assert_eq!(e.drain(&mut carry), Ok(false));
        assert!(e.cx().unwrap().is_paused());
        e.cx().unwrap().resume();
        assert_eq!(e.drain(&mut carry), Ok(true));
        assert_eq!(carried, [1, 2, 3, 4]);
    }

    #[test]
    fn an_error_stops_the_drain_with_it() {
        let mut e = engine(&[1, 2, 3]);
        let mut carried = Vec::new();
        let drained = e.drain(|_, out| {
            carried.push(out);
            if out == 2 {
                return Err(SessionError::new("two is wrong"));
            }
            Ok(Flow::Continue)
        });
        assert_eq!(drained, Err(SessionError::new("two is wrong")));
        assert_eq!(carried, [1, 2]);
    }

    #[test]
    fn closing_hands_the_machine_back_once_and_forgets_posted_operations() {
        let mut e = engine(&[1]);
        e.cx().unwrap().track(OpId(7), "read");
        let machine = e.close().expect("the machine");
        assert_eq!(machine.0, [1]);
        assert!(e.posted.is_empty());
        assert!(e.close().is_none());
        assert!(e.cx().is_none());
        assert_eq!(e.drain(|_, _| unreachable!()), Ok(false));
    }

    #[test]
    fn posted_operations_are_found_by_id() {
        let mut e = engine(&[]);
        e.cx().unwrap().track(OpId(1), "read");
        e.cx().unwrap().track(OpId(2), "write");
        assert_eq!(e.take_posted(OpId(2)), Some("write"));
        assert_eq!(e.take_posted(OpId(2)), None);
        assert_eq!(e.take_posted(OpId(1)), Some("read"));
        assert_eq!(e.take_posted(OpId(3)), None);
    }
}
