//! Ports, GIDs and path MTUs: what a QP brought up without rdma_cm needs to describe
//! itself and its peer (rdma_cm resolves all of this from IP addresses; the
//! out-of-band exchange carries LID, QPN, PSN and GID instead).

use std::fmt;
use std::net::Ipv6Addr;

use super::sys::*;

use super::device::Context;
use super::error::{check, Result, Verb};

/// A 128-bit global identifier, as the port's GID table holds it (network order). On
/// RoCE it is an IPv6 address; RoCE v2 over IPv4 uses the IPv4-mapped form
/// (`::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (the pingpong tools send it when run without `-g`).
    pub const ZERO: Gid = Gid([0; 16]);

    /// True for the all-zero GID.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The lower 64 bits (the tools test this to decide whether to use a GRH).
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.0[8..].try_into().expect("8 bytes"))
    }

    /// True for an IPv4-mapped GID (RoCE v2 over IPv4).
    pub fn is_ipv4_mapped(&self) -> bool {
        self.0[..10] == [0; 10] && self.0[10..12] == [0xff, 0xff]
    }

    /// The GID as an IPv6 address (how `ibv_devinfo` and the tools print it).
    pub fn to_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    pub(crate) fn raw(&self) -> ibv_gid {
        ibv_gid { raw: self.0 }
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_ipv6())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", self.to_ipv6())
    }
}

/// A path MTU (`enum ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[allow(missing_docs)]
pub enum Mtu {
    M256,
    M512,
    M1024,
    M2048,
    M4096,
}

impl Mtu {
    /// The MTU of `bytes` (256, 512, 1024, 2048 or 4096), as the tools' `-m` takes it.
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Some(match bytes {
            256 => Mtu::M256,
            512 => Mtu::M512,
            1024 => Mtu::M1024,
            2048 => Mtu::M2048,
            4096 => Mtu::M4096,
            _ => return None,
        })
    }

    /// Bytes.
    pub fn bytes(self) -> u32 {
        256 << (self.raw() - 1)
    }

    pub(crate) fn raw(self) -> ibv_mtu::Type {
        use ibv_mtu::*;
        match self {
            Mtu::M256 => IBV_MTU_256,
            Mtu::M512 => IBV_MTU_512,
            Mtu::M1024 => IBV_MTU_1024,
            Mtu::M2048 => IBV_MTU_2048,
            Mtu::M4096 => IBV_MTU_4096,
        }
    }

    fn from_raw(raw: ibv_mtu::Type) -> Option<Mtu> {
        use ibv_mtu::*;
        Some(match raw {
            IBV_MTU_256 => Mtu::M256,
            IBV_MTU_512 => Mtu::M512,
            IBV_MTU_1024 => Mtu::M1024,
            IBV_MTU_2048 => Mtu::M2048,
            IBV_MTU_4096 => Mtu::M4096,
            _ => return None,
        })
    }
}

/// What the link layer of a port is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: LIDs route, a GRH is optional.
    InfiniBand,
    /// Ethernet (RoCE, rxe): LIDs are 0, every path needs a GRH with GIDs.
    Ethernet,
    /// Anything else the provider reports.
    Other(u8),
}

/// The parts of `ibv_port_attr` a bring-up needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// True when the port is ACTIVE.
    pub active: bool,
    /// The active MTU (largest UD message; the upper bound for a path MTU).
    pub active_mtu: Mtu,
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// Entries in the GID table.
    pub gid_table_len: u32,
    /// InfiniBand or Ethernet.
    pub link_layer: LinkLayer,
}

