//! Ingest without RDMA: the immediate's layout, the checksum trailer, and a client and a
//! server ring joined by an in-memory "NIC" under random schedules.

use std::collections::VecDeque;

use super::ring::{ClientRing, ServerRing};
use super::*;
use rdmactor_testkit::rng::Rng;

#[test]
fn immediates_carry_slot_and_length() {
    for (slots, slot_len) in [
        (1, 8),
        (64, 4096),
        (4096, 4096),
        (1 << 19, 4096),
        (3, 1 << 20),
        (4095, (1 << 20) - 1),
        (1, u32::MAX),
    ] {
        let codec = ImmCodec::new(slots, slot_len).unwrap();
        for slot in [0, slots / 2, slots - 1] {
            for len in [8, slot_len / 2, slot_len] {
                assert_eq!(
                    codec.decode(codec.encode(slot, len)),
                    (slot, len),
                    "{slots} x {slot_len}: slot {slot} len {len}"
                );
            }
        }
    }
}

#[test]
fn rings_that_cannot_work_are_refused() {
    assert!(matches!(
        ImmCodec::new(0, 4096),
        Err(IngestError::BadRing(_))
    ));
    assert!(matches!(ImmCodec::new(4, 7), Err(IngestError::BadRing(_))));
    // 4096 needs 13 length bits, leaving 19 for the slot.
    assert!(ImmCodec::new(1 << 19, 4096).is_ok());
    assert!(matches!(
        ImmCodec::new((1 << 19) + 1, 4096),
        Err(IngestError::BadRing(_))
    ));
    assert!(matches!(
        ImmCodec::new(2, u32::MAX),
        Err(IngestError::BadRing(_))
    ));
}

#[test]
fn sealed_records_check_out_and_damaged_ones_do_not() {
    let sealed = seal(b"record");
    assert_eq!(sealed.len(), 6 + CHECKSUM_LEN);
    assert_eq!(unseal(&sealed), Some(&b"record"[..]));
    let mut bad = sealed.clone();
    bad[2] ^= 1;
    assert_eq!(unseal(&bad), None);
    assert_eq!(unseal(&sealed[..sealed.len() - 1]), None, "cut short");
    assert_eq!(unseal(&[1, 2, 3]), None, "no room for a checksum");
    assert_eq!(unseal(&seal(b"")), Some(&b""[..]));
}

#[test]
fn every_flipped_bit_changes_the_checksum() {
    let payload: Vec<u8> = (0..37u8).map(|i| i.wrapping_mul(29)).collect();
    let sum = checksum(&payload);
    for bit in 0..payload.len() * 8 {
        let mut p = payload.clone();
        p[bit / 8] ^= 1 << (bit % 8);
        assert_ne!(checksum(&p), sum, "bit {bit}");
    }
    // Length matters, even with trailing zeros.
    assert_ne!(checksum(&[0; 8]), checksum(&[0; 9]));
    assert_ne!(checksum(b""), checksum(&[0]));
}

#[test]
fn the_server_refuses_writes_outside_what_it_granted() {
    let mut server = ServerRing::new(2, 64, 1).unwrap();
    let codec = ImmCodec::new(2, 64).unwrap();
    let a = server.handle_write(codec.encode(0, 20)).unwrap();
    assert_eq!((a.slot, a.range), (0, 0..20));
    assert_eq!(
        server.handle_write(codec.encode(0, 20)),
        Err(IngestError::SlotNotGranted { slot: 0 }),
        "slot 0 is held until returned"
    );
    assert_eq!(
        server.handle_write(codec.encode(1, 4)),
        Err(IngestError::BadLength {
            len: 4,
            slot_len: 64
        })
    );
    assert!(matches!(
        server.handle_write(codec.encode(3, 20)),
        Err(IngestError::SlotOutOfRange { slot: 3, .. })
    ));
    assert_eq!(server.poll_credits(), None, "not processed yet");
    server.handle_processed(0);
    assert_eq!(server.poll_credits(), Some(vec![0]));
    let b = server.handle_write(codec.encode(0, 64)).unwrap();
    assert_eq!(b.range, 0..64);
    let c = server.handle_write(codec.encode(1, 9)).unwrap();
    assert_eq!(c.range, 64..73);
}

