//! The rping server cycle as a pure state machine (no I/O, no verbs, no clock),
//! so it can be tested byte for byte against a simulated `rping -c` client and
//! driven by any connection actor. The protocol itself is described in the
//! parent module.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::collections::VecDeque;
use std::fmt;

/// Length of every rping control message (`struct rping_rdma_info`): both
/// sides reject anything else, so a peer speaking another protocol is caught
/// on its first message.
pub const RPING_INFO_LEN: usize = 16;

/// The server's "go ahead". The stock server never fills its send buffer
/// (the control block is zeroed at allocation), and the client checks only
/// the length, so zeros are what the stock server sends.
pub const GO_AHEAD: [u8; RPING_INFO_LEN] = [0; RPING_INFO_LEN];

/// Limits applied to what a client may ask of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpingConfig {
    /// Largest advertised size accepted. It is also the size of the local
    /// buffer, so that any accepted READ fits. The stock client allows
    /// `-S` from 26 to 65535, so [`RpingConfig::DEFAULT_MAX_SIZE`] is
    /// enough for all of them.
    pub max_size: u32,
}

impl RpingConfig {
    /// 64 KiB: the stock rping's own `RPING_BUFSIZE`.
    pub const DEFAULT_MAX_SIZE: u32 = 64 * 1024;
}

impl Default for RpingConfig {
    fn default() -> Self {
        Self {
            max_size: Self::DEFAULT_MAX_SIZE,
        }
    }
}

/// A buffer the client advertised: the decoded form of `struct rping_rdma_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuf {
    pub addr: u64,
    pub rkey: u32,
    pub len: u32,
}

impl RemoteBuf {
    /// Parses the wire form, which is big-endian `addr`, `rkey`, `len` with no
    /// padding. The length must be exact: the stock peers compare the
    /// received length with `sizeof(struct rping_rdma_info)`.
    pub fn decode(bytes: &[u8]) -> Result<Self, RpingError> {
        let b: &[u8; RPING_INFO_LEN] = bytes
            .try_into()
            .map_err(|_| RpingError::BadLength(bytes.len()))?;
        let mut addr = [0u8; 8];
        let mut rkey = [0u8; 4];
        let mut len = [0u8; 4];
        addr.copy_from_slice(&b[0..8]);
        rkey.copy_from_slice(&b[8..12]);
        len.copy_from_slice(&b[12..16]);
        Ok(Self {
            addr: u64::from_be_bytes(addr),
            rkey: u32::from_be_bytes(rkey),
            len: u32::from_be_bytes(len),
        })
    }

    /// The wire form. The server never sends an advert, but a Rust rping
    /// client or a test would need this.
    pub fn encode(&self) -> [u8; RPING_INFO_LEN] {
        let mut out = [0u8; RPING_INFO_LEN];
        out[0..8].copy_from_slice(&self.addr.to_be_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        out[12..16].copy_from_slice(&self.len.to_be_bytes());
        out
    }
}

/// Work the driver must post on the queue pair. Each one leads to exactly one
/// `handle_*_done` call once its completion arrives, if the driver signals it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpingAction {
    /// RDMA READ `remote.len` bytes from `remote` into the local buffer at
    /// offset 0. The length never exceeds [`RpingSession::buffer_len`].
    Read { remote: RemoteBuf },
    /// SEND these bytes. They are always [`GO_AHEAD`], but are included here
    /// so the driver does not need to know that.
    Send { bytes: [u8; RPING_INFO_LEN] },
    /// RDMA WRITE local buffer `[0, len)` to `remote.addr`. `len <= remote.len`
    /// always holds.
    Write { remote: RemoteBuf, len: u32 },
}

