//! A restore's memory at a point of a long journal chain (issue 38, item 12; FAULTS F148):
//! measured by an allocator that counts the bytes the process holds, for the same fleet and the
//! same rate of change, one chain ten times longer than the other. A restore at a journal point
//! used to hold every decoded record of every segment until the merge, and the merged fleet
//! decoded after it: its peak grew with the chain (some 5 KB for every change). It must not.
//!
//! One test in this file: the counter is the process's, and a test beside it would count too.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use restatus::fixtures::{encode, server, snapshot, ts};
use restatus::format::{Manifest, SegmentHeader, sha256_hex};
use restatus::store::{Accept, SnapshotStore, choose_snapshot};

/// The bytes allocated now, and the most since the last [`reset_peak`].
static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: every call is passed to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let held = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(held, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn reset_peak() -> usize {
    let held = HELD.load(Ordering::Relaxed);
    PEAK.store(held, Ordering::Relaxed);
    held
}

const SERVERS: usize = 400;
const CHANGES_PER_SEGMENT: usize = 40;
const STATUS_BYTES: usize = 5_000;

/// A status of about 5 KB, as metal-operator's Servers carry, that does not compress away.
fn status(server: usize, version: usize) -> String {
    let mut noise = String::with_capacity(STATUS_BYTES);
    let mut x = (server * 7919 + version * 104_729 + 1) as u64;
    while noise.len() < STATUS_BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        noise.push_str(&format!("{x:016x}"));
    }
    format!(r#"{{"state":"Reserved","version":{version},"bios":"{noise}"}}"#)
}

/// A base of `SERVERS` Servers and a chain of `segments` segments, each changing
/// `CHANGES_PER_SEGMENT` of them (in turn), in a `file://` store (the store's bytes are on
/// disk, not in the counted memory).
async fn bucket(dir: &std::path::Path, segments: usize) -> SnapshotStore {
    let store = SnapshotStore::open(&format!("file://{}", dir.display()), "c").unwrap();
    let records: Vec<_> = (0..SERVERS).map(|i| server(i, &status(i, 0))).collect();
    let base: Manifest = snapshot(&records).at(ts("2026-11-30T09:00:00Z")).profile("test").write(&store).await;
    let mut previous = None;
    let mut from = base.created_at;
    for seq in 1..=segments {
        let changed: Vec<_> = (0..CHANGES_PER_SEGMENT)
            .map(|j| (seq * CHANGES_PER_SEGMENT + j) % SERVERS)
            .map(|i| server(i, &status(i, seq)))
            .collect();
        let (bytes, summary) = encode(&changed);
        let to = from + jiff::SignedDuration::from_secs(5);
        let mut header = SegmentHeader::new(
            "c",
            &base.snapshot_id,
            seq as u64,
            previous,
            from,
            to,
            BTreeMap::new(),
            (changed.len() as u64, 0),
            summary,
            None,
        );
        let stored = store.put_segment(&mut header, bytes, None).await.unwrap();
        previous = Some(sha256_hex(&stored));
        from = to;
    }
    store
}

/// The peak of bytes held while a restore chooses and loads the point at the end of a chain
/// of `segments`, above what was held before, and what it holds after (its records).
fn measure(segments: usize) -> (usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = runtime.block_on(bucket(dir.path(), segments));
    let accept = Accept { journal: true, ..Accept::default() };
    let before = reset_peak();
    let loaded = runtime.block_on(choose_snapshot(&store, None, &accept)).unwrap();
    let peak = PEAK.load(Ordering::Relaxed) - before;
    let kept = HELD.load(Ordering::Relaxed).saturating_sub(before);
    let point = loaded.point.as_ref().unwrap();
    assert_eq!((point.segments_applied, loaded.records.len()), (segments as u64, SERVERS));
    // The merge is right: every Server at its newest status.
    let last_changed = (segments * CHANGES_PER_SEGMENT) % SERVERS;
    let record = (0..SERVERS)
        .map(|i| loaded.records.record(i).unwrap())
        .find(|r| r.name == format!("server-{last_changed}"))
        .unwrap();
    assert!(record.status.get().contains(&format!(r#""version":{segments}"#)), "{}", &record.status.get()[..40]);
    drop(loaded);
    (peak, kept)
}

/// F148: a restore at the end of a chain ten times longer (100 segments of 40 changes of
/// ~5 KB, some 20 MB of statuses, against 10) peaks, and keeps, about what it does for the
/// short one: the chain's records are spilled and merged as a stream, the merged fleet
/// indexed, not held.
#[test]
fn a_restore_at_the_end_of_a_long_chain_holds_no_more_than_at_the_end_of_a_short_one() {
    let (short_peak, short_kept) = measure(10);
    let (long_peak, long_kept) = measure(100);
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    eprintln!(
        "chain of 10 segments: peak {:.1} MiB, kept {:.1} MiB; of 100: peak {:.1} MiB, kept {:.1} MiB",
        mib(short_peak),
        mib(short_kept),
        mib(long_peak),
        mib(long_kept)
    );
    // 90 more segments of 40 statuses of 5 KB: 18 MB more, had they been held.
    assert!(long_peak < short_peak + (2 << 20), "the peak grew with the chain: {short_peak} -> {long_peak} bytes");
    assert!(long_kept < short_kept + (1 << 20), "what a point keeps grew with the chain: {short_kept} -> {long_kept}");
}
