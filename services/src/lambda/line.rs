//! Who runs next when the lambda service is full: the jobs waiting for a job slot and
//! for room under the service's input bytes, served in turn by tenant.
//!
//! A tenant is who the client is: its proved identity, else its address. Turns go round
//! the tenants, not the connections, so a client that opens 512 connections and keeps
//! 4 invocations in flight on each gets one turn in each round, as does a polite client
//! with one connection beside it (the per-flow fairness of a fair queue, with the
//! tenant as the flow). A job waits at most the line's `wait`, then is refused `Busy`;
//! when the line is full, the tenant with the most jobs waiting gives up its newest, so
//! a full line never locks a new tenant out.
//!
//! Plain state: no clock of its own and no I/O; [`Budget`](super::owner) drives it.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::sandbox::ClientId;

/// Whose turn a waiting job takes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Tenant {
    /// A key's identity (an authenticated-only service).
    Identity(String),
    /// An anonymous client's address: everyone on one host shares its turns.
    Address(IpAddr),
    /// A connection with neither (a test's, or one brought up out of band).
    Connection(ClientId),
}

/// A job waiting for its turn.
#[derive(Debug)]
pub(crate) struct Waiting<W> {
    /// How its owner answers it.
    pub ticket: u64,
    /// Its connection (dropped from the line when that connection closes).
    pub client: ClientId,
    /// What it will start.
    pub want: W,
    /// Bytes of input it will hold while it runs.
    pub input: usize,
}

/// A waiting job and when its wait ends.
#[derive(Debug)]
struct Parked<W> {
    job: Waiting<W>,
    deadline: Instant,
}

/// The line: each tenant's jobs first in, first out, and the tenants in turn.
#[derive(Debug)]
pub(crate) struct JobLine<W> {
    queues: HashMap<Tenant, VecDeque<Parked<W>>>,
    /// Tenants with a job waiting, the next to be served first.
    turns: VecDeque<Tenant>,
    len: usize,
    capacity: usize,
    wait: Duration,
}

impl<W> JobLine<W> {
    /// A line of at most `capacity` jobs, each waiting at most `wait`.
    pub(crate) fn new(capacity: usize, wait: Duration) -> JobLine<W> {
        JobLine {
            queues: HashMap::new(),
            turns: VecDeque::new(),
            len: 0,
            capacity,
            wait,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Puts `job` in `tenant`'s queue until `now + wait`. When the line is full, the
    /// tenant with the most jobs waiting gives up its newest (returned, to be refused),
    /// unless that is `tenant` itself (or one with no more than it): then `job` comes
    /// back as the error.
    pub(crate) fn park(
        &mut self,
        tenant: Tenant,
        job: Waiting<W>,
        now: Instant,
    ) -> Result<Option<Waiting<W>>, Waiting<W>> {
        if self.capacity == 0 {
            return Err(job);
        }
        let mut bumped = None;
        if self.len >= self.capacity {
            let mine = self.queues.get(&tenant).map_or(0, VecDeque::len);
            let longest = self
                .queues
                .iter()
                .max_by_key(|(_, q)| q.len())
                .map(|(t, q)| (t.clone(), q.len()));
            match longest {
                Some((t, n)) if n > mine.saturating_add(1) => {
                    bumped = self.remove_newest(&t);
                }
                _ => return Err(job),
            }
        }
        let queue = self.queues.entry(tenant.clone()).or_default();
        if queue.is_empty() {
            self.turns.push_back(tenant);
        }
        queue.push_back(Parked {
            job,
            deadline: now + self.wait,
        });
        self.len = self.len.saturating_add(1);
        Ok(bumped)
    }

    fn remove_newest(&mut self, tenant: &Tenant) -> Option<Waiting<W>> {
        let queue = self.queues.get_mut(tenant)?;
        let job = queue.pop_back().map(|p| p.job);
        if queue.is_empty() {
            self.queues.remove(tenant);
            self.turns.retain(|t| t != tenant);
        }
        if job.is_some() {
            self.len = self.len.saturating_sub(1);
        }
        job
    }

    /// The next job in turn that `fits` (room for its input, say). A tenant whose first
    /// job does not fit keeps it first and its place in the round, and the next tenant
    /// is asked: a small job is not held up behind a large one of someone else.
    pub(crate) fn next(&mut self, fits: impl Fn(&Waiting<W>) -> bool) -> Option<Waiting<W>> {
        for i in 0..self.turns.len() {
            let tenant = self.turns.get(i)?.clone();
            let queue = self.queues.get_mut(&tenant)?;
            if !queue.front().is_some_and(|p| fits(&p.job)) {
                continue;
            }
            let job = queue.pop_front().map(|p| p.job);
            self.turns.remove(i);
            if queue.is_empty() {
                self.queues.remove(&tenant);
            } else {
                // Served: to the back of the round.
                self.turns.push_back(tenant);
            }
            self.len = self.len.saturating_sub(1);
            return job;
        }
        None
    }

    /// Takes out every job whose wait ended by `now`: the fronts of the tenants' queues
    /// (a queue's deadlines come in order, every job waiting the same `wait`), so a
    /// full line costs the tenants, not the jobs, at every expiry.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<Waiting<W>> {
        let mut out = Vec::new();
        for queue in self.queues.values_mut() {
            while queue.front().is_some_and(|p| p.deadline <= now) {
                out.extend(queue.pop_front().map(|p| p.job));
            }
        }
        self.forget_empty(out.len());
        out
    }

    /// Takes out `client`'s jobs (its connection closed).
    pub(crate) fn leave(&mut self, client: ClientId) -> Vec<Waiting<W>> {
        self.take_where(|p| p.job.client == client)
    }

    /// When the first wait ends (each queue's first is its earliest: see `expire`).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.queues
            .values()
            .filter_map(|q| q.front().map(|p| p.deadline))
            .min()
    }

