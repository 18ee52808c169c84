//! Bench-only bulk loader: writes a fleet's Servers straight into a cluster's etcd, bypassing
//! the API server, through etcd's v3 HTTP/JSON gateway (`POST /v3/kv/range`, `/v3/kv/txn`).
//! Creating Servers through the API server (create, then a status patch) runs at about 30
//! objects a second on the 2-core bench machine, so the 100k-object figures of the scale bench
//! were out of reach; etcd takes them in batches, many batches in flight.
//!
//! Each Server is stored as kube-apiserver 1.34 stores a custom resource created through it
//! (checked against one created through the API and read back with `/v3/kv/range`): key
//! `PREFIX/metal.ironcore.dev/servers/NAME` (cluster-scoped; PREFIX is the API server's
//! `--etcd-prefix`, `/registry` by default), value the object as JSON with sorted keys and a
//! final newline, without `resourceVersion` (the API server takes it from the key's
//! revision), with `metadata.uid`, `creationTimestamp`, `generation: 1`, the spec defaults of
//! metal-operator v0.7.0's Server CRD (`reclaimPolicy: Recycle`, `unclaimable: false`), its
//! status, and optionally the two `managedFields` entries a create and a status update leave
//! (fields at the depth the API server records them for these objects). The API server's
//! watch cache learns of them through its etcd watch, as of any write.
//!
//! Never for a real cluster: nothing is validated, no admission runs, and the API server's
//! own caches (but not its watch) are bypassed. Servers only; BMCs and ServerClaims still go
//! through the API ([`super::create`]).

