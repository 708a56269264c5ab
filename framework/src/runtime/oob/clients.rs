//! The clients an out-of-band port holds, each with its address: what `max_clients`,
//! `max_clients_per_peer` and `max_qps_per_peer` are checked against. Plain bookkeeping
//! with no I/O, kept apart from the listener actor so that every limit is tested
//! natively.
//!
//! A client counts from its TCP accept until its exchange is over and its last QP has
//! been released, whichever comes last: a client whose QPs are up but who has not said
//! `done` is counted once, not once as exchanging and once as open.

use std::collections::HashMap;
use std::net::IpAddr;

use super::OobOptions;

/// A client's number; its connections carry it in the port's `ConnSet`.
pub(super) type ClientId = u64;

/// The limits of one port, from its [`OobOptions`] (0 in a per-peer one: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limits {
    pub max_clients: usize,
    pub max_clients_per_peer: usize,
    pub max_qps_per_peer: usize,
}

impl From<&OobOptions> for Limits {
    fn from(o: &OobOptions) -> Limits {
        Limits {
            max_clients: o.max_clients,
            max_clients_per_peer: o.max_clients_per_peer,
            max_qps_per_peer: o.max_qps_per_peer,
        }
    }
}

/// Every client the port holds, and what each address holds in all.
#[derive(Debug)]
pub(super) struct Clients {
    limits: Limits,
    by_id: HashMap<ClientId, Client>,
    by_peer: HashMap<IpAddr, Load>,
    next: ClientId,
}

#[derive(Debug)]
struct Client {
    ip: IpAddr,
    /// Its exchange is under way (records not yet read, or `done` not yet said).
    exchanging: bool,
    /// Its QPs open now.
    qps: usize,
}

/// What one address holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Load {
    pub clients: usize,
    pub qps: usize,
}

impl Clients {
    pub fn new(limits: Limits) -> Clients {
        Clients {
            limits,
            by_id: HashMap::new(),
            by_peer: HashMap::new(),
            next: 1,
        }
    }

    /// A client accepted from `ip`, counted from now (its exchange under way); or, when
    /// the port or the address is at its limit, the reason to refuse it.
    pub fn admit(&mut self, ip: IpAddr) -> Result<ClientId, String> {
        let Limits {
            max_clients,
            max_clients_per_peer,
            ..
        } = self.limits;
        if self.by_id.len() >= max_clients {
            return Err(format!("client limit of {max_clients} reached"));
        }
        let open = self.of_peer(ip).clients;
        if max_clients_per_peer > 0 && open >= max_clients_per_peer {
            return Err(format!(
                "per-peer client limit of {max_clients_per_peer} reached ({ip} has {open} open)"
            ));
        }
        let id = self.next;
        self.next += 1;
        self.by_id.insert(
            id,
            Client {
                ip,
                exchanging: true,
                qps: 0,
            },
        );
        self.by_peer.entry(ip).or_default().clients += 1;
        Ok(id)
    }

    /// Whether client `id` may open `n` more QPs under its address's limit (checked, not
    /// taken: [`opened`](Self::opened) counts them once they are up). `n` comes from the
    /// peer's records, so the sum is checked.
    pub fn check_qps(&self, id: ClientId, n: usize) -> Result<(), String> {
        let max = self.limits.max_qps_per_peer;
        let Some(client) = self.by_id.get(&id) else {
            return Err("client no longer counted".into());
        };
        if max == 0 {
            return Ok(());
        }
        let held = self.of_peer(client.ip).qps;
        match held.checked_add(n) {
            Some(after) if after <= max => Ok(()),
            _ => Err(format!(
                "{n} QPs asked for: per-peer QP limit of {max} reached ({} holds {held})",
                client.ip
            )),
        }
    }

    /// Client `id`'s `n` QPs are up.
    pub fn opened(&mut self, id: ClientId, n: usize) {
        if let Some(client) = self.by_id.get_mut(&id) {
            client.qps = client.qps.saturating_add(n);
            let load = self.by_peer.entry(client.ip).or_default();
            load.qps = load.qps.saturating_add(n);
        }
    }

    /// Client `id`'s exchange ended (`done` said, or refused): it stays counted while
    /// QPs of its are open.
    pub fn exchange_over(&mut self, id: ClientId) {
        if let Some(client) = self.by_id.get_mut(&id) {
            client.exchanging = false;
        }
        self.forget_if_gone(id);
    }

    /// One of client `id`'s QPs was released.
    pub fn closed(&mut self, id: ClientId) {
        if let Some(client) = self.by_id.get_mut(&id) {
            if client.qps > 0 {
                client.qps -= 1;
                if let Some(load) = self.by_peer.get_mut(&client.ip) {
                    load.qps = load.qps.saturating_sub(1);
                }
            }
        }
        self.forget_if_gone(id);
    }

    /// Clients counted now (under `max_clients`).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// What `ip` holds now.
    pub fn of_peer(&self, ip: IpAddr) -> Load {
        self.by_peer.get(&ip).copied().unwrap_or_default()
    }

