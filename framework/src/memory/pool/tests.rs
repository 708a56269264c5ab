use super::*;
use crate::memory::line::{Ask, Line, RoomWaker};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Plain heap chunks, counting arenas grown and chunks dropped, so the bookkeeping is
/// tested without RDMA.
#[derive(Default)]
struct Heap {
    arenas: AtomicUsize,
}

impl ChunkSource for Heap {
    type Chunk = Vec<u8>;
    fn grow(&self, size: usize, count: usize) -> Result<Vec<Vec<u8>>, PoolError> {
        self.arenas.fetch_add(1, Ordering::Relaxed);
        Ok((0..count).map(|_| vec![0; size]).collect())
    }
}

/// Classes of 64, 256 and 1024 B in arenas of 1 KiB; nothing reserved, every idle
/// arena kept (the behaviour of a pool that never shrinks).
fn pool(max: usize) -> Pool<Heap> {
    Pool::new(
        Heap::default(),
        PoolConfig {
            classes: vec![1024, 64, 256],
            arena_bytes: 1024,
            max_bytes: max,
            reserved_smallest: 0,
            keep_bytes: usize::MAX / 2,
            heap_bytes: 4 << 10,
        },
    )
}

/// The same classes under a cap of 16 KiB, 2 KiB of it reserved for the smallest
/// class, idle arenas returned down to `keep` bytes.
fn shrinking(keep: usize) -> Pool<Heap> {
    Pool::new(
        Heap::default(),
        PoolConfig {
            classes: vec![64, 256, 1024],
            arena_bytes: 1024,
            max_bytes: 16 << 10,
            reserved_smallest: 2 << 10,
            keep_bytes: keep,
            heap_bytes: 4 << 10,
        },
    )
}

#[test]
fn smallest_fitting_class_is_used() {
    let p = pool(1 << 20);
    assert_eq!(p.lease(1).unwrap().len(), 64);
    assert_eq!(p.lease(65).unwrap().len(), 256);
    assert_eq!(p.lease(1024).unwrap().len(), 1024);
    assert!(matches!(
        p.lease(1025),
        Err(PoolError::TooLarge {
            len: 1025,
            largest: 1024
        })
    ));
}

#[test]
fn leases_return_on_drop_and_are_reused() {
    let p = pool(1 << 20);
    let a = p.lease(64).unwrap();
    let b = p.lease(64).unwrap();
    assert_eq!(p.stats().leased, vec![2, 0, 0]);
    drop((a, b));
    assert_eq!(p.stats().leased, vec![0, 0, 0]);
    let held: Vec<_> = (0..16).map(|_| p.lease(64).unwrap()).collect();
    assert_eq!(
        p.shared.source.arenas.load(Ordering::Relaxed),
        1,
        "one arena of 16"
    );
    drop(held);
    assert_eq!(p.stats().registered_bytes, 1024);
}

#[test]
fn exhaustion_is_an_error_not_a_panic() {
    let p = pool(2048);
    let held: Vec<_> = (0..2).map(|_| p.lease(1024).unwrap()).collect();
    let err = p.lease(1000).unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::Exhausted {
                class: 1024,
                limit: 2048
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("exhausted"));
    drop(held);
    assert!(p.lease(1000).is_ok(), "freed chunks serve again");
}

#[test]
fn leases_move_across_threads() {
    let p = pool(1 << 20);
    let leases: Vec<_> = (0..8).map(|_| p.lease(200).unwrap()).collect();
    std::thread::spawn(move || drop(leases)).join().unwrap();
    assert_eq!(p.stats().leased, vec![0, 0, 0]);
}

