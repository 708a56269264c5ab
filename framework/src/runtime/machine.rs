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
//! `lambda` a middling one, `files` the largest (it pauses while a chunk is read). A
//! compiled example is on [`MachineSession`]; `docs/writing-a-service.md` has a guide.

use std::collections::HashMap;
use std::marker::PhantomData;

use super::close::CloseReason;
use super::connection::{Op, SessionCx};
use super::service::{refused_by_default, Incoming, OpId, Session, SessionError};
use crate::proto::budget::BudgetError;
use crate::transport::{Transport, Verbs};

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

/// What a [`Driver`]'s callbacks work with: the state machine and the connection (two
/// fields, so that bytes of the one can go into the other), and the adapter's record of
/// the operations posted and of a pause.
pub struct MachineCx<'s, 'a, D: Driver<T>, T: Transport = Verbs> {
    /// The state machine, to feed inputs to.
    pub machine: &'s mut D::Machine,
    /// The connection, to carry outputs out with.
    pub conn: &'s mut SessionCx<'a, T>,
    posted: &'s mut HashMap<OpId, D::Posted>,
    paused: &'s mut bool,
}

impl<D: Driver<T>, T: Transport> MachineCx<'_, '_, D, T> {
    /// Posts a one-sided operation (see [`SessionCx::post`]) and remembers `what` it is
    /// for: its completion comes to [`Driver::on_op`] with `what`.
    pub fn post(&mut self, op: Op, what: D::Posted) -> Result<OpId, SessionError> {
        let id = self.conn.post(op)?;
        self.posted.insert(id, what);
        Ok(id)
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
pub trait Driver<T: Transport = Verbs>: Sized + Send + Unpin + 'static {
    /// The protocol.
    type Machine: StateMachine + Send + Unpin + 'static;
    /// What a posted operation was for (see [`MachineCx::post`]).
    type Posted: Send + Unpin + 'static;

    /// Carries out one output. [`Flow::Pause`] stops the drain until
    /// [`MachineCx::resume`].
    fn carry(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        out: <Self::Machine as StateMachine>::Output,
    ) -> Result<Flow, SessionError>;

    /// A message arrived ([`Session::on_message`]).
    fn on_message(
        &mut self,
        cx: &mut MachineCx<'_, '_, Self, T>,
        msg: Incoming,
    ) -> Result<(), SessionError>;

    /// The connection is established ([`Session::on_established`]). The drain after it
    /// carries out what the machine had to say first.
    fn on_established(&mut self, _cx: &mut MachineCx<'_, '_, Self, T>) -> Result<(), SessionError> {
        Ok(())
    }

    /// An operation posted with [`MachineCx::post`] completed, and `posted` is what it
    /// was for. A completion of any other operation closes the connection before this
    /// is called. By default a failed one closes it too, as [`Session::on_op`]'s does.
    fn on_op(
        &mut self,
        _cx: &mut MachineCx<'_, '_, Self, T>,
        _posted: Self::Posted,
        result: crate::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        result.map_err(|e| Self::error(format!("a one-sided operation failed: {e}")))
    }

    /// A wake-up ([`Session::on_wake`]): a job, an ask or a timer of the driver's.
    fn on_wake(
        &mut self,
        _cx: &mut MachineCx<'_, '_, Self, T>,
        _token: u64,
    ) -> Result<(), SessionError> {
        Ok(())
    }

    /// A message was not delivered ([`Session::on_refused`], whose default this is).
    fn on_refused(
        &mut self,
        _cx: &mut MachineCx<'_, '_, Self, T>,
        tag: u32,
        why: BudgetError,
    ) -> Result<(), SessionError> {
        refused_by_default(tag, why)
    }

    /// A drain ended with nothing left to carry out (not paused): the place for what
    /// follows the machine's state rather than one output, such as a deadline while it
    /// waits on the peer.
    fn drained(&mut self, _cx: &mut MachineCx<'_, '_, Self, T>) -> Result<(), SessionError> {
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

/// An [`Engine`] borrowed for one callback or one output: a [`MachineCx`] without the
/// connection.
struct Parts<'s, M, P> {
    machine: &'s mut M,
    posted: &'s mut HashMap<OpId, P>,
    paused: &'s mut bool,
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
    fn parts(&mut self) -> Option<Parts<'_, M, P>> {
        Some(Parts {
            machine: self.machine.as_mut()?,
            posted: &mut self.posted,
            paused: &mut self.paused,
        })
    }

    /// Carries out the pending outputs in order until there are none (`Ok(true)`), one
    /// pauses or the drain is paused or closed already (`Ok(false)`), or one fails.
    fn drain(
        &mut self,
        mut carry: impl FnMut(Parts<'_, M, P>, M::Output) -> Result<Flow, SessionError>,
    ) -> Result<bool, SessionError> {
        loop {
            if self.paused {
                return Ok(false);
            }
            let Some(machine) = self.machine.as_mut() else {
                return Ok(false);
            };
            let Some(out) = machine.poll_output() else {
                return Ok(true);
            };
            let parts = Parts {
                machine,
                posted: &mut self.posted,
                paused: &mut self.paused,
            };
            if carry(parts, out)? == Flow::Pause {
                self.paused = true;
                return Ok(false);
            }
        }
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

impl<M, P> Parts<'_, M, P> {
    /// With the connection: what a driver's callback gets.
    fn with<'c, 'a, D: Driver<T, Machine = M, Posted = P>, T: Transport>(
        &'c mut self,
        conn: &'c mut SessionCx<'a, T>,
    ) -> MachineCx<'c, 'a, D, T> {
        MachineCx {
            machine: self.machine,
            conn,
            posted: self.posted,
            paused: self.paused,
        }
    }
}

/// A [`Session`] made of a [`StateMachine`] and its [`Driver`]: every callback goes to
/// the driver, and then the machine's outputs are carried out, in order, until none is
/// left or the driver pauses.
///
/// For a protocol written as a state machine that does no I/O (inputs in through its own
/// methods, actions out of [`poll_output`](StateMachine::poll_output)), so that it is
/// tested and fuzzed without a device: the driver only maps callbacks to inputs and
/// carries out one output at a time, and the plumbing between (the drain after every
/// callback, pausing, matching completions to what was posted, dropping the machine on
/// close) is done here once. `rdmactor-services`' `rping` is the smallest user.
///
/// A driver written for every transport `T` (as below) serves over verbs and over
/// loopback alike; one written for the default (`impl Driver for ...` with
/// `MachineCx<'_, '_, Self>`) serves over verbs only.
///
/// ```
/// use std::collections::VecDeque;
///
/// use rdmactor::runtime::{
///     Driver, Flow, Incoming, MachineCx, MachineSession, PeerInfo, Service, Session,
///     SessionError, StateMachine,
/// };
/// use rdmactor::transport::Transport;
///
/// /// The protocol: every message is answered with its length, as text. No I/O.
/// #[derive(Default)]
/// struct Lengths {
///     out: VecDeque<String>,
/// }
///
/// impl Lengths {
///     fn handle_message(&mut self, bytes: &[u8]) {
///         self.out.push_back(bytes.len().to_string());
///     }
/// }
///
/// impl StateMachine for Lengths {
///     type Output = String;
///     fn poll_output(&mut self) -> Option<String> {
///         self.out.pop_front()
///     }
/// }
///
/// /// Carries the answers out.
/// struct LengthsDriver;
///
/// impl<T: Transport> Driver<T> for LengthsDriver {
///     type Machine = Lengths;
///     type Posted = ();
///
///     fn on_message(
///         &mut self,
///         cx: &mut MachineCx<'_, '_, Self, T>,
///         msg: Incoming,
///     ) -> Result<(), SessionError> {
///         cx.machine.handle_message(&msg.data);
///         Ok(())
///     }
///
///     fn carry(
///         &mut self,
///         cx: &mut MachineCx<'_, '_, Self, T>,
///         answer: String,
///     ) -> Result<Flow, SessionError> {
///         cx.conn.send(0, answer.into_bytes())?;
///         Ok(Flow::Continue)
///     }
/// }
///
/// struct LengthsService;
///
/// impl<T: Transport> Service<T> for LengthsService {
///     fn session(&self, _peer: &PeerInfo) -> Box<dyn Session<T>> {
///         Box::new(MachineSession::new(Lengths::default(), LengthsDriver))
///     }
/// }
/// ```
pub struct MachineSession<D: Driver<T>, T: Transport = Verbs> {
    driver: D,
    engine: Engine<D::Machine, D::Posted>,
    /// Which transport's connections it drives: the driver's callbacks are for one.
    transport: PhantomData<fn() -> T>,
}

impl<D: Driver<T>, T: Transport> MachineSession<D, T> {
    /// A session driving `machine` with `driver`. Nothing is polled before the
    /// connection is established.
    pub fn new(machine: D::Machine, driver: D) -> Self {
        MachineSession {
            driver,
            engine: Engine::new(machine),
            transport: PhantomData,
        }
    }

    /// Runs one driver callback, then drains.
    fn run(
        &mut self,
        conn: &mut SessionCx<'_, T>,
        callback: impl FnOnce(&mut D, &mut MachineCx<'_, '_, D, T>) -> Result<(), SessionError>,
    ) -> Result<(), SessionError> {
        let Self { driver, engine, .. } = self;
        let mut parts = engine
            .parts()
            .ok_or_else(|| D::error("connection closed".into()))?;
        callback(driver, &mut parts.with(conn))?;
        if engine.drain(|mut parts, out| driver.carry(&mut parts.with(conn), out))? {
            if let Some(mut parts) = engine.parts() {
                driver.drained(&mut parts.with(conn))?;
            }
        }
        Ok(())
    }
}

impl<D: Driver<T>, T: Transport> Session<T> for MachineSession<D, T> {
    fn on_established(&mut self, cx: &mut SessionCx<'_, T>) -> Result<(), SessionError> {
        self.run(cx, |d, cx| d.on_established(cx))
    }

    fn on_message(&mut self, cx: &mut SessionCx<'_, T>, msg: Incoming) -> Result<(), SessionError> {
        self.run(cx, |d, cx| d.on_message(cx, msg))
    }

    fn on_op(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        op: OpId,
        result: crate::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        let posted = self
            .engine
            .take_posted(op)
            .ok_or_else(|| D::error(format!("completion of unknown {op:?}")))?;
        self.run(cx, |d, cx| d.on_op(cx, posted, result))
    }

    fn on_wake(&mut self, cx: &mut SessionCx<'_, T>, token: u64) -> Result<(), SessionError> {
        self.run(cx, |d, cx| d.on_wake(cx, token))
    }

    fn on_refused(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        tag: u32,
        why: BudgetError,
    ) -> Result<(), SessionError> {
        self.run(cx, |d, cx| d.on_refused(cx, tag, why))
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

    type Toys<'s> = Parts<'s, Toy, &'static str>;

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
    fn outputs_queued_while_carrying_one_out_follow_in_the_same_drain() {
        let mut e = engine(&[1]);
        let mut carried = Vec::new();
        let drained = e.drain(|p: Toys<'_>, out| {
            carried.push(out);
            if out == 1 {
                // An input fed while carrying out (a window registered, say).
                p.machine.0.push_back(2);
            }
            Ok(Flow::Continue)
        });
        assert_eq!(drained, Ok(true));
        assert_eq!(carried, [1, 2]);
    }

    #[test]
    fn a_pause_holds_the_later_outputs_until_resumed() {
        let mut e = engine(&[1, 2, 3]);
        let mut carried = Vec::new();
        let mut carry = |_: Toys<'_>, out| {
            carried.push(out);
            Ok(if out == 1 {
                Flow::Pause
            } else {
                Flow::Continue
            })
        };
        assert_eq!(e.drain(&mut carry), Ok(false));
        // Inputs while paused queue behind; nothing is carried out.
        e.parts().unwrap().machine.0.push_back(4);
        assert_eq!(e.drain(&mut carry), Ok(false));
        assert!(*e.parts().unwrap().paused);
        // What `MachineCx::resume` does.
        *e.parts().unwrap().paused = false;
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
        e.posted.insert(OpId(7), "read");
        let machine = e.close().expect("the machine");
        assert_eq!(machine.0, [1]);
        assert_eq!(e.take_posted(OpId(7)), None);
        assert!(e.close().is_none());
        assert!(e.parts().is_none());
        assert_eq!(e.drain(|_, _| unreachable!()), Ok(false));
    }

    #[test]
    fn a_posted_operation_is_found_once() {
        let mut e = engine(&[]);
        e.posted.insert(OpId(1), "read");
        e.posted.insert(OpId(2), "write");
        assert_eq!(e.take_posted(OpId(2)), Some("write"));
        assert_eq!(e.take_posted(OpId(2)), None);
        assert_eq!(e.take_posted(OpId(1)), Some("read"));
        assert_eq!(e.take_posted(OpId(3)), None);
    }
}