/// Why a session must end. Every error is terminal: the session goes to a
/// failed state, later calls fail as well, and the driver should disconnect,
/// as the stock server does on any surprise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RpingError {
    /// A received message was not exactly [`RPING_INFO_LEN`] bytes long.
    BadLength(usize),
    /// An advert of size 0, which would make the next step an empty READ or
    /// WRITE. The stock client never sends one.
    ZeroSize,
    /// An advert larger than [`RpingConfig::max_size`], which would not fit
    /// the local buffer.
    SizeTooLarge { size: u32, max: u32 },
    /// The sink advert is smaller than the data to echo. Writing anyway would
    /// cause a remote access error that breaks the queue pair.
    SinkTooSmall { sink: u32, needed: u32 },
    /// The client sent an advert while the server was not waiting for one,
    /// for example during its own READ. The stock client sends one advert and
    /// then waits for each "go ahead", so this is a protocol violation.
    UnexpectedMessage { state: &'static str },
    /// The driver reported a completion that was not requested in this state.
    /// This is a bug in the driver, not in the peer.
    UnexpectedCompletion {
        completion: &'static str,
        state: &'static str,
    },
    /// [`RpingSession::handle_read_done_with`] got fewer bytes than the READ
    /// transferred, so the echo length cannot be worked out.
    ShortReadData { got: usize, expected: u32 },
}

impl fmt::Display for RpingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadLength(n) => write!(
                f,
                "rping message is {n} bytes, expected exactly {RPING_INFO_LEN}"
            ),
            Self::ZeroSize => write!(f, "rping client advertised a zero-length buffer"),
            Self::SizeTooLarge { size, max } => write!(
                f,
                "rping client advertised {size} bytes, more than the configured maximum of {max}"
            ),
            Self::SinkTooSmall { sink, needed } => write!(
                f,
                "rping sink buffer is {sink} bytes but {needed} bytes must be echoed"
            ),
            Self::UnexpectedMessage { state } => {
                write!(
                    f,
                    "rping client sent a message while the server was {state}"
                )
            }
            Self::UnexpectedCompletion { completion, state } => write!(
                f,
                "{completion} completion reported while the rping session was {state}"
            ),
            Self::ShortReadData { got, expected } => write!(
                f,
                "read data is {got} bytes, but the RDMA READ transferred {expected}"
            ),
        }
    }
}

impl std::error::Error for RpingError {}

/// Where the server is within one ping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between pings: waiting for the client's source advert.
    AwaitSource,
    /// Our READ of `len` bytes is outstanding.
    Reading { len: u32 },
    /// The first "go ahead" was sent; waiting for the sink advert. `echo_len`
    /// bytes of the local buffer will be written back.
    AwaitSink { echo_len: u32 },
    /// Our WRITE back to the sink is outstanding.
    Writing,
    /// A previous call failed; nothing further is accepted.
    Failed,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            Self::AwaitSource => "awaiting the source advert",
            Self::Reading { .. } => "reading the source buffer",
            Self::AwaitSink { .. } => "awaiting the sink advert",
            Self::Writing => "writing the sink buffer",
            Self::Failed => "failed",
        }
    }
}

/// One rping client connection, seen from the server.
///
/// # Driving order
///
/// The session only decides what to do next; the driver does it. After
/// [`new`](Self::new), and after **every** `handle_*` call (including one that
/// returned `Err`, although then nothing is queued), call
/// [`poll_action`](Self::poll_action) until it returns `None`, and post each
/// action in that order. Then feed in events as they happen:
///
/// * a receive completion carrying the client's SEND → [`handle_recv`](Self::handle_recv)
///   (the driver must keep a receive posted at all times; the stock client
///   keeps only one SEND in flight, so one receive buffer is enough);
/// * the READ's completion → [`handle_read_done`](Self::handle_read_done), or
///   [`handle_read_done_with`](Self::handle_read_done_with) to copy the stock
///   server's `strlen + 1` write length exactly;
/// * the WRITE's completion → [`handle_write_done`](Self::handle_write_done);
/// * a SEND's completion → [`handle_send_done`](Self::handle_send_done). This
///   is optional: nothing waits for it, because the client may answer a
///   "go ahead" before its send completion reaches the server. It only
///   checks the count. A driver that posts SENDs unsignaled just skips it.
///
/// On `Err`, disconnect. A client disconnect is not an error for the session.
/// It is a normal end if [`is_idle`](Self::is_idle) holds, and otherwise it
/// happened in the middle of a ping.
#[derive(Debug)]
pub struct RpingSession {
    config: RpingConfig,
    state: State,
    /// At most one action is ever queued in a valid run. A queue is used
    /// anyway so that a driver that polls late does not lose an action.
    actions: VecDeque<RpingAction>,
    sends_in_flight: u32,
    iterations: u64,
}

