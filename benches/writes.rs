//! What one restore write costs the API server (run by `scripts/bench`): kube-apiserver and
//! etcd CPU (from /proc) and wall time per object for each kind of write restatus makes, on
//! Servers with the fleet's full inventory, 16 writes in flight. This is the cost model
//! behind the restore figures: the API server's CPU, not restatus, bounds a restore.
//!
//! Where two ways of making a write are compared (a merge patch, as restatus wrote until
//! this bench showed the difference, and a replace, as it writes now), they run on sets of
//! their own in alternating chunks of 100 objects, so that the API server's drift (it slows
//! as it fills) and the shared machine's weigh on both alike.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use restatus::domain::annotations::{
    OPERATION_ANNOTATION, OPERATION_IGNORE, QUIESCED_BY_ANNOTATION, RESTORED_FROM_ANNOTATION,
};
use restatus::domain::identity::{KindProfile, Profile};
use restatus::fleet::{self, FleetSpec};
use serde_json::{Value, json};

const CONCURRENCY: usize = 16;
const OBJECTS: usize = 2000;
const CHUNK: usize = 100;

// Only a part of it: the environment and the bare restore's writes.
#[allow(dead_code)]
mod support;

use support::bare::{released, status_object};
use support::env;

/// CPU seconds (user + system) a process of the test bed has used so far.
fn cpu_seconds(process: &str) -> f64 {
    let pid = std::fs::read_to_string(format!("{}/{process}.pid", env("RESTATUS_STATE"))).unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

#[derive(Clone, Copy)]
enum Write {
    /// Set restatus's ignore (object without status), merge patch.
    Quiesce,
    /// The whole inventory through the status subresource, merge patch.
    StatusPatch,
    /// The same as a replace of the status subresource, on the last answer's resourceVersion.
    StatusReplace,
    /// Remove the ignore, set restored-from (object with status), merge patch.
    ReleasePatch,
    /// The same as a replace of the object as the last write answered it.
    ReleaseReplace,
    /// The StatusRestored Event.
    Event,
}

/// A set of Servers without status, and per object the API server's last answer.
struct Set {
    spec: FleetSpec,
    statuses: Vec<Value>,
    answers: Vec<Mutex<Option<DynamicObject>>>,
}

async fn set(client: &kube::Client, name: &str) -> Set {
    let spec = FleetSpec { with_status: false, ..FleetSpec::new(name, OBJECTS, 0, 0) };
    fleet::create(client, &spec, 48).await.unwrap();
    let statuses = (0..OBJECTS).map(|i| spec.server(i).1).collect();
    Set { spec, statuses, answers: (0..OBJECTS).map(|_| Mutex::new(None)).collect() }
}

async fn write(
    server: &KindProfile,
    servers: &Api<DynamicObject>,
    events: &Api<Event>,
    set: &Set,
    objects: std::ops::Range<usize>,
    writes: &[Write],
) {
    stream::iter(objects)
        .map(|i| async move {
            let name = set.spec.server_name(i);
            let params = PatchParams { field_manager: Some("bench".into()), ..Default::default() };
            let post = PostParams { field_manager: Some("bench".into()), ..Default::default() };
            let last = || set.answers[i].lock().unwrap().clone().expect("an earlier write's answer");
            for w in writes {
                let answer = match w {
                    Write::Quiesce => {
                        let body = json!({"metadata": {"annotations": {OPERATION_ANNOTATION: OPERATION_IGNORE, QUIESCED_BY_ANNOTATION: "bench"}}});
                        servers.patch(&name, &params, &Patch::Merge(body)).await.map(Some)
                    }
                    Write::StatusPatch => {
                        let body = json!({"status": set.statuses[i]});
                        servers.patch_status(&name, &params, &Patch::Merge(body)).await.map(Some)
                    }
                    Write::StatusReplace => {
                        let version = last().metadata.resource_version;
                        let object = status_object(server, &name, None, version, set.statuses[i].clone());
                        servers.replace_status(&name, &post, &object).await.map(Some)
                    }
                    Write::ReleasePatch => {
                        let body = json!({"metadata": {"annotations": {OPERATION_ANNOTATION: null, QUIESCED_BY_ANNOTATION: null, RESTORED_FROM_ANNOTATION: "bench"}}});
                        servers.patch(&name, &params, &Patch::Merge(body)).await.map(Some)
                    }
                    Write::ReleaseReplace => servers.replace(&name, &post, &released(last(), "bench")).await.map(Some),
                    Write::Event => {
                        let event: Event = serde_json::from_value(json!({
                            "metadata": {"generateName": "bench-"},
                            "eventTime": jiff::Timestamp::now().to_string(),
                            "reportingController": "bench", "reportingInstance": "bench",
                            "action": "RestoreStatus", "reason": "StatusRestored", "type": "Normal",
                            "note": "status restored from snapshot bench",
                            "regarding": {"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server", "name": name},
                        }))
                        .unwrap();
                        events.create(&PostParams::default(), &event).await.map(|_| None)
                    }
                }
                .unwrap();
                if let Some(answer) = answer {
                    *set.answers[i].lock().unwrap() = Some(answer);
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
}

/// One way of writing: the writes made untimed first, and the timed ones.
struct Way {
    label: &'static str,
    before: &'static [Write],
    timed: &'static [Write],
}

/// Per way: (wall, apiserver CPU, etcd CPU) in ms per object. Each way writes a set of its
/// own; the ways take turns, one chunk of objects each.
async fn measure(client: &kube::Client, name: &str, ways: &[Way]) -> Vec<(f64, f64, f64)> {
    let profile = Profile::metal_operator();
    let server = profile.kind("Server").unwrap();
    let servers = restatus::k8s::api_for(client, server, None);
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let mut sets = Vec::new();
    for (i, way) in ways.iter().enumerate() {
        let set = set(client, &format!("{name}-{i}")).await;
        write(server, &servers, &events, &set, 0..OBJECTS, way.before).await;
        sets.push(set);
    }
    let mut totals = vec![(Duration::ZERO, 0.0, 0.0); ways.len()];
    for chunk in (0..OBJECTS).step_by(CHUNK) {
        for ((way, set), total) in ways.iter().zip(&sets).zip(&mut totals) {
            let (api0, etcd0) = (cpu_seconds("apiserver-target"), cpu_seconds("etcd-target"));
            let started = Instant::now();
            write(server, &servers, &events, set, chunk..chunk + CHUNK, way.timed).await;
            total.0 += started.elapsed();
            total.1 += cpu_seconds("apiserver-target") - api0;
            total.2 += cpu_seconds("etcd-target") - etcd0;
        }
    }
    let per = |x: f64| x * 1000.0 / OBJECTS as f64;
    totals.into_iter().map(|(wall, api, etcd)| (per(wall.as_secs_f64()), per(api), per(etcd))).collect()
}

#[tokio::main]
async fn main() {
    let kubeconfig = env("KUBECONFIG_TARGET");
    let client = restatus::k8s::client(Some(std::path::Path::new(&kubeconfig)), None).await.unwrap();
    let suffix = jiff::Timestamp::now().as_second();
    use Write::*;
    let way = |label, before, timed| Way { label, before, timed };
    let cases: Vec<(&str, Vec<Way>)> = vec![
        ("quiesce (object without status)", vec![way("patch", &[], &[Quiesce])]),
        (
            "status (object without status)",
            vec![way("patch", &[Quiesce], &[StatusPatch]), way("replace", &[Quiesce], &[StatusReplace])],
        ),
        (
            "release (object with status)",
            vec![
                way("patch", &[Quiesce, StatusPatch], &[ReleasePatch]),
                way("replace", &[Quiesce, StatusReplace], &[ReleaseReplace]),
            ],
        ),
        ("StatusRestored Event", vec![way("create", &[], &[Event])]),
        (
            "quiesce + status + release",
            vec![
                way("3 patches", &[], &[Quiesce, StatusPatch, ReleasePatch]),
                way("patch + 2 replaces", &[], &[Quiesce, StatusReplace, ReleaseReplace]),
            ],
        ),
        (
            "status + release (arrived quiesced)",
            vec![
                way("2 patches", &[Quiesce], &[StatusPatch, ReleasePatch]),
                way("2 replaces", &[Quiesce], &[StatusReplace, ReleaseReplace]),
            ],
        ),
    ];
    println!("API server cost per object and write ({OBJECTS} Servers a way, {CONCURRENCY} in flight), ms");
    println!("{:<58} {:>8} {:>14} {:>9}", "write", "wall", "apiserver CPU", "etcd CPU");
    for (i, (what, ways)) in cases.iter().enumerate() {
        let figures = measure(&client, &format!("w{suffix}-{i}"), ways).await;
        for (way, (wall, api, etcd)) in ways.iter().zip(figures) {
            let label = format!("{what}, {}", way.label);
            println!("{label:<58} {wall:>8.2} {api:>14.2} {etcd:>9.2}");
        }
    }
}