/// Issue 16, item 4, scaled down: a burst of largest-class leases takes all the cap
/// it may, yet the smallest class (receive buffers) still leases from its
/// reservation; once the burst is over its arenas go back and the whole cap serves
/// the smallest class.
#[test]
fn a_burst_of_large_leases_never_starves_the_smallest_class() {
    let p = shrinking(0);
    let mut burst = Vec::new();
    while let Ok(l) = p.lease(1024) {
        burst.push(l);
    }
    assert_eq!(burst.len(), 14, "the cap less the 2 KiB reservation");
    assert!(matches!(
        p.lease(1024),
        Err(PoolError::Exhausted {
            class: 1024,
            limit: 14336
        })
    ));
    let recv: Vec<_> = (0..32).map(|_| p.lease(64).unwrap()).collect();
    assert_eq!(p.stats().registered_bytes, 16 << 10);
    drop(burst);
    let stats = p.stats();
    assert_eq!(
        stats.arenas,
        vec![2, 0, 0],
        "idle arenas returned: {stats:?}"
    );
    assert_eq!(stats.registered_bytes, 2048);
    let more: Vec<_> = (0..16 * 16 - 32).map(|_| p.lease(64).unwrap()).collect();
    assert_eq!(p.stats().registered_bytes, 16 << 10, "the whole cap");
    drop((recv, more));
    assert_eq!(p.stats().registered_bytes, 0);
    assert_eq!(p.stats().peak_bytes, 16 << 10);
}

#[test]
fn idle_arenas_are_kept_up_to_the_floor() {
    let p = shrinking(3 << 10);
    let held: Vec<_> = (0..6).map(|_| p.lease(1024).unwrap()).collect();
    drop(held);
    assert_eq!(p.stats().registered_bytes, 3 << 10, "kept for reuse");
    let grown = p.shared.source.arenas.load(Ordering::Relaxed);
    let again: Vec<_> = (0..3).map(|_| p.lease(1024).unwrap()).collect();
    assert_eq!(
        p.shared.source.arenas.load(Ordering::Relaxed),
        grown,
        "kept arenas serve without registering"
    );
    drop(again);
}

/// Arenas kept under the floor are still reclaimed when another class needs the room.
#[test]
fn kept_arenas_are_reclaimed_under_pressure() {
    let p = shrinking(usize::MAX / 2);
    drop((0..14).map(|_| p.lease(1024).unwrap()).collect::<Vec<_>>());
    assert_eq!(p.stats().registered_bytes, 14 << 10, "all kept");
    let small: Vec<_> = (0..16 * 16).map(|_| p.lease(64).unwrap()).collect();
    assert_eq!(p.stats().arenas, vec![16, 0, 0]);
    drop(small);
}

#[test]
fn a_class_that_cannot_grow_borrows_a_larger_free_chunk() {
    let p = Pool::new(
        Heap::default(),
        PoolConfig {
            classes: vec![64, 256, 1024],
            arena_bytes: 2048,
            max_bytes: 16 << 10,
            reserved_smallest: 2 << 10,
            keep_bytes: usize::MAX / 2,
            heap_bytes: 4 << 10,
        },
    );
    let mut big: Vec<_> = (0..14).map(|_| p.lease(1024).unwrap()).collect();
    // One 1 KiB chunk free in an arena still in use; the bulk limit is reached.
    big.pop();
    let mid = p.lease(256).unwrap();
    assert_eq!(mid.len(), 1024, "borrowed from the larger class");
    assert_eq!(p.stats().leased, vec![0, 0, 14]);
    assert!(p.lease(256).is_err(), "nothing left to borrow");
    drop(mid);
    assert_eq!(
        p.stats().leased,
        vec![0, 0, 13],
        "returned to its own class"
    );
    drop(big);
}

#[test]
fn charges_count_against_the_bulk_limit() {
    let p = shrinking(usize::MAX / 2);
    drop(p.lease(1024).unwrap());
    let c = p.charge(14 << 10).unwrap();
    assert_eq!(c.len(), 14 << 10);
    let err = p.charge(1).unwrap_err();
    assert!(matches!(err, PoolError::ChargeRefused { .. }), "{err}");
    assert_eq!(
        p.stats().registered_bytes,
        0,
        "the idle 1 KiB arena was reclaimed for the first charge"
    );
    assert!(p.lease(64).is_ok(), "the reservation still serves");
    drop(c);
    assert_eq!(p.stats().charged_bytes, 0);
    assert!(p.charge(14 << 10).is_ok());
}

/// A waker counting its calls.
fn counter() -> (Arc<AtomicUsize>, RoomWaker) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    (
        calls,
        Arc::new(move || {
            c.fetch_add(1, Ordering::SeqCst);
        }),
    )
}

