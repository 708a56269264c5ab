//! The seqlock without RDMA: the client's `VersionedRead` against a simulated writer
//! interleaved word by word (the order `SharedRegion::update` stores in), the region
//! catalogue before registration, handles and wire messages.

use super::layout::*;
use super::*;

/// Deterministic xorshift.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn a_quiet_region_reads_in_three_steps() {
    let mut r = VersionedRead::new(10);
    assert_eq!(r.poll_step(), ReadStep::Version);
    r.handle_version(6);
    assert_eq!(r.poll_step(), ReadStep::Data);
    r.handle_data(b"xy".to_vec());
    assert_eq!(r.poll_step(), ReadStep::Version);
    assert_eq!(r.take_outcome(), None, "not finished yet");
    r.handle_version(6);
    assert_eq!(r.poll_step(), ReadStep::Finished);
    assert_eq!(
        r.take_outcome(),
        Some(Ok(VersionedData {
            data: b"xy".to_vec(),
            version: 6,
            retries: 0
        }))
    );
    assert_eq!(r.take_outcome(), None, "taken once");
}

#[test]
fn an_odd_version_means_read_the_version_again() {
    let mut r = VersionedRead::new(10);
    r.handle_version(7);
    assert_eq!(r.poll_step(), ReadStep::Version);
    r.handle_version(8);
    r.handle_data(b"a".to_vec());
    r.handle_version(8);
    let out = r.take_outcome().unwrap().unwrap();
    assert_eq!((out.version, out.retries), (8, 1));
}

#[test]
fn a_changed_even_version_starts_the_next_attempt() {
    let mut r = VersionedRead::new(10);
    r.handle_version(4);
    r.handle_data(b"old".to_vec());
    r.handle_version(6);
    // The 6 read after the data serves as the next attempt's first version.
    assert_eq!(r.poll_step(), ReadStep::Data);
    r.handle_data(b"new".to_vec());
    r.handle_version(6);
    let out = r.take_outcome().unwrap().unwrap();
    assert_eq!(
        (out.data, out.version, out.retries),
        (b"new".to_vec(), 6, 1)
    );
}

#[test]
fn a_changed_odd_version_reads_the_version_again() {
    let mut r = VersionedRead::new(10);
    r.handle_version(4);
    r.handle_data(b"old".to_vec());
    r.handle_version(5);
    assert_eq!(r.poll_step(), ReadStep::Version);
}

#[test]
fn a_region_that_never_settles_is_contended() {
    let mut r = VersionedRead::new(3);
    for v in [5, 7] {
        r.handle_version(v);
        assert_eq!(r.poll_step(), ReadStep::Version);
    }
    r.handle_version(9);
    assert_eq!(r.poll_step(), ReadStep::Finished);
    assert_eq!(r.take_outcome(), Some(Err(Contended { attempts: 3 })));
}

/// A region of `WORDS` u64 words whose writer stores, word by word, one value per update
/// into every word (the value for version v is v / 2), exactly as `publish` orders its
/// stores: version odd, the words, version even.
const WORDS: usize = 6;

struct SimRegion {
    header: u64,
    /// The ring of copies; version v is in copy (v / 2) % len.
    copies: Vec<[u64; WORDS]>,
    /// Writer progress: None when idle, else the next word to store.
    writing: Option<usize>,
}

impl SimRegion {
    fn new(copies: usize) -> Self {
        let mut ring = vec![[0; WORDS]; copies];
        ring[rdmactor::verbs::copy_of(FIRST_VERSION, copies)] = [FIRST_VERSION / 2; WORDS];
        SimRegion {
            header: FIRST_VERSION,
            copies: ring,
            writing: None,
        }
    }

    /// One store of the writer: the marker (next version - 1), the words of the next
    /// version's copy, the next version.
    fn writer_step(&mut self) {
        let next = (self.header | 1) + 1;
        let copy = rdmactor::verbs::copy_of(next, self.copies.len());
        match self.writing {
            None => {
                self.header = next - 1;
                self.writing = Some(0);
            }
            Some(i) if i < WORDS => {
                self.copies[copy][i] = next / 2;
                self.writing = Some(i + 1);
            }
            Some(_) => {
                self.header = next;
                self.writing = None;
            }
        }
    }
}

/// A reader's data READ in progress: words fetched one at a time, in an order of the
/// NIC's choosing.
struct DataRead {
    order: Vec<usize>,
    got: [u64; WORDS],
    done: usize,
}

