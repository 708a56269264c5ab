//! The out-of-band exchange of rdma-core's `ibv_*_pingpong` tools, without I/O.
//!
//! Over a TCP connection each side describes its QP(s) as fixed-size text records:
//! `LLLL:QQQQQQ:PPPPPP:GGGG...` (LID, QP number and first PSN in hex, then the GID as 32
//! hex digits of its 16 bytes in order), NUL-terminated: 52 bytes each. The client writes
//! its records first; the server brings its QPs to RTS, answers with its own records,
//! and the client acknowledges with the 5 bytes `done\0` before the ping-pong starts over
//! the QPs (the TCP connection then closes). `ibv_rc_pingpong`, `ibv_uc_pingpong` and
//! `ibv_ud_pingpong` send one record; `ibv_srq_pingpong` always sends 256, of which the
//! first `-q` describe its QPs and the rest are all zero.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::net::IpAddr;

use crate::verbs::Gid;

/// Bytes of one record, the terminating NUL included.
pub const RECORD_LEN: usize = 52;
/// What the client sends once it has the server's records.
pub const DONE: [u8; 5] = *b"done\0";
/// Records `ibv_srq_pingpong` exchanges, whatever its `-q`.
pub const SRQ_RECORDS: usize = 256;

/// One side's description of one QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First packet sequence number (24 bits).
    pub psn: u32,
    /// GID (all zero when the tool runs without `-g`).
    pub gid: Gid,
}

/// Why a client's records were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// A record is not `LLLL:QQQQQQ:PPPPPP:<32 hex digits>` followed by NUL.
    #[error("record {index} is malformed ({why}): {text:?}")]
    Malformed {
        /// Which record (0-based).
        index: usize,
        /// What is wrong.
        why: &'static str,
        /// The record's text up to its NUL (lossy).
        text: String,
    },
    /// The connection ended before all records arrived.
    #[error("exchange truncated: {got} of {want} bytes before the connection closed")]
    Truncated {
        /// Bytes received.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
    /// The SRQ client described no QP, or QPs after an empty record.
    #[error("records describe {0}")]
    BadQpList(String),
    /// More QPs than one client may have.
    #[error("{got} QPs asked for, at most {max} per client")]
    TooManyQps {
        /// QPs described.
        got: usize,
        /// The limit.
        max: usize,
    },
    /// The acknowledgement after the server's records was not `done\0`.
    #[error("expected \"done\" after the exchange, got {0:?}")]
    NotDone(String),
    /// A record names a QP number no client QP can have.
    #[error("QPN {0:#x} is reserved (0 and 1 are the management QPs, 0xffffff multicast)")]
    ReservedQpn(u32),
    /// A record's GID is a multicast group, not a QP's address.
    #[error("GID {0} is a multicast GID")]
    MulticastGid(Gid),
    /// No GID and no LID: nothing to address the client's QP by (RoCE needs a GID).
    #[error("no GID in the record (run the client with -g and the index of its address)")]
    NoGid,
    /// A record's GID is not the address the client connected from. The server would
    /// send to whatever a record names (UD answers every message it gets), so a
    /// record may only name the client itself.
    #[error("GID {gid} is not the address this client connected from ({peer}): run it with -g and the GID index of that address")]
    ForeignGid {
        /// The record's GID.
        gid: Gid,
        /// The TCP peer's address.
        peer: IpAddr,
    },
}

