//! Every data-path operation between two rdma_cm-connected QPs, with verified bytes:
//! SEND/RECV, SEND_WITH_IMM, WRITE_WITH_IMM, RDMA WRITE and READ (1 B, 4 KiB, 1 MiB),
//! compare-and-swap and fetch-and-add.

use rdmactor::blocking::close_both;
use rdmactor::verbs::{Access, MemoryRegion, ProtectionDomain, RecvWr, SendOp, SendWr, WcOpcode};
use rdmactor_tests::{assert_released, connect_pair, pattern, rdma_context, resource_counts};

const SIZES: [usize; 3] = [1, 4096, 1 << 20];

#[test]
fn send_recv_and_immediates_deliver_verified_bytes() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    {
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let recv_slots = 4usize;
        let slot = 64 * 1024;
        let recv = MemoryRegion::register(&pd, recv_slots * slot, Access::LOCAL_WRITE).unwrap();
        let target = MemoryRegion::register(&pd, slot, Access::REMOTE_WRITE).unwrap();
        let pair = connect_pair(
            &pd,
            |qp| {
                let wrs: Vec<RecvWr> = (0..recv_slots)
                    .map(|i| RecvWr {
                        wr_id: i as u64,
                        local: Some(recv.sge(i * slot..(i + 1) * slot).unwrap()),
                    })
                    .collect();
                qp.post_recv(&wrs)
            },
            |_| Ok(()),
        );

        let mut src = MemoryRegion::register(&pd, slot, Access::NONE).unwrap();
        // 1) SEND of 1 B, 2) SEND of 64 KiB, 3) SEND_WITH_IMM, 4) WRITE_WITH_IMM.
        let big = pattern(slot, 7);
        src.as_mut_slice().copy_from_slice(&big);
        let ops = [
            (SendOp::Send, 1usize),
            (SendOp::Send, slot),
            (SendOp::SendWithImm(0xdead_beef), 4096),
            (SendOp::WriteWithImm(target.remote(), 0x1234_5678), 8192),
        ];
        for (i, (op, len)) in ops.iter().enumerate() {
            let wr = SendWr::new(100 + i as u64, *op, Some(src.sge(0..*len).unwrap()));
            pair.client.qp.post_send(&wr).unwrap();
            let sent = pair.client.wait(1).unwrap();
            assert_eq!(sent[0].wr_id, 100 + i as u64);

            let got = pair.server.wait(1).unwrap();
            let wc = got[0];
            assert_eq!(wc.wr_id, i as u64, "receives complete in posting order");
            match op {
                SendOp::WriteWithImm(_, imm) => {
                    assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
                    assert_eq!(wc.imm_data, Some(*imm));
                    assert_eq!(&target.as_slice()[..*len], &big[..*len]);
                }
                SendOp::SendWithImm(imm) => {
                    assert_eq!(wc.opcode, WcOpcode::Recv);
                    assert_eq!(wc.imm_data, Some(*imm));
                }
                _ => {
                    assert_eq!(wc.opcode, WcOpcode::Recv);
                    assert_eq!(wc.imm_data, None);
                }
            }
            if !matches!(op, SendOp::WriteWithImm(..)) {
                assert_eq!(wc.byte_len as usize, *len);
                let at = i * slot;
                assert_eq!(&recv.as_slice()[at..at + len], &big[..*len]);
            }
        }
        close_both(pair.client, pair.server).unwrap();
    }
    assert_released(&base);
}

#[test]
fn rdma_write_and_read_of_1b_4k_1m() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    {
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let window =
            MemoryRegion::register(&pd, 1 << 20, Access::REMOTE_WRITE | Access::REMOTE_READ)
                .unwrap();
        let pair = connect_pair(&pd, |_| Ok(()), |_| Ok(()));
        let mut src = MemoryRegion::register(&pd, 1 << 20, Access::NONE).unwrap();
        let back = MemoryRegion::register(&pd, 1 << 20, Access::LOCAL_WRITE).unwrap();
        for (i, &size) in SIZES.iter().enumerate() {
            let data = pattern(size, 11 + i as u64);
            src.as_mut_slice()[..size].copy_from_slice(&data);
            let remote = window.remote().slice(0, size as u64).unwrap();

            let write = SendWr::new(1, SendOp::Write(remote), Some(src.sge(0..size).unwrap()));
            pair.client.qp.post_send(&write).unwrap();
            let wc = pair.client.wait(1).unwrap()[0];
            assert_eq!(wc.opcode, WcOpcode::RdmaWrite);
            assert_eq!(
                &window.as_slice()[..size],
                &data[..],
                "WRITE of {size} B landed"
            );

            let read = SendWr::new(2, SendOp::Read(remote), Some(back.sge(0..size).unwrap()));
            pair.client.qp.post_send(&read).unwrap();
            let wc = pair.client.wait(1).unwrap()[0];
            assert_eq!(wc.opcode, WcOpcode::RdmaRead);
            assert_eq!(
                &back.as_slice()[..size],
                &data[..],
                "READ of {size} B returned"
            );
        }
        close_both(pair.server, pair.client).unwrap();
    }
    assert_released(&base);
}

#[test]
fn atomics_return_old_values_and_update_remote_word() {
    let Some(ctx) = rdma_context() else { return };
    if !ctx.query().unwrap().atomics {
        panic!("device {} reports no atomic support", ctx.name());
    }
    let base = resource_counts();
    {
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let mut word = MemoryRegion::register(&pd, 8, Access::REMOTE_ATOMIC).unwrap();
        word.as_mut_slice().copy_from_slice(&5u64.to_ne_bytes());
        let pair = connect_pair(&pd, |_| Ok(()), |_| Ok(()));
        let result = MemoryRegion::register(&pd, 8, Access::LOCAL_WRITE).unwrap();
        let remote = word.remote();
        let old = |mr: &MemoryRegion| u64::from_ne_bytes(mr.as_slice().try_into().unwrap());
        let now = |mr: &MemoryRegion| u64::from_ne_bytes(mr.as_slice().try_into().unwrap());

        // Compare-and-swap that matches: 5 -> 9.
        let cas = SendOp::CompareSwap {
            remote,
            compare: 5,
            swap: 9,
        };
        pair.client
            .qp
            .post_send(&SendWr::new(1, cas, Some(result.sge_all())))
            .unwrap();
        assert_eq!(
            pair.client.wait(1).unwrap()[0].opcode,
            WcOpcode::CompareSwap
        );
        assert_eq!(old(&result), 5);
        assert_eq!(now(&word), 9);

        // Compare-and-swap that does not match leaves 9 and returns it.
        let cas = SendOp::CompareSwap {
            remote,
            compare: 5,
            swap: 77,
        };
        pair.client
            .qp
            .post_send(&SendWr::new(2, cas, Some(result.sge_all())))
            .unwrap();
        pair.client.wait(1).unwrap();
        assert_eq!(old(&result), 9);
        assert_eq!(now(&word), 9);

        // Fetch-and-add: 9 + 3 = 12.
        let faa = SendOp::FetchAdd { remote, add: 3 };
        pair.client
            .qp
            .post_send(&SendWr::new(3, faa, Some(result.sge_all())))
            .unwrap();
        assert_eq!(pair.client.wait(1).unwrap()[0].opcode, WcOpcode::FetchAdd);
        assert_eq!(old(&result), 9);
        assert_eq!(now(&word), 12);

        close_both(pair.client, pair.server).unwrap();
    }
    assert_released(&base);
}