impl RpingSession {
    pub fn new(config: RpingConfig) -> Self {
        Self {
            config,
            state: State::AwaitSource,
            actions: VecDeque::with_capacity(1),
            sends_in_flight: 0,
            iterations: 0,
        }
    }

    /// Size of the local RDMA buffer the driver must register, with local
    /// write access for READ and read access for WRITE. It equals
    /// `max_size`, because the client picks the size and the stock server's
    /// failure mode (a buffer sized by its own `-S`) is what this avoids.
    pub fn buffer_len(&self) -> u32 {
        self.config.max_size
    }

    /// Pings fully echoed, i.e. WRITEs completed. This is the same count the
    /// client's `-C` controls.
    pub fn iterations(&self) -> u64 {
        self.iterations
    }

    /// True between pings. This is the only state in which a client
    /// disconnect means that the run finished normally.
    pub fn is_idle(&self) -> bool {
        self.state == State::AwaitSource
    }

    /// A SEND from the client arrived. The stock client alternates source and
    /// sink adverts without marking which is which, so the meaning is taken
    /// from the state.
    pub fn handle_recv(&mut self, bytes: &[u8]) -> Result<(), RpingError> {
        if self.state == State::Failed {
            return Err(RpingError::UnexpectedMessage {
                state: self.state.name(),
            });
        }
        // Length is checked before state, the same order the stock server uses.
        let remote = match RemoteBuf::decode(bytes) {
            Ok(remote) => remote,
            Err(e) => return self.fail(e),
        };
        match self.state {
            State::AwaitSource => {
                if let Err(e) = self.check_size(remote.len) {
                    return self.fail(e);
                }
                self.state = State::Reading { len: remote.len };
                self.actions.push_back(RpingAction::Read { remote });
                Ok(())
            }
            State::AwaitSink { echo_len } => {
                if let Err(e) = self.check_size(remote.len) {
                    return self.fail(e);
                }
                if remote.len < echo_len {
                    return self.fail(RpingError::SinkTooSmall {
                        sink: remote.len,
                        needed: echo_len,
                    });
                }
                self.state = State::Writing;
                self.actions.push_back(RpingAction::Write {
                    remote,
                    len: echo_len,
                });
                Ok(())
            }
            state => self.fail(RpingError::UnexpectedMessage {
                state: state.name(),
            }),
        }
    }

    /// Our READ completed. Echoes back everything that was read. For the stock
    /// client this matches the stock server's `strlen + 1` exactly, because
    /// that client writes its only NUL into the last byte. It also keeps the
    /// driver from having to look at the buffer.
    pub fn handle_read_done(&mut self) -> Result<(), RpingError> {
        match self.state {
            State::Reading { len } => {
                self.read_finished(len);
                Ok(())
            }
            state => self.fail(RpingError::UnexpectedCompletion {
                completion: "RDMA READ",
                state: state.name(),
            }),
        }
    }