impl DataRead {
    fn new(rng: &mut Rng) -> Self {
        let mut order: Vec<usize> = (0..WORDS).collect();
        for i in (1..WORDS).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        DataRead {
            order,
            got: [0; WORDS],
            done: 0,
        }
    }

    /// Fetches one word of the copy of `version`; true when all are in.
    fn step(&mut self, region: &SimRegion, version: u64) -> bool {
        let i = self.order[self.done];
        self.got[i] = region.copies[rdmactor::verbs::copy_of(version, region.copies.len())][i];
        self.done += 1;
        self.done == WORDS
    }

    fn bytes(&self) -> Vec<u8> {
        self.got.iter().flat_map(|w| w.to_le_bytes()).collect()
    }
}

fn words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Runs a reader against a writer under a random schedule. Returns (accepted reads,
/// torn plain reads, retries).
fn race(seed: u64, reads: usize, writer_share: u64, copies: usize) -> (usize, usize, u32) {
    let mut rng = Rng(seed | 1);
    let mut region = SimRegion::new(copies);
    let mut accepted = 0;
    let mut torn_plain = 0;
    let mut retries = 0;
    for _ in 0..reads {
        let mut machine = VersionedRead::with_copies(1_000_000, copies);
        let mut data: Option<DataRead> = None;
        loop {
            if rng.below(100) < writer_share {
                region.writer_step();
                continue;
            }
            match machine.poll_step() {
                ReadStep::Version => machine.handle_version(region.header),
                ReadStep::Data => {
                    let version = machine.data_version().unwrap();
                    let read = data.get_or_insert_with(|| DataRead::new(&mut rng));
                    if read.step(&region, version) {
                        let bytes = read.bytes();
                        let w = words(&bytes);
                        if w.iter().any(|&x| x != w[0]) {
                            torn_plain += 1;
                        }
                        machine.handle_data(bytes);
                        data = None;
                    }
                }
                ReadStep::Finished => {
                    let out = machine.take_outcome().unwrap().unwrap();
                    let w = words(&out.data);
                    assert!(
                        w.iter().all(|&x| x == out.version / 2),
                        "seed {seed}: accepted torn data {w:?} as version {}",
                        out.version
                    );
                    accepted += 1;
                    retries += out.retries;
                    break;
                }
            }
        }
    }
    (accepted, torn_plain, retries)
}

#[test]
fn versioned_reads_never_accept_torn_data() {
    let mut torn_total = 0;
    let mut retries_total = 0;
    for seed in 1..=100 {
        // Percent of scheduling decisions that go to the writer.
        for share in [5, 15, 30, 45] {
            let (accepted, torn, retries) = race(seed, 100, share, 1);
            assert_eq!(accepted, 100);
            torn_total += torn;
            retries_total += retries;
        }
    }
    // The schedule does tear plain reads, so the check above means something.
    assert!(torn_total > 1000, "only {torn_total} torn plain reads");
    assert!(retries_total > 1000, "only {retries_total} retries");
}

#[test]
fn more_copies_mean_fewer_retries_and_still_no_torn_data() {
    for copies in [2, 3, 8] {
        let (mut torn_total, mut retries_one, mut retries_ring) = (0, 0, 0);
        for seed in 1..=50 {
            for share in [15, 30, 45] {
                let (accepted, torn, retries) = race(seed, 100, share, copies);
                assert_eq!(accepted, 100);
                torn_total += torn;
                retries_ring += retries;
                retries_one += race(seed, 100, share, 1).2;
            }
        }
        // Writers do run into readers' copies (torn plain reads happen; with 8 copies this
        // schedule rarely laps a reader)...
        if copies <= 3 {
            assert!(
                torn_total > 0,
                "{copies} copies: the writer never hit a reader"
            );
        }
        // ...and the ring saves most retries.
        assert!(
            retries_ring * 2 < retries_one,
            "{copies} copies: {retries_ring} retries against {retries_one} with one"
        );
    }
}

#[test]
fn regions_are_named_once_and_written_in_range() {
    let regions = ReadRegions::new();
    let w = regions.add_buffer("a", vec![0; 16]).unwrap();
    assert!(matches!(
        regions.add_static("a", vec![1]),
        Err(RegionError::Duplicate(_))
    ));
    regions.add_static("s", b"fixed".to_vec()).unwrap();
    assert_eq!(regions.names(), ["a", "s"]);
    assert!(
        regions.writer("s").is_none(),
        "static regions have no writer"
    );
    assert!(regions.writer("nope").is_none());

    assert_eq!(w.version(), FIRST_VERSION);
    assert_eq!(w.write(8, &[7; 8]).unwrap(), FIRST_VERSION + 2);
    assert!(matches!(
        w.write(9, &[7; 8]),
        Err(RegionError::OutOfRange { .. })
    ));
    assert!(matches!(
        w.write(usize::MAX, &[1]),
        Err(RegionError::OutOfRange { .. })
    ));
    let v = w.update(|v, bytes| bytes[..8].copy_from_slice(&v.to_le_bytes()));
    assert_eq!(v, FIRST_VERSION + 4);
    let region = regions.get("a").unwrap();
    let (version, bytes) = region.snapshot();
    assert_eq!(version, v);
    assert_eq!(&bytes[..8], &v.to_le_bytes());
    assert_eq!(&bytes[8..], &[7; 8]);
}

#[test]
fn files_are_opened_at_once_and_served_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, b"file bytes").unwrap();
    let regions = ReadRegions::new();
    regions.add_file("f", &path).unwrap();
    let region = regions.get("f").unwrap();
    // Opened when added: the file may go away before the first lookup maps it.
    std::fs::remove_file(&path).unwrap();
    assert!(!region.is_mutable());
    assert_eq!(region.len(), 10);
    assert_eq!(region.snapshot(), (FIRST_VERSION, b"file bytes".to_vec()));
    assert!(regions.writer("f").is_none(), "files have no writer");
    std::fs::write(dir.path().join("empty"), b"").unwrap();
    regions.add_file("e", dir.path().join("empty")).unwrap();
    assert_eq!(regions.get("e").unwrap().len(), 0);
    assert!(matches!(
        regions.add_file("g", dir.path().join("missing")),
        Err(RegionError::Load { .. })
    ));
}

