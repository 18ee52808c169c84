//! What one restore write costs the API server (run by `scripts/bench`): kube-apiserver and
//! etcd CPU seconds (from /proc) and wall time per object for each kind of write restatus
//! makes, on Servers with the fleet's full inventory, 16 writes in flight. This is the cost
//! model behind the restore figures: the API server's CPU, not restatus, bounds a restore.

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use restatus::fleet::{self, FleetSpec};
use restatus::identity::Profile;
use restatus::plan::{OPERATION_ANNOTATION, OPERATION_IGNORE, QUIESCED_BY_ANNOTATION, RESTORED_FROM_ANNOTATION};
use serde_json::{Value, json};

const CONCURRENCY: usize = 16;
const OBJECTS: usize = 2000;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} unset: run scripts/bench"))
}

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
    /// Set restatus's ignore (object without status).
    Quiesce,
    /// The whole inventory through the status subresource.
    Status,
    /// Remove the ignore, set restored-from (object with status).
    Release,
    /// The StatusRestored Event.
    Event,
}

struct Set {
    spec: FleetSpec,
    statuses: Vec<Value>,
}

async fn set(client: &kube::Client, name: &str) -> Set {
    let spec = FleetSpec { with_status: false, ..FleetSpec::new(name, OBJECTS, 0, 0) };
    fleet::create(client, &spec, 48).await.unwrap();
    let statuses = (0..OBJECTS).map(|i| spec.server(i).1).collect();
    Set { spec, statuses }
}

async fn write(servers: &Api<DynamicObject>, events: &Api<Event>, set: &Set, writes: &[Write]) {
    stream::iter(0..OBJECTS)
        .map(|i| async move {
            let name = set.spec.server_name(i);
            let params = PatchParams { field_manager: Some("bench".into()), ..Default::default() };
            for w in writes {
                match w {
                    Write::Quiesce => {
                        let body = json!({"metadata": {"annotations": {OPERATION_ANNOTATION: OPERATION_IGNORE, QUIESCED_BY_ANNOTATION: "bench"}}});
                        servers.patch(&name, &params, &Patch::Merge(body)).await.map(drop)
                    }
                    Write::Status => {
                        let body = json!({"status": set.statuses[i]});
                        servers.patch_status(&name, &params, &Patch::Merge(body)).await.map(drop)
                    }
                    Write::Release => {
                        let body = json!({"metadata": {"annotations": {OPERATION_ANNOTATION: null, QUIESCED_BY_ANNOTATION: null, RESTORED_FROM_ANNOTATION: "bench"}}});
                        servers.patch(&name, &params, &Patch::Merge(body)).await.map(drop)
                    }
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
                        events.create(&PostParams::default(), &event).await.map(drop)
                    }
                }
                .unwrap();
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
}

/// Runs `before` untimed, then `timed`; returns (wall, apiserver CPU, etcd CPU) per object.
async fn measure(client: &kube::Client, name: &str, before: &[Write], timed: &[Write]) -> (f64, f64, f64) {
    let servers = fleet::api_for(client, Profile::metal_operator().kind("Server").unwrap(), None);
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let set = set(client, name).await;
    write(&servers, &events, &set, before).await;
    let (api0, etcd0) = (cpu_seconds("apiserver-target"), cpu_seconds("etcd-target"));
    let started = Instant::now();
    write(&servers, &events, &set, timed).await;
    let wall: Duration = started.elapsed();
    let (api1, etcd1) = (cpu_seconds("apiserver-target"), cpu_seconds("etcd-target"));
    let per = |x: f64| x * 1000.0 / OBJECTS as f64;
    (per(wall.as_secs_f64()), per(api1 - api0), per(etcd1 - etcd0))
}

#[tokio::main]
async fn main() {
    let kubeconfig = env("KUBECONFIG_TARGET");
    let client = restatus::kubeconfig::client(Some(std::path::Path::new(&kubeconfig)), None).await.unwrap();
    let suffix = jiff::Timestamp::now().as_second();
    use Write::*;
    let cases: [(&str, &[Write], &[Write]); 6] = [
        ("quiesce (object without status)", &[], &[Quiesce]),
        ("status (object without status)", &[Quiesce], &[Status]),
        ("release (object with status)", &[Quiesce, Status], &[Release]),
        ("Event", &[], &[Event]),
        ("quiesce + status + release", &[], &[Quiesce, Status, Release]),
        ("status + release (arrived quiesced)", &[Quiesce], &[Status, Release]),
    ];
    println!("API server cost per object and write ({OBJECTS} Servers a case, {CONCURRENCY} in flight), ms");
    println!("{:<40} {:>8} {:>14} {:>9}", "write", "wall", "apiserver CPU", "etcd CPU");
    for (i, (what, before, timed)) in cases.into_iter().enumerate() {
        let (wall, api, etcd) = measure(&client, &format!("w{suffix}-{i}"), before, timed).await;
        println!("{what:<40} {wall:>8.2} {api:>14.2} {etcd:>9.2}");
    }
}