    fn take_where(&mut self, gone: impl Fn(&Parked<W>) -> bool) -> Vec<Waiting<W>> {
        let mut out = Vec::new();
        for queue in self.queues.values_mut() {
            let (left, kept): (VecDeque<_>, VecDeque<_>) =
                std::mem::take(queue).into_iter().partition(&gone);
            *queue = kept;
            out.extend(left.into_iter().map(|p| p.job));
        }
        self.forget_empty(out.len());
        out
    }

    /// After `taken` jobs left the queues: drops the tenants left with none.
    fn forget_empty(&mut self, taken: usize) {
        if taken == 0 {
            return;
        }
        self.queues.retain(|_, q| !q.is_empty());
        let queues = &self.queues;
        self.turns.retain(|t| queues.contains_key(t));
        self.len = self.len.saturating_sub(taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(ticket: u64, client: u64, input: usize) -> Waiting<()> {
        Waiting {
            ticket,
            client: ClientId(client),
            want: (),
            input,
        }
    }

    fn host(n: u8) -> Tenant {
        Tenant::Address(IpAddr::from([10, 0, 0, n]))
    }

    fn tickets(line: &mut JobLine<()>) -> Vec<u64> {
        std::iter::from_fn(|| line.next(|_| true).map(|j| j.ticket)).collect()
    }

    #[test]
    fn turns_go_round_the_tenants_not_the_connections() {
        let now = Instant::now();
        let mut line = JobLine::new(100, Duration::from_secs(1));
        // One host with many connections and jobs, then a polite one with a single job.
        for t in 0..8 {
            line.park(host(1), job(t, t % 4, 1), now).unwrap();
        }
        line.park(host(2), job(100, 50, 1), now).unwrap();
        assert_eq!(line.len(), 9);
        // The polite job is second, not ninth; the host's own jobs keep their order.
        assert_eq!(tickets(&mut line), [0, 100, 1, 2, 3, 4, 5, 6, 7]);
        assert!(line.is_empty());
    }

    #[test]
    fn a_job_that_does_not_fit_keeps_its_place_and_lets_others_pass() {
        let now = Instant::now();
        let mut line = JobLine::new(10, Duration::from_secs(1));
        line.park(host(1), job(1, 1, 16 << 20), now).unwrap();
        line.park(host(2), job(2, 2, 4096), now).unwrap();
        let small = line.next(|j| j.input <= 1 << 20).expect("the small one");
        assert_eq!(small.ticket, 2);
        assert!(line.next(|j| j.input <= 1 << 20).is_none());
        assert_eq!(line.next(|_| true).expect("then the large").ticket, 1);
    }

    #[test]
    fn a_full_line_takes_from_the_longest_queue_never_from_a_new_tenant() {
        let now = Instant::now();
        let mut line = JobLine::new(4, Duration::from_secs(1));
        for t in 0..4 {
            assert!(line.park(host(1), job(t, 1, 1), now).unwrap().is_none());
        }
        // Full of host 1's: host 1 is refused more, host 2 bumps host 1's newest.
        assert_eq!(line.park(host(1), job(9, 1, 1), now).unwrap_err().ticket, 9);
        let bumped = line.park(host(2), job(20, 2, 1), now).unwrap();
        assert_eq!(bumped.map(|j| j.ticket), Some(3));
        assert_eq!(line.len(), 4);
        assert_eq!(tickets(&mut line), [0, 20, 1, 2]);
    }

    #[test]
    fn waits_end_and_closed_connections_leave() {
        let now = Instant::now();
        let mut line = JobLine::new(10, Duration::from_secs(2));
        line.park(host(1), job(1, 1, 1), now).unwrap();
        line.park(host(1), job(2, 2, 1), now + Duration::from_secs(1))
            .unwrap();
        line.park(host(2), job(3, 3, 1), now + Duration::from_secs(1))
            .unwrap();
        assert_eq!(line.next_deadline(), Some(now + Duration::from_secs(2)));
        let gone = line.expire(now + Duration::from_secs(2));
        assert_eq!(gone.iter().map(|j| j.ticket).collect::<Vec<_>>(), [1]);
        let left = line.leave(ClientId(3));
        assert_eq!(left.iter().map(|j| j.ticket).collect::<Vec<_>>(), [3]);
        assert_eq!(line.len(), 1);
        assert_eq!(tickets(&mut line), [2]);
        assert_eq!(line.next_deadline(), None);
    }
}