/// Checks that a client's record names a QP of the client itself, at the address its
/// TCP connection came from: a RoCE GID that is that IP address (IPv4-mapped for IPv4),
/// not a multicast group, and a QP number that is not reserved. A zero GID is accepted
/// only with a LID (InfiniBand addressing, which no IP address can be checked against).
///
/// # Errors
///
/// The [`ExchangeError`] naming the first rule broken.
pub fn check_peer_record(dest: &Dest, peer: IpAddr) -> Result<(), ExchangeError> {
    if matches!(dest.qpn, 0 | 1 | 0xff_ffff) || dest.qpn > 0xff_ffff {
        return Err(ExchangeError::ReservedQpn(dest.qpn));
    }
    if dest.gid.0[0] == 0xff {
        return Err(ExchangeError::MulticastGid(dest.gid));
    }
    if dest.gid.is_zero() {
        return if dest.lid != 0 {
            Ok(())
        } else {
            Err(ExchangeError::NoGid)
        };
    }
    let ours = match peer {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    if dest.gid.to_ipv6() == ours {
        Ok(())
    } else {
        Err(ExchangeError::ForeignGid {
            gid: dest.gid,
            peer: peer.to_canonical(),
        })
    }
}

impl Dest {
    /// The record, as the tools write it.
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut gid = String::with_capacity(32);
        for b in self.gid.0 {
            gid.push_str(&format!("{b:02x}"));
        }
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{gid}",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff
        );
        let mut out = [0u8; RECORD_LEN];
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// Parses record number `index`: exactly the shape [`encode`](Self::encode) writes.
    pub fn decode(index: usize, record: &[u8; RECORD_LEN]) -> Result<Dest, ExchangeError> {
        let end = record.iter().position(|&b| b == 0).unwrap_or(RECORD_LEN);
        let text = &record[..end];
        let bad = |why| ExchangeError::Malformed {
            index,
            why,
            text: String::from_utf8_lossy(text).into_owned(),
        };
        if end == RECORD_LEN {
            return Err(bad("no terminating NUL"));
        }
        let parts: Vec<&[u8]> = text.split(|&b| b == b':').collect();
        let [lid, qpn, psn, gid] = parts.as_slice() else {
            return Err(bad("not four ':'-separated fields"));
        };
        let hex = |field: &[u8], width: usize, what| {
            if field.len() != width || !field.iter().all(u8::is_ascii_hexdigit) {
                return Err(bad(what));
            }
            let s = std::str::from_utf8(field).map_err(|_| bad(what))?;
            u64::from_str_radix(s, 16).map_err(|_| bad(what))
        };
        // Each field's digits were counted: the values fit their types.
        let lid = u16::try_from(hex(lid, 4, "LID is not 4 hex digits")?)
            .map_err(|_| bad("LID is not 4 hex digits"))?;
        let qpn = u32::try_from(hex(qpn, 6, "QPN is not 6 hex digits")?)
            .map_err(|_| bad("QPN is not 6 hex digits"))?;
        let psn = u32::try_from(hex(psn, 6, "PSN is not 6 hex digits")?)
            .map_err(|_| bad("PSN is not 6 hex digits"))?;
        if gid.len() != 32 {
            return Err(bad("GID is not 32 hex digits"));
        }
        let mut g = [0u8; 16];
        for (i, pair) in gid.chunks(2).enumerate() {
            g[i] = u8::try_from(hex(pair, 2, "GID is not 32 hex digits")?)
                .map_err(|_| bad("GID is not 32 hex digits"))?;
        }
        Ok(Dest {
            lid,
            qpn,
            psn,
            gid: Gid(g),
        })
    }
}

/// Decodes a client's records: `bytes` holds `count` records back to back.
pub fn decode_records(bytes: &[u8], count: usize) -> Result<Vec<Dest>, ExchangeError> {
    // A count no buffer could hold is short of bytes too.
    let want = count.saturating_mul(RECORD_LEN);
    if bytes.len() < want {
        return Err(ExchangeError::Truncated {
            got: bytes.len(),
            want,
        });
    }
    bytes
        .chunks_exact(RECORD_LEN)
        .take(count)
        .enumerate()
        .map(|(i, r)| Dest::decode(i, r.try_into().expect("a record")))
        .collect()
}

/// The QPs an `ibv_srq_pingpong` client described: the leading records with a QP number,
/// all later ones empty. At least one, at most `max`.
pub fn srq_qps(records: &[Dest], max: usize) -> Result<Vec<Dest>, ExchangeError> {
    let n = records.iter().take_while(|d| d.qpn != 0).count();
    if n == 0 {
        return Err(ExchangeError::BadQpList("no QP".into()));
    }
    if let Some(i) = records[n..].iter().position(|d| *d != Dest::default()) {
        return Err(ExchangeError::BadQpList(format!(
            "a QP at record {} after an empty record {n}",
            n.saturating_add(i)
        )));
    }
    if n > max {
        return Err(ExchangeError::TooManyQps { got: n, max });
    }
    Ok(records[..n].to_vec())
}

/// The server's answer: one record per QP, padded with empty records to `count`.
pub fn encode_records(dests: &[Dest], count: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(count.max(dests.len()).saturating_mul(RECORD_LEN));
    for d in dests {
        out.extend_from_slice(&d.encode());
    }
    for _ in dests.len()..count {
        out.extend_from_slice(&Dest::default().encode());
    }
    out
}

/// Checks the client's acknowledgement.
pub fn check_done(bytes: &[u8]) -> Result<(), ExchangeError> {
    if bytes == DONE {
        Ok(())
    } else {
        Err(ExchangeError::NotDone(
            String::from_utf8_lossy(bytes).into_owned(),
        ))
    }
}