#[test]
fn only_the_head_is_woken_and_the_next_once_it_leaves() {
    let p = shrinking(usize::MAX / 2);
    let held = p.charge(14 << 10).unwrap();
    assert!(p.charge(1 << 10).is_err());
    let (first_calls, first_wake) = counter();
    let (second_calls, second_wake) = counter();
    let first = p.join_line(Ask::Charge(1 << 10), first_wake);
    let second = p.join_line(Ask::Charge(1 << 10), second_wake);
    assert_eq!((first.ahead(), second.ahead()), (0, 1));
    assert_eq!(p.stats().waiting, [0, 2, 0]);
    drop(p.lease(64).unwrap());
    assert_eq!(
        first_calls.load(Ordering::SeqCst),
        1,
        "a return wakes the head"
    );
    assert_eq!(second_calls.load(Ordering::SeqCst), 0, "and only the head");
    drop(p.lease(64).unwrap());
    assert_eq!(
        first_calls.load(Ordering::SeqCst),
        1,
        "a head woken and not yet retried is not woken again"
    );
    assert!(
        p.charge_in_turn(1 << 10, Some(&first)).is_err(),
        "still full: the retry fails"
    );
    drop(p.lease(64).unwrap());
    assert_eq!(
        first_calls.load(Ordering::SeqCst),
        2,
        "after its retry, woken again"
    );
    drop(held);
    let got = p
        .charge_in_turn(1 << 10, Some(&first))
        .expect("room came back: the head is served");
    drop(first);
    assert_eq!(
        second_calls.load(Ordering::SeqCst),
        1,
        "the head's leaving wakes the next"
    );
    assert!(p.charge_in_turn(1 << 10, Some(&second)).is_ok());
    drop((second, got));
    assert_eq!(p.stats().waiting, [0, 0, 0]);
    assert_eq!(p.stats().waits, 2);
}

/// Without the reservation, a stream of small asks arriving after a large one keeps
/// taking the room as it comes back, and the large one waits for ever.
#[test]
fn newcomers_cannot_take_the_room_the_head_waits_for() {
    let p = shrinking(usize::MAX / 2);
    // Bulk limit 14 KiB: 10 KiB held, a 6 KiB ask waits.
    let held = p.charge(10 << 10).unwrap();
    assert!(p.charge(6 << 10).is_err());
    let (_, wake) = counter();
    let head = p.join_line(Ask::Charge(6 << 10), wake);
    let small = p.charge(1 << 10);
    assert!(
        matches!(small, Err(PoolError::ChargeRefused { .. })),
        "4 KiB are free, but 1 KiB would leave the head's 6 KiB unable to fit: {small:?}"
    );
    drop(held);
    let small = p
        .charge(4 << 10)
        .expect("room for both: the newcomer goes too");
    assert!(
        p.charge(5 << 10).is_err(),
        "4 + 5 + the head's 6 would pass 14"
    );
    let big = p
        .charge_in_turn(6 << 10, Some(&head))
        .expect("the head's room was kept");
    drop((head, small, big));
    assert_eq!(p.stats().charged_bytes, 0);
}

#[test]
fn the_last_free_chunk_of_the_heads_class_is_the_heads() {
    // One 1 KiB arena of 256 B chunks fits under the bulk limit; nothing more.
    let p = Pool::new(
        Heap::default(),
        PoolConfig {
            classes: vec![64, 256],
            arena_bytes: 1024,
            max_bytes: 2048,
            reserved_smallest: 1024,
            keep_bytes: usize::MAX / 2,
            heap_bytes: 4 << 10,
        },
    );
    let mut held: Vec<_> = (0..4).map(|_| p.lease(256).unwrap()).collect();
    assert!(p.lease(256).is_err());
    let (calls, wake) = counter();
    let head = p.join_line(Ask::Lease(256), wake);
    held.pop();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(
        p.lease(256).is_err(),
        "the one free chunk is kept for the head"
    );
    let mine = p
        .lease_in_turn(256, Some(&head))
        .expect("the head takes it");
    assert_eq!(mine.len(), 256);
    drop(head);
    assert!(p.lease(64).is_ok(), "other classes were never held back");
}