    /// Our READ completed, and `data` is the local buffer from offset 0 (at
    /// least the READ length; extra bytes are ignored). Copies the stock
    /// server exactly: the echo is cut after the first NUL (`strlen + 1`).
    /// This only matters for clients that put a NUL before the last byte.
    /// Unlike the C code, the length is limited to what was read when no NUL
    /// is found.
    pub fn handle_read_done_with(&mut self, data: &[u8]) -> Result<(), RpingError> {
        match self.state {
            State::Reading { len } => {
                let Some(read) = data.get(..len as usize) else {
                    return self.fail(RpingError::ShortReadData {
                        got: data.len(),
                        expected: len,
                    });
                };
                let echo_len = read
                    .iter()
                    .position(|&b| b == 0)
                    // The NUL lies within the first `len` bytes, so `nul + 1 <= len`.
                    .map_or(len, |nul| {
                        u32::try_from(nul).map_or(len, |nul| nul.saturating_add(1))
                    });
                self.read_finished(echo_len);
                Ok(())
            }
            state => self.fail(RpingError::UnexpectedCompletion {
                completion: "RDMA READ",
                state: state.name(),
            }),
        }
    }

    /// Our WRITE completed. This finishes a ping, and the second "go ahead"
    /// tells the client that its sink now holds the echo.
    pub fn handle_write_done(&mut self) -> Result<(), RpingError> {
        match self.state {
            State::Writing => {
                // Our own count of pings.
                self.iterations = self.iterations.wrapping_add(1);
                self.state = State::AwaitSource;
                self.queue_go_ahead();
                Ok(())
            }
            state => self.fail(RpingError::UnexpectedCompletion {
                completion: "RDMA WRITE",
                state: state.name(),
            }),
        }
    }

    /// One of our SENDs completed. Only the count is checked, since the
    /// protocol never waits on it (see the type-level docs).
    pub fn handle_send_done(&mut self) -> Result<(), RpingError> {
        if self.state == State::Failed || self.sends_in_flight == 0 {
            return self.fail(RpingError::UnexpectedCompletion {
                completion: "SEND",
                state: self.state.name(),
            });
        }
        // Not zero (checked above).
        self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
        Ok(())
    }

    /// The next operation to post, in order. Call until `None` after every
    /// `handle_*` call.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<RpingAction> {
        self.actions.pop_front()
    }

    fn check_size(&self, size: u32) -> Result<(), RpingError> {
        if size == 0 {
            Err(RpingError::ZeroSize)
        } else if size > self.config.max_size {
            Err(RpingError::SizeTooLarge {
                size,
                max: self.config.max_size,
            })
        } else {
            Ok(())
        }
    }

    fn read_finished(&mut self, echo_len: u32) {
        self.state = State::AwaitSink { echo_len };
        self.queue_go_ahead();
    }

    fn queue_go_ahead(&mut self) {
        // Our own SENDs, at most two outstanding in the cycle.
        self.sends_in_flight = self.sends_in_flight.saturating_add(1);
        self.actions
            .push_back(RpingAction::Send { bytes: GO_AHEAD });
    }

    fn fail(&mut self, err: RpingError) -> Result<(), RpingError> {
        self.state = State::Failed;
        self.actions.clear();
        Err(err)
    }
}

