//! Signing's and encryption's cost, side by side (issue 24: at most 5% on backup and restore at
//! 10k objects). The store side of a backup (encode 10,000 records, upload the payload, write the
//! manifest: plain; signed, signature then manifest; sealed, signed and the payload encrypted to
//! an age recipient) and of a restore (choose the snapshot: manifest, with or without its
//! signature checked, payload's size and sha256, decrypted when sealed, every record decoded),
//! alternating plain, signed and sealed rounds so machine noise hits all three. The cluster side (LISTs, status
//! writes) is left out: it is the same with or without signing, so the ratios here are an upper
//! bound on what signing adds to a whole backup or restore. `cargo bench --bench signing`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use restatus::fixtures::{self, server, uuid};
use restatus::format::{DecryptionKeys, Recipients, Record, SigningKey, SnapshotId, TrustedKeys};
use restatus::store::{Accept, SnapshotStore, choose_snapshot};

const OBJECTS: usize = 10_000;
const ROUNDS: usize = 7;

fn record(i: usize) -> Record {
    // About 2 KiB of status, like a Server with a few NICs and disks.
    let nics: Vec<_> = (0..8)
        .map(|n| serde_json::json!({"name": format!("eth{n}"), "macAddress": format!("aa:bb:cc:{:02x}:{:02x}:{n:02x}", i / 256 % 256, i % 256), "ip": format!("10.{}.{}.{n}", i / 256 % 256, i % 256), "neighbor": {"switch": format!("sw-{}", i % 40), "port": format!("Ethernet{n}")}}))
        .collect();
    let status = serde_json::json!({"state": "Reserved", "powerState": "On", "serialNumber": format!("SN{i:08}"), "networkInterfaces": nics});
    Record { keys: vec![uuid(&format!("{i:08x}-0000-4000-8000-000000000000"))], ..server(i, &status.to_string()) }
}

/// The store side of one backup; signed with `key` when given, its payload encrypted to `to`.
async fn backup(
    store: &SnapshotStore,
    records: &[Record],
    key: Option<&SigningKey>,
    to: Option<&Recipients>,
) -> (SnapshotId, Duration) {
    let started = Instant::now();
    let mut snapshot = fixtures::snapshot(records).at(jiff::Timestamp::now()).profile("bench");
    if let Some(key) = key {
        snapshot = snapshot.signed_with(key);
    }
    if let Some(to) = to {
        snapshot = snapshot.encrypted_to(to);
    }
    let manifest = snapshot.write(store).await;
    (manifest.snapshot_id, started.elapsed())
}

async fn restore(store: &SnapshotStore, id: &SnapshotId, accept: &Accept) -> Duration {
    let started = Instant::now();
    let loaded = choose_snapshot(store, Some(id), accept).await.unwrap();
    assert_eq!(loaded.records.len(), OBJECTS);
    started.elapsed()
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(&format!("file://{}", dir.path().display()), "bench").unwrap();
    let records: Vec<Record> = (0..OBJECTS).map(record).collect();
    let key = SigningKey::generate();
    let trusting = Accept { trusted: Some(Arc::new(TrustedKeys::new([key.public_key()]))), ..Default::default() };
    let (identity, recipient) = DecryptionKeys::generate(jiff::Timestamp::now());
    let to = Recipients::load(&[recipient]).unwrap().expect("a recipient");
    let unsealing =
        store.clone().with_decryption_keys(Some(Arc::new(DecryptionKeys::parse_all("bench", &identity).unwrap())));
    let (mut b_plain, mut b_signed, mut b_sealed) = (vec![], vec![], vec![]);
    let (mut r_plain, mut r_signed, mut r_sealed) = (vec![], vec![], vec![]);
    // One warm-up round of each, not counted.
    let (warm, _) = backup(&store, &records, Some(&key), Some(&to)).await;
    restore(&unsealing, &warm, &trusting).await;
    for _ in 0..ROUNDS {
        let (plain, took) = backup(&store, &records, None, None).await;
        b_plain.push(took);
        let (signed, took) = backup(&store, &records, Some(&key), None).await;
        b_signed.push(took);
        let (sealed, took) = backup(&store, &records, Some(&key), Some(&to)).await;
        b_sealed.push(took);
        r_plain.push(restore(&store, &plain, &Accept::default()).await);
        r_signed.push(restore(&store, &signed, &trusting).await);
        r_sealed.push(restore(&unsealing, &sealed, &trusting).await);
    }
    // The primitive alone, on this snapshot's manifest bytes.
    let (id, _) = backup(&store, &records, Some(&key), None).await;
    let manifest = store.manifest(&id).await.unwrap().to_json();
    let started = Instant::now();
    let mut signature = Vec::new();
    for _ in 0..1000 {
        signature = key.sign(&manifest);
    }
    let sign_us = started.elapsed().as_secs_f64() * 1000.0;
    let trusted = TrustedKeys::new([key.public_key()]);
    let started = Instant::now();
    for _ in 0..1000 {
        trusted.verify(id.as_str(), &manifest, Some(key.id()), Some(&signature)).unwrap();
    }
    let verify_us = started.elapsed().as_secs_f64() * 1000.0;
    let (bp, bs, be) = (median(b_plain), median(b_signed), median(b_sealed));
    let (rp, rs, re) = (median(r_plain), median(r_signed), median(r_sealed));
    let pct = |x: f64, base: f64| (x / base - 1.0) * 100.0;
    println!("signing and encryption bench: {OBJECTS} objects, {ROUNDS} alternating rounds, medians, file:// store");
    println!(
        "backup (store side)   plain {bp:8.1} ms   signed {bs:8.1} ms {:+6.1}%   sealed {be:8.1} ms {:+6.1}%",
        pct(bs, bp),
        pct(be, bp)
    );
    println!(
        "restore (store side)  plain {rp:8.1} ms   verified {rs:6.1} ms {:+6.1}%   unsealed {re:6.1} ms {:+6.1}%",
        pct(rs, rp),
        pct(re, rp)
    );
    println!("sign one manifest ({} bytes): {sign_us:.1} us; verify: {verify_us:.1} us", manifest.len());
}
