//! The S3 features restatus relies on (docs/S3.md), asked of the test bed's S3 server through
//! the object store restatus uses: a create-only PUT (If-None-Match: *) that refuses to replace
//! a manifest, a multipart upload of a payload larger than one part, and a listing that pages
//! past 1000 keys. `scripts/test` runs these against s3s-fs and versitygw. They need only S3
//! (S3_ENDPOINT, AWS_*, RESTATUS_BUCKET), no clusters: docs/S3.md shows how to run them against
//! another store.

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use restatus::store::SnapshotStore;

use crate::bed::unique;

/// A store of its own for one test, in the bucket RESTATUS_BUCKET of the S3 the environment names.
fn store(test: &str) -> SnapshotStore {
    let bucket = std::env::var("RESTATUS_BUCKET").expect("RESTATUS_BUCKET (and S3_ENDPOINT, AWS_*) must be set");
    SnapshotStore::open(&format!("s3://{bucket}/{}", unique(test)), test).expect("open S3 store")
}

#[tokio::test]
async fn s3_create_only_put_never_replaces_an_object() {
    let store = store("s3-create");
    let s3 = store.object_store();
    let path = Path::from(format!("{}/manifest.json", unique("s3-create")));
    let create = || PutOptions { mode: PutMode::Create, ..Default::default() };

    s3.put_opts(&path, PutPayload::from_static(b"first"), create()).await.expect("create-only PUT of a new key");
    let second = s3.put_opts(&path, PutPayload::from_static(b"second"), create()).await;
    assert!(
        matches!(second, Err(object_store::Error::AlreadyExists { .. })),
        "a create-only PUT over an existing object must fail with AlreadyExists: {second:?}"
    );
    let kept = s3.get(&path).await.unwrap().bytes().await.unwrap();
    assert_eq!(kept, Bytes::from_static(b"first"), "the first object was replaced");
}

#[tokio::test]
async fn s3_multipart_upload_of_a_payload_larger_than_a_part_reads_back_whole() {
    let store = store("s3-multipart");
    let id: restatus::format::SnapshotId = "20260101T000000.000Z-5a3f00".parse().unwrap();
    // 20 MiB of pseudo-random bytes: four parts of the writer's 5 MiB.
    let mut data = Vec::with_capacity(20 << 20);
    let mut block = Sha256::digest(b"restatus").to_vec();
    while data.len() < 20 << 20 {
        block = Sha256::digest(&block).to_vec();
        data.extend_from_slice(&block);
    }
    let mut writer = store.payload_writer(&id);
    for chunk in data.chunks(1 << 20) {
        writer.write_all(chunk).await.unwrap();
    }
    writer.shutdown().await.expect("multipart upload completes");
    let read = store.object_store().get(&store.payload_path(&id)).await.unwrap().bytes().await.unwrap();
    assert_eq!(read.len(), data.len());
    assert_eq!(Sha256::digest(&read), Sha256::digest(&data), "the payload read back differs");
    let entries = store.list().await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].payload_size, Some(data.len() as u64));
}

#[tokio::test]
async fn s3_listing_pages_past_a_thousand_keys() {
    let store = store("s3-list");
    let s3 = store.object_store().clone();
    let prefix = Path::from(unique("s3-list"));
    let keys = 1100;
    futures::stream::iter(0..keys)
        .map(|i| {
            let (s3, path) = (s3.clone(), prefix.clone().join(format!("{i:05}")));
            async move { s3.put(&path, PutPayload::from_static(b"x")).await.map(|_| ()) }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .expect("PUT 1100 small objects");
    let listed: Vec<_> = s3.list(Some(&prefix)).try_collect().await.expect("list");
    assert_eq!(listed.len(), keys, "a listing of {keys} keys returned {}", listed.len());
}