#[test]
fn the_client_refuses_bad_credits_and_oversized_records() {
    let mut client = ClientRing::new(2, 32).unwrap();
    assert_eq!(client.max_record(), 24);
    assert_eq!(
        client.take_slot(33),
        Err(IngestError::RecordTooLarge { len: 25, max: 24 })
    );
    let (slot, _) = client.take_slot(32).unwrap().unwrap();
    assert_eq!(
        client.handle_credits(&[1 - slot]),
        Err(IngestError::BadCredit { slot: 1 - slot }),
        "a slot the client holds"
    );
    assert_eq!(
        client.handle_credits(&[7]),
        Err(IngestError::BadCredit { slot: 7 })
    );
    client.take_slot(8).unwrap().unwrap();
    assert_eq!(client.take_slot(8), Ok(None), "both slots with the server");
    client.handle_credits(&[slot]).unwrap();
    assert_eq!(client.free_slots(), 1);
}

/// A client pushing `records` numbered records through a ring into a server, with the
/// NIC delivering writes and credit messages at random moments. The WRITE's bytes land
/// in the ring when the NIC delivers it, right before its immediate; an overrun would
/// damage a record the server has not processed yet, which the ring forbids.
fn run(seed: u64, cfg: IngestConfig, records: usize) -> usize {
    let mut rng = Rng(seed | 1);
    let mut server = ServerRing::new(cfg.slots, cfg.slot_len, cfg.credit_batch).unwrap();
    let mut client = ClientRing::new(cfg.slots, cfg.slot_len).unwrap();
    let mut memory = vec![0u8; server.ring_len()];
    let mut writes: VecDeque<(u32, u32, Vec<u8>)> = VecDeque::new(); // slot, imm, bytes
    let mut credits: VecDeque<Vec<u32>> = VecDeque::new();
    let mut pending = VecDeque::new(); // arrived, not processed
    let mut next = 0usize;
    let mut delivered = Vec::new();
    let mut waits = 0;
    while delivered.len() < records {
        match rng.below(4) {
            0 if next < records => {
                let payload = format!("record {next} {}", "x".repeat(next % 50)).into_bytes();
                let sealed = seal(&payload);
                match client.take_slot(sealed.len()).unwrap() {
                    Some((slot, imm)) => {
                        writes.push_back((slot, imm, sealed));
                        next += 1;
                    }
                    None => waits += 1,
                }
            }
            1 => {
                if let Some((slot, imm, bytes)) = writes.pop_front() {
                    let start = (slot * cfg.slot_len) as usize;
                    memory[start..start + bytes.len()].copy_from_slice(&bytes);
                    let arrival = server.handle_write(imm).expect("the client never overruns");
                    assert_eq!(arrival.slot, slot);
                    // The application processes it later; until then it must stay intact.
                    pending.push_back(arrival);
                }
            }
            2 => {
                if let Some(arrival) = pending.pop_front() {
                    let payload = unseal(&memory[arrival.range])
                        .expect("an intact record")
                        .to_vec();
                    delivered.push(payload);
                    server.handle_processed(arrival.slot);
                    if let Some(slots) = server.poll_credits() {
                        credits.push_back(slots);
                    }
                }
            }
            _ => {
                if let Some(slots) = credits.pop_front() {
                    client.handle_credits(&slots).unwrap();
                }
            }
        }
    }
    for (i, payload) in delivered.iter().enumerate() {
        let expected = format!("record {i} {}", "x".repeat(i % 50)).into_bytes();
        assert_eq!(payload, &expected, "seed {seed}: record {i}");
    }
    waits
}

#[test]
fn every_record_arrives_once_in_order_under_random_schedules() {
    let mut waits = 0;
    for seed in 1..=300 {
        for cfg in [
            IngestConfig {
                slots: 1,
                slot_len: 128,
                credit_batch: 1,
            },
            IngestConfig {
                slots: 4,
                slot_len: 128,
                credit_batch: 4,
            },
            IngestConfig {
                slots: 16,
                slot_len: 128,
                credit_batch: 5,
            },
        ] {
            waits += run(seed, cfg, 200);
        }
    }
    assert!(waits > 0, "the client never had to wait for a slot");
}

#[test]
fn requests_and_credits_round_trip() {
    for req in [IngestRequest::Open, IngestRequest::Flush] {
        let bytes = postcard::to_allocvec(&req).unwrap();
        assert_eq!(postcard::from_bytes::<IngestRequest>(&bytes).unwrap(), req);
    }
    let c = Credits {
        slots: vec![0, 5, 63],
    };
    let bytes = postcard::to_allocvec(&c).unwrap();
    assert_eq!(postcard::from_bytes::<Credits>(&bytes).unwrap(), c);
}