#[test]
fn a_waiter_that_leaves_hands_the_head_on() {
    let p = pool(1 << 20);
    let held = p.charge_heap(4 << 10).unwrap();
    let (a_calls, a_wake) = counter();
    let (b_calls, b_wake) = counter();
    let a = p.join_line(Ask::Heap(2 << 10), a_wake);
    let b = p.join_line(Ask::Heap(1 << 10), b_wake);
    assert_eq!(a.line(), Line::Heap);
    drop(a);
    assert_eq!(b_calls.load(Ordering::SeqCst), 1, "b is the head now");
    assert_eq!(a_calls.load(Ordering::SeqCst), 0);
    assert_eq!(b.ahead(), 0);
    drop(held);
    assert_eq!(
        b_calls.load(Ordering::SeqCst),
        1,
        "woken and not retried before the return: not woken twice"
    );
    let got = p
        .charge_heap_in_turn(1 << 10, Some(&b))
        .expect("b is served");
    drop(b);
    drop(got);
    assert_eq!(p.stats().waiting, [0, 0, 0]);
}

#[test]
fn heap_charges_are_bounded_and_wake_waiters_when_they_go() {
    let p = pool(1 << 20);
    let a = p.charge_heap(3 << 10).unwrap();
    let err = p.charge_heap(2 << 10).unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::HeapFull {
                len: 2048,
                in_use: 3072,
                limit: 4096
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("budget for incoming messages"),
        "{err}"
    );
    let (woken, wake) = counter();
    let place = p.join_line(Ask::Heap(2 << 10), wake);
    assert_eq!(p.stats().heap_bytes, 3 << 10);
    drop(a);
    assert_eq!(woken.load(Ordering::SeqCst), 1, "the waiter ran");
    assert_eq!(p.stats().heap_bytes, 0);
    let b = p.charge_heap_in_turn(2 << 10, Some(&place)).unwrap();
    drop(place);
    assert_eq!(p.stats().heap_bytes, 2 << 10);
    drop(b);
    assert!(p.charge_heap(p.heap_limit() + 1).is_err());
}

/// The pool over another transport's registrations: loopback's, whose bytes are reached
/// by copies. Leases are registered memory of that device (local access only, disjoint
/// ranges of one arena), an idle arena is deregistered, and a registration the device
/// refuses is the pool's `Register` error.
#[test]
fn a_pool_over_loopback_leases_that_devices_registered_memory() {
    use crate::transport::loopback::{Config, Fabric, Loopback};
    use crate::verbs::Access;

    let device = Fabric::new(Config::default()).device("lo0");
    let pool: MrPool<Loopback> = MrPool::registered(
        &device,
        PoolConfig {
            classes: vec![64, 256],
            arena_bytes: 1024,
            max_bytes: 4 << 10,
            reserved_smallest: 0,
            keep_bytes: 0,
            heap_bytes: 4 << 10,
        },
    );
    let mut a = pool.lease(10).unwrap();
    let mut b = pool.lease(64).unwrap();
    assert_eq!((a.len(), b.len()), (64, 64));
    assert_eq!(
        a.access(),
        Access::LOCAL_WRITE,
        "no remote access to pooled memory"
    );
    assert_eq!(
        a.lkey(),
        b.lkey(),
        "chunks of one arena share its registration"
    );
    assert!(a.addr() + 64 <= b.addr() || b.addr() + 64 <= a.addr());
    a.write(3, b"lease a").unwrap();
    b.write(0, &[0xee; 64]).unwrap();
    let mut out = [0u8; 7];
    a.read(3, &mut out).unwrap();
    assert_eq!(&out, b"lease a", "a's bytes are its own");
    assert!(
        a.write(60, b"too long").is_err(),
        "a chunk ends where it ends"
    );
    assert_eq!(pool.stats().registered_bytes, 1024);
    drop((a, b));
    assert_eq!(
        pool.stats().registered_bytes,
        0,
        "an idle arena goes back (keep_bytes 0)"
    );

    device.refuse_registrations(true);
    let refused = pool.lease(64).unwrap_err();
    assert!(matches!(refused, PoolError::Register(_)), "{refused:?}");
    device.refuse_registrations(false);
    assert_eq!(pool.lease(200).unwrap().len(), 256);
}