impl Context {
    /// Queries port `port` (1-based, as the tools' `-i`).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        // SAFETY: ibv_port_attr is plain old data; all-zero is valid.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `attr` is a valid, full-sized out-pointer (the
        // inline wrapper passes its size to the provider).
        let ret = unsafe { ibv_query_port_full(self.as_ptr(), port, &mut attr) };
        check(Verb::QueryPort, ret)?;
        let link_layer = match attr.link_layer as u32 {
            IBV_LINK_LAYER_INFINIBAND | IBV_LINK_LAYER_UNSPECIFIED => LinkLayer::InfiniBand,
            IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            other => LinkLayer::Other(other as u8),
        };
        Ok(PortAttr {
            active: attr.state == ibv_port_state::IBV_PORT_ACTIVE,
            active_mtu: Mtu::from_raw(attr.active_mtu).unwrap_or(Mtu::M256),
            lid: attr.lid,
            gid_table_len: attr.gid_tbl_len.max(0) as u32,
            link_layer,
        })
    }

    /// Entry `index` of port `port`'s GID table (as the tools' `-g`).
    pub fn query_gid(&self, port: u8, index: u8) -> Result<Gid> {
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: the context is open and `gid` is a valid out-pointer.
        let ret = unsafe { ibv_query_gid(self.as_ptr(), port, index as i32, &mut gid) };
        check(Verb::QueryGid, ret)?;
        // SAFETY: every bit pattern of the union is a valid byte array.
        Ok(Gid(unsafe { gid.raw }))
    }

    /// The non-zero entries of port `port`'s GID table, by index.
    pub fn gids(&self, port: u8) -> Result<Vec<(u8, Gid)>> {
        let len = self.query_port(port)?.gid_table_len.min(256);
        let mut out = Vec::new();
        for index in 0..len {
            match self.query_gid(port, index as u8) {
                Ok(g) if !g.is_zero() => out.push((index as u8, g)),
                Ok(_) => {}
                // Unpopulated RoCE entries report EINVAL or ENODATA; the table has holes.
                Err(e) if e.errno().is_some() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

const IBV_LINK_LAYER_UNSPECIFIED: u32 = 0;
const IBV_LINK_LAYER_INFINIBAND: u32 = 1;
const IBV_LINK_LAYER_ETHERNET: u32 = 2;

/// Bytes a UD receive reserves in front of the payload for the Global Routing Header.
pub const GRH_LEN: usize = 40;

/// The 40 bytes in front of every UD receive, decoded. On RoCE v2 over IPv4 the provider
/// puts the IPv4 header in the last 20 of them (the first 20 are unspecified); over IPv6
/// and InfiniBand it is a real GRH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grh {
    /// Where the datagram came from.
    pub source: Gid,
    /// Where it was sent to.
    pub destination: Gid,
}

impl Grh {
    /// Decodes the first [`GRH_LEN`] bytes of a UD receive; `None` when there are fewer,
    /// or when neither an IPv4 header nor an IPv6 GRH is recognised.
    pub fn parse(bytes: &[u8]) -> Option<Grh> {
        let b = bytes.get(..GRH_LEN)?;
        let ipv4 = &b[20..40];
        if ipv4[0] >> 4 == 4 && ipv4[0] & 0x0f == 5 {
            let mapped = |a: &[u8]| {
                let mut g = [0u8; 16];
                g[10] = 0xff;
                g[11] = 0xff;
                g[12..].copy_from_slice(a);
                Gid(g)
            };
            return Some(Grh {
                source: mapped(&ipv4[12..16]),
                destination: mapped(&ipv4[16..20]),
            });
        }
        if b[0] >> 4 == 6 {
            return Some(Grh {
                source: Gid(b[8..24].try_into().expect("16 bytes")),
                destination: Gid(b[24..40].try_into().expect("16 bytes")),
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtus_round_trip() {
        for b in [256, 512, 1024, 2048, 4096] {
            let m = Mtu::from_bytes(b).unwrap();
            assert_eq!(m.bytes(), b);
            assert_eq!(Mtu::from_raw(m.raw()), Some(m));
        }
        assert_eq!(Mtu::from_bytes(1500), None);
    }

    #[test]
    fn gid_kinds() {
        let v4: Ipv6Addr = "::ffff:192.0.2.1".parse().unwrap();
        let g = Gid(v4.octets());
        assert!(g.is_ipv4_mapped());
        assert_eq!(g.to_string(), "::ffff:192.0.2.1");
        assert_ne!(g.interface_id(), 0);
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        assert!(!Gid(ll.octets()).is_ipv4_mapped());
        assert!(Gid::ZERO.is_zero());
        assert_eq!(Gid::ZERO.interface_id(), 0);
    }

    #[test]
    fn grh_of_roce_v2_ipv4() {
        let mut b = [0xeeu8; 40];
        b[20] = 0x45;
        b[32..36].copy_from_slice(&[192, 0, 2, 7]);
        b[36..40].copy_from_slice(&[192, 0, 2, 1]);
        let grh = Grh::parse(&b).unwrap();
        assert_eq!(grh.source.to_string(), "::ffff:192.0.2.7");
        assert_eq!(grh.destination.to_string(), "::ffff:192.0.2.1");
    }

    #[test]
    fn grh_of_ipv6() {
        let mut b = [0u8; 40];
        b[0] = 0x60;
        let s: Ipv6Addr = "fe80::2".parse().unwrap();
        let d: Ipv6Addr = "fe80::1".parse().unwrap();
        b[8..24].copy_from_slice(&s.octets());
        b[24..40].copy_from_slice(&d.octets());
        let grh = Grh::parse(&b).unwrap();
        assert_eq!(grh.source, Gid(s.octets()));
        assert_eq!(grh.destination, Gid(d.octets()));
        assert_eq!(Grh::parse(&b[..39]), None);
        assert_eq!(Grh::parse(&[0u8; 40]), None);
    }
}