// The tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn record(text: &str) -> [u8; RECORD_LEN] {
        let mut r = [0u8; RECORD_LEN];
        r[..text.len()].copy_from_slice(text.as_bytes());
        r
    }

    #[test]
    fn records_look_like_the_tools_records() {
        // As ibv_rc_pingpong -g 1 writes it on rxe (GID ::ffff:192.0.2.1).
        let text = "0000:000011:74e326:00000000000000000000ffffc0000201";
        let d = Dest::decode(0, &record(text)).unwrap();
        assert_eq!((d.lid, d.qpn, d.psn), (0, 0x11, 0x74e326));
        assert_eq!(d.gid.to_string(), "::ffff:192.0.2.1");
        assert_eq!(d.encode(), record(text));
        assert_eq!(text.len() + 1, RECORD_LEN);
    }

    #[test]
    fn malformed_records_say_what_is_wrong() {
        let cases = [
            ("0000:000011:74e326", "not four"),
            ("000:000011:74e326:00000000000000000000ffffc0000201", "LID"),
            ("0000:00001g:74e326:00000000000000000000ffffc0000201", "QPN"),
            ("0000:000011:74e3266:0000000000000000000ffffc0000201", "PSN"),
            ("0000:000011:74e326:00000000000000000000ffffc00002", "GID"),
            ("0000:000011:74e326:00000000000000000000ffffc00002zz", "GID"),
            ("hello world", "not four"),
        ];
        for (text, why) in cases {
            let err = Dest::decode(3, &record(text)).unwrap_err();
            assert!(err.to_string().contains(why), "{text}: {err}");
            assert!(err.to_string().contains("record 3"), "{err}");
        }
        let full = [b'a'; RECORD_LEN];
        assert!(Dest::decode(0, &full)
            .unwrap_err()
            .to_string()
            .contains("NUL"));
    }

    #[test]
    fn srq_records_name_the_leading_qps() {
        let qp = |n| Dest {
            qpn: n,
            psn: 1,
            ..Dest::default()
        };
        let mut recs = vec![Dest::default(); SRQ_RECORDS];
        recs[0] = qp(5);
        recs[1] = qp(6);
        let bytes = encode_records(&recs[..2], SRQ_RECORDS);
        assert_eq!(bytes.len(), SRQ_RECORDS * RECORD_LEN);
        let decoded = decode_records(&bytes, SRQ_RECORDS).unwrap();
        assert_eq!(srq_qps(&decoded, 255).unwrap(), vec![qp(5), qp(6)]);
        assert!(matches!(
            srq_qps(&decoded, 1),
            Err(ExchangeError::TooManyQps { got: 2, max: 1 })
        ));
        assert!(srq_qps(&[Dest::default(); 4], 255).is_err());
        let mut gap = decoded.clone();
        gap[9] = qp(9);
        assert!(srq_qps(&gap, 255)
            .unwrap_err()
            .to_string()
            .contains("after an empty record"));
    }

    #[test]
    fn truncation_and_done() {
        assert_eq!(
            decode_records(&[0u8; 60], 2),
            Err(ExchangeError::Truncated { got: 60, want: 104 })
        );
        assert!(check_done(b"done\0").is_ok());
        assert!(check_done(b"nope\0").is_err());
        assert!(check_done(b"done").is_err());
    }

    #[test]
    fn a_record_may_only_name_the_client_itself() {
        let peer: IpAddr = "192.0.2.1".parse().unwrap();
        let gid = |text: &str| Gid(text.parse::<std::net::Ipv6Addr>().unwrap().octets());
        let rec = |qpn, g| Dest {
            lid: 0,
            qpn,
            psn: 7,
            gid: g,
        };
        let own = gid("::ffff:192.0.2.1");
        assert_eq!(check_peer_record(&rec(0x77, own), peer), Ok(()));
        // A v4 client seen through a v6 socket as ::ffff:a.b.c.d is the same peer.
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert_eq!(check_peer_record(&rec(0x77, own), mapped), Ok(()));
        let third = gid("::ffff:192.0.2.77");
        let err = check_peer_record(&rec(0x77, third), peer).unwrap_err();
        assert!(
            err.to_string()
                .contains("is not the address this client connected from (192.0.2.1)"),
            "{err}"
        );
        // A link-local GID comes from a MAC, not from the address: refused too.
        assert!(matches!(
            check_peer_record(&rec(0x77, gid("fe80::1")), peer),
            Err(ExchangeError::ForeignGid { .. })
        ));
        assert_eq!(
            check_peer_record(&rec(0x77, gid("ff0e::1")), peer),
            Err(ExchangeError::MulticastGid(gid("ff0e::1")))
        );
        for qpn in [0, 1, 0xff_ffff, 0x100_0000] {
            assert_eq!(
                check_peer_record(&rec(qpn, own), peer),
                Err(ExchangeError::ReservedQpn(qpn))
            );
        }
        assert_eq!(
            check_peer_record(&rec(0x77, Gid::default()), peer),
            Err(ExchangeError::NoGid)
        );
        let ib = Dest {
            lid: 3,
            ..rec(0x77, Gid::default())
        };
        assert_eq!(check_peer_record(&ib, peer), Ok(()));
        let v6: IpAddr = "2001:db8::5".parse().unwrap();
        assert_eq!(
            check_peer_record(&rec(0x77, gid("2001:db8::5")), v6),
            Ok(())
        );
    }
}
