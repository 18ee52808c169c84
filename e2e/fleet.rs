//! The scale bench's bulk loader (`restatus-fleet --etcd`): Servers written straight into the
//! source's etcd are what the API server would have stored, so it lists them page by page with
//! their status, and takes status and spec writes on them.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::{ListParams, Patch, PatchParams};
use restatus::domain::identity::Profile;
use restatus::fleet::etcd::{EtcdTarget, load_servers, wait_listed};
use restatus::fleet::{self, FLEET_LABEL, FleetSpec};
use serde_json::{Value, json};

use crate::bed::{Bed, unique};

/// Every path of keys in `value` (list items by their first element).
fn shape(value: &Value, path: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let p = format!("{path}/{k}");
                out.insert(p.clone());
                shape(v, &p, out);
            }
        }
        Value::Array(items) => {
            if let Some(first) = items.first() {
                shape(first, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn servers_loaded_into_etcd_are_listed_and_written_through_the_api() {
    let bed = Bed::get();
    let client = bed.source().await;
    let url = std::env::var("RESTATUS_ETCD_SOURCE").expect("RESTATUS_ETCD_SOURCE: run scripts/testbed up again");
    let etcd = EtcdTarget { url, prefix: "/registry".into(), managed_fields: true, one_per_revision: false };
    let spec = FleetSpec::new(&unique("etcd"), 300, 0, 0);
    let loaded = load_servers(&etcd, &spec, 4).await.expect("load into etcd");
    assert_eq!((loaded.written, loaded.existing), (300, 0));
    let again = load_servers(&etcd, &spec, 4).await.expect("load again");
    assert_eq!((again.written, again.existing), (0, 300), "a second load leaves them");
    // The API server learns of them from its watch of etcd, a moment later.
    wait_listed(&client, &spec, Duration::from_secs(60)).await.expect("the API server lists all 300");

    // A paginated LIST returns every one, with the fleet's spec and status.
    let profile = Profile::metal_operator();
    let api = restatus::k8s::api_for(&client, profile.kind("Server").unwrap(), None);
    let mut params = ListParams::default().labels(&format!("{FLEET_LABEL}={}", spec.name)).limit(70);
    let mut listed = Vec::new();
    loop {
        let page = api.list(&params).await.expect("list a page");
        listed.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    assert_eq!(listed.len(), 300);
    for server in &listed {
        let name = server.metadata.name.clone().unwrap();
        let i: usize = name.rsplit('-').next().unwrap().parse().unwrap();
        let (object, status) = spec.server(i);
        assert_eq!(server.data["status"], status, "{name}");
        assert_eq!(server.data["spec"]["systemUUID"], object["spec"]["systemUUID"], "{name}");
        assert!(server.metadata.uid.is_some() && server.metadata.creation_timestamp.is_some());
    }

    // The same shape as a Server created through the API (managedFields aside: their manager).
    let twin = FleetSpec::new(&unique("api"), 1, 0, 0);
    fleet::create(&client, &twin, 1).await.unwrap();
    let through_api = api.get(&twin.server_name(0)).await.unwrap();
    let through_etcd = api.get(&spec.server_name(0)).await.unwrap();
    let (mut a, mut b) = (BTreeSet::new(), BTreeSet::new());
    shape(&serde_json::to_value(&through_api).unwrap(), "", &mut a);
    shape(&serde_json::to_value(&through_etcd).unwrap(), "", &mut b);
    assert_eq!(a, b);

    // Status and spec writes through the API.
    let name = spec.server_name(7);
    let patched = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({"status": {"state": "Maintenance"}})))
        .await
        .expect("status patch");
    assert_eq!(patched.data["status"]["state"], "Maintenance");
    assert_eq!(patched.data["status"]["networkInterfaces"], spec.server(7).1["networkInterfaces"]);
    let patched = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"power": "On"}})))
        .await
        .expect("spec patch");
    assert_eq!((patched.data["spec"]["power"].as_str(), patched.metadata.generation), (Some("On"), Some(2)));
}