    fn forget_if_gone(&mut self, id: ClientId) {
        let gone = self
            .by_id
            .get(&id)
            .is_some_and(|c| !c.exchanging && c.qps == 0);
        if !gone {
            return;
        }
        let Some(client) = self.by_id.remove(&id) else {
            return;
        };
        if let Some(load) = self.by_peer.get_mut(&client.ip) {
            load.clients = load.clients.saturating_sub(1);
            if load.clients == 0 {
                self.by_peer.remove(&client.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn defaults() -> Clients {
        Clients::new(Limits::from(&OobOptions::default()))
    }

    /// A client from `ip` whose exchange is over with `qps` QPs up.
    fn connected(c: &mut Clients, from: IpAddr, qps: usize) -> ClientId {
        let id = c.admit(from).unwrap();
        c.check_qps(id, qps).unwrap();
        c.opened(id, qps);
        c.exchange_over(id);
        id
    }

    #[test]
    fn the_defaults_are_64_clients_and_64_qps_per_address_and_16_qps_per_client() {
        let o = OobOptions::default();
        assert_eq!(
            (
                o.max_clients_per_peer,
                o.max_qps_per_peer,
                o.max_qps_per_client
            ),
            (64, 64, 16)
        );
    }

    #[test]
    fn one_address_is_refused_past_its_client_limit_and_another_gets_in() {
        let mut c = defaults();
        let mut ids = Vec::new();
        for _ in 0..64 {
            ids.push(connected(&mut c, ip(1), 1));
        }
        assert_eq!(
            c.admit(ip(1)).unwrap_err(),
            "per-peer client limit of 64 reached (10.0.0.1 has 64 open)"
        );
        assert!(c.admit(ip(2)).is_ok(), "another address gets in");
        // One client's QP released: its place comes back.
        c.closed(ids[0]);
        assert_eq!(
            c.of_peer(ip(1)),
            Load {
                clients: 63,
                qps: 63
            }
        );
        assert!(c.admit(ip(1)).is_ok());
    }

    #[test]
    fn a_client_counts_from_accept_until_its_exchange_is_over_and_its_last_qp_closed() {
        let mut c = Clients::new(Limits {
            max_clients: 10,
            max_clients_per_peer: 1,
            max_qps_per_peer: 0,
        });
        // Exchanging, nothing open yet.
        let id = c.admit(ip(1)).unwrap();
        assert!(c.admit(ip(1)).is_err(), "counted while exchanging");
        // Its QPs up, "done" not said yet: counted once.
        c.opened(id, 2);
        assert_eq!(c.len(), 1);
        assert_eq!(c.of_peer(ip(1)), Load { clients: 1, qps: 2 });
        c.closed(id);
        c.closed(id);
        assert!(c.admit(ip(1)).is_err(), "still exchanging");
        c.exchange_over(id);
        assert_eq!((c.len(), c.of_peer(ip(1))), (0, Load::default()));
        // Refused during the exchange (no QP ever up): released at once.
        let id = c.admit(ip(1)).unwrap();
        c.exchange_over(id);
        assert_eq!(c.len(), 0);
        // "done" said first, QPs closed later.
        let id = connected(&mut c, ip(1), 1);
        assert!(c.admit(ip(1)).is_err(), "its QP still open");
        c.closed(id);
        assert!(c.by_peer.is_empty() && c.by_id.is_empty());
        // Stray reports of a client no longer counted change nothing.
        c.closed(id);
        c.exchange_over(id);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn the_ports_client_limit_counts_every_address() {
        let mut c = Clients::new(Limits {
            max_clients: 2,
            max_clients_per_peer: 0,
            max_qps_per_peer: 0,
        });
        c.admit(ip(1)).unwrap();
        c.admit(ip(2)).unwrap();
        assert_eq!(c.admit(ip(3)).unwrap_err(), "client limit of 2 reached");
    }

    /// Five clients of one address asking for 16 QPs each (the most one client may ask
    /// for by default): four fit under the address's 64, the fifth is refused whole,
    /// and another address still gets its own.
    #[test]
    fn the_qps_of_one_address_are_capped_and_a_client_past_it_refused_whole() {
        let mut c = defaults();
        for _ in 0..4 {
            connected(&mut c, ip(1), 16);
        }
        let fifth = c.admit(ip(1)).unwrap();
        assert_eq!(
            c.check_qps(fifth, 16).unwrap_err(),
            "16 QPs asked for: per-peer QP limit of 64 reached (10.0.0.1 holds 64)"
        );
        c.exchange_over(fifth);
        assert_eq!(
            c.of_peer(ip(1)),
            Load {
                clients: 4,
                qps: 64
            }
        );
        connected(&mut c, ip(2), 16);
        // A count from the peer that would overflow is refused, not wrapped.
        let other = c.admit(ip(2)).unwrap();
        assert!(c.check_qps(other, usize::MAX).is_err());
        // 0 lifts the limit.
        let mut c = Clients::new(Limits {
            max_clients: 10,
            max_clients_per_peer: 0,
            max_qps_per_peer: 0,
        });
        let id = connected(&mut c, ip(1), 1000);
        assert!(c.check_qps(id, usize::MAX).is_ok());
    }
}