#[test]
fn handles_address_data_after_the_version_word_of_mutable_regions_only() {
    let info = |mutable| RegionInfo {
        name: "r".into(),
        grant: rdmactor::verbs::RemoteRegion {
            addr: 0x1000,
            len: 8 + 100,
            rkey: 9,
        },
        len: 100,
        version: 2,
        mutable,
        copies: 1,
    };
    let handle = RegionHandle::from_info(info(true));
    let word = handle.version_word().unwrap();
    assert_eq!((word.addr, word.len), (0x1000, 8));
    let r = handle.data_range(2, 10, 200);
    assert_eq!((r.addr, r.len, r.rkey), (0x1000 + 8 + 10, 200, 9));
    let fixed = RegionHandle::from_info(info(false));
    assert_eq!(
        fixed.version_word(),
        None,
        "static regions have no version word"
    );
    assert_eq!(fixed.data_range(2, 10, 5).addr, 0x1000 + 10);
    // Three copies: version v is in copy (v / 2) % 3.
    let ring = RegionHandle::from_info(RegionInfo {
        copies: 3,
        ..info(true)
    });
    assert_eq!(ring.data_range(2, 0, 1).addr, 0x1000 + 8 + 100);
    assert_eq!(ring.data_range(4, 0, 1).addr, 0x1000 + 8 + 200);
    assert_eq!(ring.data_range(6, 1, 1).addr, 0x1000 + 8 + 1);
}

#[test]
fn a_server_claiming_a_huge_region_costs_no_panic_in_data_range() {
    // A hostile server's lookup answer: the copy offset `copy * len` overflows u64.
    let handle = RegionHandle::from_info(RegionInfo {
        name: "r".into(),
        grant: rdmactor::verbs::RemoteRegion {
            addr: 0x1000,
            len: 8,
            rkey: 9,
        },
        len: u64::MAX,
        version: 2,
        mutable: true,
        copies: 3,
    });
    // Copy 2 of 3: the address wraps (the NIC refuses it against the grant), no panic.
    let r = handle.data_range(4, u64::MAX, u64::MAX);
    let header = 8u64.wrapping_add(2u64.wrapping_mul(u64::MAX));
    assert_eq!(
        r.addr,
        0x1000u64.wrapping_add(header).wrapping_add(u64::MAX)
    );
    assert_eq!((r.len, r.rkey), (u64::MAX, 9));
}

#[test]
fn requests_round_trip() {
    for req in [ReadRequest::Lookup { name: "x".into() }, ReadRequest::List] {
        let bytes = postcard::to_allocvec(&req).unwrap();
        assert_eq!(postcard::from_bytes::<ReadRequest>(&bytes).unwrap(), req);
    }
}