use anyhow::{Context, Result, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use futures::{StreamExt, TryStreamExt, stream};
use serde_json::{Map, Value, json};

use super::{FleetSpec, mix};

/// etcd's defaults: `--max-txn-ops` 128, `--max-request-bytes` 1.5 MiB.
const MAX_OPS: usize = 128;
const MAX_BATCH_BYTES: usize = 1024 * 1024;

/// What [`load_servers`] did.
#[derive(Debug, Clone, Copy)]
pub struct Loaded {
    /// Servers written.
    pub written: usize,
    /// Servers of the fleet that were in etcd already, left as they were.
    pub existing: usize,
    /// Bytes of values written.
    pub bytes: usize,
}

/// Options of [`load_servers`].
#[derive(Debug, Clone)]
pub struct EtcdTarget {
    /// etcd's client URL, e.g. `http://127.0.0.1:2379`.
    pub url: String,
    /// The API server's `--etcd-prefix`.
    pub prefix: String,
    /// Write the `managedFields` a create and a status update through the API would leave.
    pub managed_fields: bool,
    /// Write each Server in a transaction of its own, as creates through the API do. Batched,
    /// the Servers of one transaction share one etcd revision, so the API server gives them one
    /// resourceVersion, and a watch that ends in the middle of them (its timeout, a slow
    /// watcher closed) resumes after all of them: the rest are never delivered to it. A fleet
    /// a controller watches as it arrives must not be batched.
    pub one_per_revision: bool,
}

/// Writes the fleet's Servers (with their status unless `spec.with_status` is false) into
/// etcd, `concurrency` transactions in flight. Servers whose key exists are left as they are,
/// so loading a fleet twice is harmless; each transaction creates its keys only if none of
/// them exists, and fails otherwise.
pub async fn load_servers(etcd: &EtcdTarget, spec: &FleetSpec, concurrency: usize) -> Result<Loaded> {
    let http = reqwest::Client::new();
    let base = etcd.url.trim_end_matches('/');
    let dir = format!("{}/metal.ironcore.dev/servers/", etcd.prefix.trim_end_matches('/'));
    let existing: std::collections::HashSet<String> = keys_under(&http, base, &format!("{dir}{}-server-", spec.name))
        .await?
        .iter()
        .map(|key| key.rsplit('/').next().unwrap_or_default().to_string())
        .collect();
    let created = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let todo: Vec<usize> = (0..spec.servers).filter(|&i| !existing.contains(&spec.server_name(i))).collect();
    // Batches of indices, cut by count; values are built when a batch is sent.
    let per_txn = if etcd.one_per_revision { 1 } else { MAX_OPS };
    let batches: Vec<Vec<usize>> = todo.chunks(per_txn).map(<[usize]>::to_vec).collect();
    let bytes = stream::iter(batches)
        .map(|batch| {
            let (http, dir, created) = (&http, &dir, &created);
            async move {
                let mut sent = 0;
                let mut ops = Vec::new();
                let mut size = 0;
                for i in batch {
                    let value = stored_server(spec, i, created, etcd.managed_fields);
                    let key = format!("{dir}{}", spec.server_name(i));
                    if size + value.len() + key.len() > MAX_BATCH_BYTES && !ops.is_empty() {
                        sent += put_if_absent(http, base, std::mem::take(&mut ops)).await?;
                        size = 0;
                    }
                    size += value.len() + key.len();
                    ops.push((key, value));
                }
                if !ops.is_empty() {
                    sent += put_if_absent(http, base, ops).await?;
                }
                anyhow::Ok(sent)
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_fold(0, |total, sent| async move { Ok(total + sent) })
        .await?;
    Ok(Loaded { written: todo.len(), existing: existing.len(), bytes })
}

/// Waits until the API server lists every Server of the fleet, retrying while it answers
/// 429 or fails; returns how long that took. The API server learns of objects written into
/// etcd behind its back from its watch of etcd, so its LISTs (served from its watch cache) lag
/// the writes: under load a LIST right after a load missed some of 300 Servers. And the first
/// LIST of a kind whose objects came through etcd makes the API server build its watch cache of
/// that kind from etcd; until it is built a consistent LIST is answered 429 ("Too large
/// resource version"): at 100k Servers that took minutes and ~6.5 GB of RSS on the bench
/// machine. Writes through the API build it object by object as they go.
pub async fn wait_listed(
    client: &kube::Client,
    spec: &FleetSpec,
    deadline: std::time::Duration,
) -> Result<std::time::Duration> {
    wait_servers(client, spec, deadline, |listed| listed >= spec.servers).await
}

/// Waits until the API server lists none of the fleet's Servers (after [`delete_fleet`]).
pub async fn wait_gone(
    client: &kube::Client,
    spec: &FleetSpec,
    deadline: std::time::Duration,
) -> Result<std::time::Duration> {
    wait_servers(client, spec, deadline, |listed| listed == 0).await
}

/// Lists the fleet's Servers once a second until `done` says yes to how many there are.
async fn wait_servers(
    client: &kube::Client,
    spec: &FleetSpec,
    deadline: std::time::Duration,
    done: impl Fn(usize) -> bool,
) -> Result<std::time::Duration> {
    let profile = crate::domain::identity::Profile::metal_operator();
    let kind = profile.kind("Server").expect("built-in kind");
    let selector = format!("{}={}", super::FLEET_LABEL, spec.name);
    let page = crate::k8s::PageRequest { size: 500, selector: Some(&selector), namespace: None };
    let started = std::time::Instant::now();
    loop {
        let mut listed = 0;
        let counted = crate::k8s::list_objects(client, kind, &page, |_| {
            listed += 1;
            Ok(())
        })
        .await;
        let failure = match counted {
            Ok(_) if done(listed) => return Ok(started.elapsed()),
            Ok(_) => format!("{listed} of its {} Servers listed", spec.servers),
            Err(e) => e.to_string(),
        };
        if started.elapsed() > deadline {
            bail!("fleet {}: not there yet after {deadline:?}: {failure}", spec.name);
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Deletes the fleet's Servers and ServerClaims from etcd, behind the API server's back (its
/// watch cache learns of it as of any write), in transactions of [`MAX_OPS`] keys; returns how
/// many. A bench frees a fleet it is done with this way: the API server keeps every object of a
/// kind in memory, and at 100k Servers two fleets on one bed would not fit the machine.
pub async fn delete_fleet(etcd: &EtcdTarget, spec: &FleetSpec) -> Result<usize> {
    let http = reqwest::Client::new();
    let base = etcd.url.trim_end_matches('/');
    let root = etcd.prefix.trim_end_matches('/');
    let mut prefixes = vec![format!("{root}/metal.ironcore.dev/servers/{}-server-", spec.name)];
    prefixes.extend(
        spec.namespaces.iter().map(|ns| format!("{root}/metal.ironcore.dev/serverclaims/{ns}/{}-claim-", spec.name)),
    );
    let mut keys = Vec::new();
    for prefix in &prefixes {
        keys.extend(keys_under(&http, base, prefix).await?);
    }
    for batch in keys.chunks(MAX_OPS) {
        let success: Vec<Value> =
            batch.iter().map(|k| json!({"request_delete_range": {"key": B64.encode(k)}})).collect();
        post(&http, &format!("{base}/v3/kv/txn"), &json!({"success": success})).await?;
    }
    Ok(keys.len())
}

/// The keys that start with `prefix`.
async fn keys_under(http: &reqwest::Client, base: &str, prefix: &str) -> Result<Vec<String>> {
    let body = json!({"key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix)), "keys_only": true});
    let reply = post(http, &format!("{base}/v3/kv/range"), &body).await?;
    let mut keys = Vec::new();
    for kv in reply["kvs"].as_array().into_iter().flatten() {
        let key = B64.decode(kv["key"].as_str().unwrap_or_default()).context("etcd range: key not base64")?;
        keys.push(String::from_utf8(key).context("etcd range: key not UTF-8")?);
    }
    Ok(keys)
}

/// The end of the range of keys starting with `prefix` (its last byte incremented).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    end
}

/// One transaction: every key put, if none of them exists yet. Returns the bytes put.
async fn put_if_absent(http: &reqwest::Client, base: &str, ops: Vec<(String, Vec<u8>)>) -> Result<usize> {
    let bytes = ops.iter().map(|(_, v)| v.len()).sum();
    let compare: Vec<Value> = ops
        .iter()
        .map(|(k, _)| json!({"key": B64.encode(k), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}))
        .collect();
    let success: Vec<Value> =
        ops.iter().map(|(k, v)| json!({"request_put": {"key": B64.encode(k), "value": B64.encode(v)}})).collect();
    let reply = post(http, &format!("{base}/v3/kv/txn"), &json!({"compare": compare, "success": success})).await?;
    if reply["succeeded"] != json!(true) {
        bail!(
            "etcd txn of {} Servers ({} ...) not applied: one of them exists already (another loader running?)",
            ops.len(),
            ops[0].0
        );
    }
    Ok(bytes)
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Result<Value> {
    // The gateway answers errors with HTTP 4xx/5xx and {"error": ..., "message": ...}; a
    // transient overload is retried a few times.
    let mut attempt = 0;
    loop {
        attempt += 1;
        let sent = http
            .post(url)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body)?)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status);
        let failure = match sent {
            Ok(reply) => match reply.bytes().await {
                Ok(bytes) => return serde_json::from_slice(&bytes).with_context(|| format!("POST {url}: not JSON")),
                Err(e) => e,
            },
            Err(e) => e,
        };
        if attempt >= 5 {
            return Err(failure).with_context(|| format!("POST {url} (attempt {attempt})"));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200 * attempt)).await;
    }
}

/// Server `i` of the fleet as the API server stores it: JSON with sorted keys (serde_json's
/// map is ordered by key, as Go's encoding of an unstructured object) and a final newline.
pub fn stored_server(spec: &FleetSpec, i: usize, created: &str, managed_fields: bool) -> Vec<u8> {
    let (mut object, status) = spec.server(i);
    spec.decorate(&mut object);
    // The CRD's defaults, applied by the API server on create.
    let server_spec = object["spec"].as_object_mut().expect("spec");
    server_spec.entry("reclaimPolicy").or_insert(json!("Recycle"));
    server_spec.entry("unclaimable").or_insert(json!(false));
    let meta = object["metadata"].as_object_mut().expect("metadata");
    meta.insert("uid".into(), json!(uid(mix(i as u64 ^ 0x0a1d_0000 ^ spec.seed()))));
    meta.insert("creationTimestamp".into(), json!(created));
    meta.insert("generation".into(), json!(1));
    if spec.with_status {
        object["status"] = status;
    }
    if managed_fields {
        let fields = managed_fields_of(&object, created, spec.with_status);
        object["metadata"]["managedFields"] = fields;
    }
    let mut value = serde_json::to_vec(&object).expect("JSON of a Server");
    value.push(b'\n');
    value
}

/// What the API server records for a create by `restatus-fleet` and, with status, a status
/// update: the object's labels and annotations one by one, spec and status fields at the top
/// level (the lists and references of a Server are atomic).
fn managed_fields_of(object: &Value, time: &str, with_status: bool) -> Value {
    fn leaves(map: &Value) -> Value {
        let mut out = Map::new();
        out.insert(".".into(), json!({}));
        for key in map.as_object().into_iter().flat_map(Map::keys) {
            out.insert(format!("f:{key}"), json!({}));
        }
        Value::Object(out)
    }
    let mut meta = Map::new();
    for part in ["annotations", "labels"] {
        if object["metadata"].get(part).is_some() {
            meta.insert(format!("f:{part}"), leaves(&object["metadata"][part]));
        }
    }
    let entry = |fields: Value, subresource: Option<&str>| {
        let mut e = json!({
            "apiVersion": "metal.ironcore.dev/v1alpha1",
            "fieldsType": "FieldsV1",
            "fieldsV1": fields,
            "manager": "restatus-fleet",
            "operation": "Update",
            "time": time,
        });
        if let Some(s) = subresource {
            e["subresource"] = json!(s);
        }
        e
    };
    let mut fields = vec![entry(json!({"f:metadata": meta, "f:spec": leaves(&object["spec"])}), None)];
    if with_status {
        fields.push(entry(json!({"f:status": leaves(&object["status"])}), Some("status")));
    }
    Value::Array(fields)
}

/// A random-looking (version 4, variant 1) but deterministic UID.
fn uid(h: u64) -> String {
    let l = mix(h);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xfff,
        0x8000 | ((l >> 48) & 0x3fff),
        l & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_servers_are_sorted_json_with_metadata_and_status() {
        let spec = FleetSpec::new("t", 3, 0, 1);
        let bytes = stored_server(&spec, 0, "2026-12-01T03:03:16Z", true);
        assert_eq!(bytes.last(), Some(&b'\n'));
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.starts_with(r#"{"apiVersion":"metal.ironcore.dev/v1alpha1","kind":"Server","metadata":{"creationTimestamp":"2026-12-01T03:03:16Z","generation":1,"labels":{"restatus.ironcore.dev/sample-fleet":"t"},"managedFields":[{"apiVersion""#), "{text}");
        let object: Value = serde_json::from_slice(&bytes).unwrap();
        let (api, status) = spec.server(0);
        assert_eq!(object["status"], status);
        assert_eq!(object["spec"]["systemUUID"], api["spec"]["systemUUID"]);
        assert_eq!(object["spec"]["serverClaimRef"], api["spec"]["serverClaimRef"]);
        assert_eq!(object["spec"]["reclaimPolicy"], "Recycle");
        assert!(object["metadata"].get("resourceVersion").is_none());
        let fields = &object["metadata"]["managedFields"];
        assert_eq!(fields[1]["subresource"], "status");
        assert_eq!(fields[1]["fieldsV1"]["f:status"]["f:networkInterfaces"], json!({}));
        assert_eq!(fields[0]["fieldsV1"]["f:metadata"]["f:labels"]["f:restatus.ironcore.dev/sample-fleet"], json!({}));
        let uids: std::collections::HashSet<String> = (0..3)
            .map(|i| {
                let o: Value = serde_json::from_slice(&stored_server(&spec, i, "x", false)).unwrap();
                assert!(o["metadata"].get("managedFields").is_none());
                o["metadata"]["uid"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(uids.len(), 3);
        assert!(uids.iter().all(|u| u.len() == 36 && u.as_bytes()[14] == b'4'));
    }

    #[test]
    fn range_end_of_a_prefix() {
        assert_eq!(prefix_end("/registry/a/"), b"/registry/a0");
    }
}