// The simulated client's and the tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    const START_ADDR: u64 = 0x0000_7f3a_1234_5000;
    const START_RKEY: u32 = 0x0001_1a2b;
    const SINK_ADDR: u64 = 0x0000_7f3a_9876_a000;
    const SINK_RKEY: u32 = 0x0002_3c4d;

    /// `struct rping_rdma_info` as the C client fills it (`htobe64` and
    /// `htobe32`). Written out separately from `RemoteBuf::encode` so that the
    /// byte order is checked, not assumed.
    fn info(addr: u64, rkey: u32, size: u32) -> [u8; 16] {
        let mut b = [0u8; 16];
        for (i, byte) in b[0..8].iter_mut().enumerate() {
            *byte = (addr >> (56 - 8 * i)) as u8;
        }
        for (i, byte) in b[8..12].iter_mut().enumerate() {
            *byte = (rkey >> (24 - 8 * i)) as u8;
        }
        for (i, byte) in b[12..16].iter_mut().enumerate() {
            *byte = (size >> (24 - 8 * i)) as u8;
        }
        b
    }

    /// The states `rping_test_client` and `client_recv` cycle through.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum ClientState {
        ReadAdv,
        WriteAdv,
        WriteComplete,
    }

    /// The stock `rping -c -V` client, reduced to its buffer handling.
    struct Client {
        size: usize,
        start_buf: Vec<u8>,
        /// The sink. It starts as junk, like the client's uninitialised `malloc`.
        rdma_buf: Vec<u8>,
        ping: u32,
        start: u8,
        state: ClientState,
    }

    impl Client {
        fn new(size: usize) -> Self {
            Self {
                size,
                start_buf: vec![0; size],
                rdma_buf: vec![0xa5; size],
                ping: 0,
                start: 65,
                state: ClientState::WriteComplete,
            }
        }

        /// Top of the `rping_test_client` loop: fill the source and advertise it.
        fn begin_ping(&mut self) -> [u8; 16] {
            self.state = ClientState::ReadAdv;
            let text = format!("rdma-ping-{}: ", self.ping);
            let cc = text.len();
            assert!(
                cc < self.size,
                "rping enforces a minimum size that fits the text"
            );
            self.start_buf[..cc].copy_from_slice(text.as_bytes());
            let mut c = self.start;
            for byte in &mut self.start_buf[cc..] {
                *byte = c;
                c += 1;
                if c > 122 {
                    c = 65;
                }
            }
            self.start += 1;
            if self.start > 122 {
                self.start = 65;
            }
            self.start_buf[self.size - 1] = 0;
            self.ping += 1;
            info(START_ADDR, START_RKEY, self.size as u32)
        }

        /// `client_recv`, plus what the main loop does when woken up.
        fn on_recv(&mut self, bytes: &[u8]) -> Option<[u8; 16]> {
            assert_eq!(bytes.len(), 16, "client_recv rejects other lengths");
            match self.state {
                ClientState::ReadAdv => {
                    self.state = ClientState::WriteAdv;
                    Some(info(SINK_ADDR, SINK_RKEY, self.size as u32))
                }
                ClientState::WriteAdv => {
                    self.state = ClientState::WriteComplete;
                    // -V: memcmp(start_buf, rdma_buf, size).
                    assert_eq!(self.start_buf, self.rdma_buf, "data mismatch!");
                    None
                }
                ClientState::WriteComplete => panic!("go-ahead with no ping in progress"),
            }
        }

        /// What the client's HCA would allow a remote access to touch.
        fn region(&mut self, addr: u64, rkey: u32, len: u32) -> &mut [u8] {
            let (base, buf) = match rkey {
                START_RKEY => (START_ADDR, &mut self.start_buf),
                SINK_RKEY => (SINK_ADDR, &mut self.rdma_buf),
                _ => panic!("remote access with unknown rkey {rkey:#x}"),
            };
            let off = usize::try_from(addr - base).unwrap();
            &mut buf[off..off + len as usize]
        }
    }

    enum Event {
        Recv(Vec<u8>),
        ReadDone,
        WriteDone,
        SendDone,
    }

    /// Loopback "fabric": runs server actions against the client's memory and
    /// feeds completions back in the order a real RC connection may produce
    /// them.
    struct Harness {
        server: RpingSession,
        client: Client,
        local: Vec<u8>,
        events: VecDeque<Event>,
        exact_strlen: bool,
        actions: Vec<RpingAction>,
    }

    impl Harness {
        fn new(max_size: u32, client_size: usize, exact_strlen: bool) -> Self {
            let server = RpingSession::new(RpingConfig { max_size });
            let local = vec![0; server.buffer_len() as usize];
            Self {
                server,
                client: Client::new(client_size),
                local,
                events: VecDeque::new(),
                exact_strlen,
                actions: Vec::new(),
            }
        }

        fn ping(&mut self) {
            let advert = self.client.begin_ping();
            self.events.push_back(Event::Recv(advert.to_vec()));
            while let Some(event) = self.events.pop_front() {
                let result = match event {
                    Event::Recv(bytes) => self.server.handle_recv(&bytes),
                    Event::ReadDone if self.exact_strlen => {
                        self.server.handle_read_done_with(&self.local)
                    }
                    Event::ReadDone => self.server.handle_read_done(),
                    Event::WriteDone => self.server.handle_write_done(),
                    Event::SendDone => self.server.handle_send_done(),
                };
                result.unwrap();
                while let Some(action) = self.server.poll_action() {
                    self.execute(action);
                }
            }
            assert_eq!(self.client.state, ClientState::WriteComplete);
            assert!(self.server.is_idle());
        }

        fn execute(&mut self, action: RpingAction) {
            self.actions.push(action);
            match action {
                RpingAction::Read { remote } => {
                    let len = remote.len as usize;
                    assert!(len <= self.local.len());
                    let src = self.client.region(remote.addr, remote.rkey, remote.len);
                    self.local[..len].copy_from_slice(src);
                    self.events.push_back(Event::ReadDone);
                }
                RpingAction::Write { remote, len } => {
                    assert!(len <= remote.len);
                    let dst = self.client.region(remote.addr, remote.rkey, len);
                    dst.copy_from_slice(&self.local[..len as usize]);
                    self.events.push_back(Event::WriteDone);
                }
                RpingAction::Send { bytes } => {
                    // The client may answer before our send completion is
                    // polled; model that worst case.
                    if let Some(reply) = self.client.on_recv(&bytes) {
                        self.events.push_back(Event::Recv(reply.to_vec()));
                    }
                    self.events.push_back(Event::SendDone);
                }
            }
        }
    }

    /// A session advanced to "READ outstanding".
    fn reading(max_size: u32, size: u32) -> RpingSession {
        let mut s = RpingSession::new(RpingConfig { max_size });
        s.handle_recv(&info(START_ADDR, START_RKEY, size)).unwrap();
        assert!(matches!(s.poll_action(), Some(RpingAction::Read { .. })));
        s
    }

    #[test]
    fn stock_client_default_size_completes_with_exact_actions() {
        let mut h = Harness::new(RpingConfig::DEFAULT_MAX_SIZE, 64, false);
        for _ in 0..5 {
            h.ping();
        }
        assert_eq!(h.server.iterations(), 5);
        assert_eq!(h.actions.len(), 20);
        let start = RemoteBuf {
            addr: START_ADDR,
            rkey: START_RKEY,
            len: 64,
        };
        let sink = RemoteBuf {
            addr: SINK_ADDR,
            rkey: SINK_RKEY,
            len: 64,
        };
        for chunk in h.actions.chunks(4) {
            assert_eq!(
                chunk,
                [
                    RpingAction::Read { remote: start },
                    RpingAction::Send { bytes: [0; 16] },
                    RpingAction::Write {
                        remote: sink,
                        len: 64
                    },
                    RpingAction::Send { bytes: [0; 16] },
                ]
            );
        }
    }

    #[test]
    fn stock_client_all_sizes_and_both_read_done_variants() {
        // 26 and 65535 are the limits the stock client accepts for -S.
        for size in [26usize, 27, 64, 1000, 4096, 65535] {
            for exact in [false, true] {
                let mut h = Harness::new(RpingConfig::DEFAULT_MAX_SIZE, size, exact);
                // More than 58 pings so the rotating start letter wraps.
                for _ in 0..60 {
                    h.ping();
                }
                assert_eq!(h.server.iterations(), 60);
                // The stock client's only NUL is its last byte, so strlen+1 == size.
                for a in &h.actions {
                    if let RpingAction::Write { len, .. } = a {
                        assert_eq!(*len as usize, size);
                    }
                }
            }
        }
    }

    #[test]
    fn size_equal_to_max_is_accepted() {
        let mut h = Harness::new(100, 100, true);
        h.ping();
        h.ping();
        assert_eq!(h.server.iterations(), 2);
        assert_eq!(h.server.buffer_len(), 100);
    }

    #[test]
    fn remote_buf_wire_format_is_network_order() {
        let bytes = info(0x0102_0304_0506_0708, 0x090a_0b0c, 0x0d0e_0f10);
        assert_eq!(
            bytes,
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
        );
        let rb = RemoteBuf::decode(&bytes).unwrap();
        assert_eq!(
            rb,
            RemoteBuf {
                addr: 0x0102_0304_0506_0708,
                rkey: 0x090a_0b0c,
                len: 0x0d0e_0f10
            }
        );
        assert_eq!(rb.encode(), bytes);
    }

    #[test]
    fn exact_variant_echoes_strlen_plus_one() {
        let mut s = reading(1024, 64);
        let mut data = vec![b'x'; 1024];
        data[9] = 0;
        s.handle_read_done_with(&data).unwrap();
        assert_eq!(s.poll_action(), Some(RpingAction::Send { bytes: GO_AHEAD }));
        s.handle_recv(&info(SINK_ADDR, SINK_RKEY, 64)).unwrap();
        let Some(RpingAction::Write { len, .. }) = s.poll_action() else {
            panic!()
        };
        assert_eq!(len, 10);

        // No NUL within what was read: limited to the READ length, where C would overrun.
        let mut s = reading(1024, 64);
        s.handle_read_done_with(&[b'x'; 1024]).unwrap();
        let _ = s.poll_action();
        s.handle_recv(&info(SINK_ADDR, SINK_RKEY, 64)).unwrap();
        let Some(RpingAction::Write { len, .. }) = s.poll_action() else {
            panic!()
        };
        assert_eq!(len, 64);

        // Fewer bytes than the READ moved cannot be judged.
        let mut s = reading(1024, 64);
        assert_eq!(
            s.handle_read_done_with(&[1; 63]),
            Err(RpingError::ShortReadData {
                got: 63,
                expected: 64
            })
        );
    }

    #[test]
    fn message_of_wrong_length_is_refused() {
        for n in [0usize, 8, 15, 17, 32] {
            let mut s = RpingSession::new(RpingConfig::default());
            assert_eq!(s.handle_recv(&vec![0; n]), Err(RpingError::BadLength(n)));
            assert_eq!(s.poll_action(), None);
        }
        // Also while waiting for the sink advert.
        let mut s = reading(1024, 64);
        s.handle_read_done().unwrap();
        let _ = s.poll_action();
        assert_eq!(s.handle_recv(&[0; 12]), Err(RpingError::BadLength(12)));
    }

    #[test]
    fn zero_size_is_refused_for_source_and_sink() {
        let mut s = RpingSession::new(RpingConfig::default());
        assert_eq!(
            s.handle_recv(&info(START_ADDR, START_RKEY, 0)),
            Err(RpingError::ZeroSize)
        );
        assert_eq!(s.poll_action(), None);

        let mut s = reading(1024, 64);
        s.handle_read_done().unwrap();
        let _ = s.poll_action();
        assert_eq!(
            s.handle_recv(&info(SINK_ADDR, SINK_RKEY, 0)),
            Err(RpingError::ZeroSize)
        );
        assert_eq!(s.poll_action(), None);
    }

    #[test]
    fn size_above_max_is_refused() {
        let mut s = RpingSession::new(RpingConfig { max_size: 4096 });
        assert_eq!(
            s.handle_recv(&info(START_ADDR, START_RKEY, 4097)),
            Err(RpingError::SizeTooLarge {
                size: 4097,
                max: 4096
            })
        );
        assert_eq!(s.poll_action(), None);

        let mut s = RpingSession::new(RpingConfig::default());
        assert_eq!(
            s.handle_recv(&info(START_ADDR, START_RKEY, u32::MAX)),
            Err(RpingError::SizeTooLarge {
                size: u32::MAX,
                max: 65536
            })
        );
    }

    #[test]
    fn sink_smaller_than_echo_is_refused() {
        let mut s = reading(1024, 64);
        s.handle_read_done().unwrap();
        let _ = s.poll_action();
        assert_eq!(
            s.handle_recv(&info(SINK_ADDR, SINK_RKEY, 63)),
            Err(RpingError::SinkTooSmall {
                sink: 63,
                needed: 64
            })
        );
        assert_eq!(s.poll_action(), None);
    }

    #[test]
    fn advert_while_read_or_write_outstanding_is_refused() {
        let mut s = reading(1024, 64);
        assert_eq!(
            s.handle_recv(&info(SINK_ADDR, SINK_RKEY, 64)),
            Err(RpingError::UnexpectedMessage {
                state: "reading the source buffer"
            })
        );
        assert_eq!(s.poll_action(), None);

        let mut s = reading(1024, 64);
        s.handle_read_done().unwrap();
        let _ = s.poll_action();
        s.handle_recv(&info(SINK_ADDR, SINK_RKEY, 64)).unwrap();
        let _ = s.poll_action();
        assert_eq!(
            s.handle_recv(&info(START_ADDR, START_RKEY, 64)),
            Err(RpingError::UnexpectedMessage {
                state: "writing the sink buffer"
            })
        );
    }

    #[test]
    fn completion_in_wrong_state_is_refused() {
        let idle = || RpingSession::new(RpingConfig::default());
        let mut s = idle();
        assert!(matches!(
            s.handle_read_done(),
            Err(RpingError::UnexpectedCompletion {
                completion: "RDMA READ",
                ..
            })
        ));
        let mut s = idle();
        assert!(matches!(
            s.handle_read_done_with(&[0; 16]),
            Err(RpingError::UnexpectedCompletion {
                completion: "RDMA READ",
                ..
            })
        ));
        let mut s = idle();
        assert_eq!(
            s.handle_write_done(),
            Err(RpingError::UnexpectedCompletion {
                completion: "RDMA WRITE",
                state: "awaiting the source advert",
            })
        );
        let mut s = idle();
        assert!(matches!(
            s.handle_send_done(),
            Err(RpingError::UnexpectedCompletion {
                completion: "SEND",
                ..
            })
        ));
        // WRITE completion while the READ is outstanding.
        let mut s = reading(1024, 64);
        assert_eq!(
            s.handle_write_done(),
            Err(RpingError::UnexpectedCompletion {
                completion: "RDMA WRITE",
                state: "reading the source buffer",
            })
        );
        // One SEND posted, two completions.
        let mut s = reading(1024, 64);
        s.handle_read_done().unwrap();
        let _ = s.poll_action();
        s.handle_send_done().unwrap();
        assert!(s.handle_send_done().is_err());
    }

    #[test]
    fn errors_are_terminal() {
        let mut s = reading(1024, 64);
        assert!(s.handle_recv(&info(START_ADDR, START_RKEY, 64)).is_err());
        assert!(!s.is_idle());
        assert_eq!(s.poll_action(), None);
        assert_eq!(
            s.handle_read_done(),
            Err(RpingError::UnexpectedCompletion {
                completion: "RDMA READ",
                state: "failed"
            })
        );
        assert_eq!(
            s.handle_recv(&info(START_ADDR, START_RKEY, 64)),
            Err(RpingError::UnexpectedMessage { state: "failed" })
        );
        assert!(s.handle_send_done().is_err());
        assert_eq!(s.iterations(), 0);
        // Display is readable and names the cause.
        assert!(RpingError::BadLength(3).to_string().contains("3 bytes"));
    }
}
