//! Sample fleets of metal-operator objects with realistic status, for the demo, the end-to-end
//! tests and the benchmarks. Objects are deterministic in their index, so tests can predict
//! every field. The model: 40 servers a rack, each with 2 CPUs, 4 drives and 4 dual-port NICs
//! (consecutive MACs per card, random device parts) cabled to the rack's two leaf switches
//! (LLDP neighbours), IPs from rack subnets; UUIDs, serials and SKUs are random per server.

use futures::{StreamExt, TryStreamExt, stream};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::domain::annotations::{OPERATION_ANNOTATION, OPERATION_IGNORE, QUIESCED_BY_ANNOTATION};
use crate::domain::identity::{KindProfile, Profile};
use crate::k8s::api_for;
use crate::{Error, Result};

pub mod etcd;

/// Label on every sample object, naming its fleet.
pub const FLEET_LABEL: &str = "restatus.ironcore.dev/sample-fleet";

#[derive(Debug, Clone)]
pub struct FleetSpec {
    /// Prefix of object names and value of [`FLEET_LABEL`].
    pub name: String,
    pub servers: usize,
    pub bmcs: usize,
    /// Claims, spread round-robin over `namespaces`; claim `i` binds server `i`.
    pub claims: usize,
    pub namespaces: Vec<String>,
    /// Set each object's status after creating it (false: objects as a move leaves them).
    pub with_status: bool,
    /// Create the objects with restatus's `ignore`, as a move after the source-role
    /// handshake leaves them.
    pub quiesced: bool,
    /// Labels added to every object besides [`FLEET_LABEL`] (e.g. clusterctl's move label).
    pub labels: Vec<(String, String)>,
}

impl FleetSpec {
    pub fn new(name: &str, servers: usize, bmcs: usize, claims: usize) -> Self {
        FleetSpec {
            name: name.into(),
            servers,
            bmcs,
            claims: claims.min(servers),
            namespaces: vec!["team-a".into(), "team-b".into()],
            with_status: true,
            quiesced: false,
            labels: Vec::new(),
        }
    }

    /// Seeds identities (UUIDs, serials, MACs) by fleet name, so two fleets on one cluster
    /// do not share keys.
    fn seed(&self) -> u64 {
        self.name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
    }

    /// Adds the fleet's extra labels and, if quiesced, restatus's `ignore` to an object.
    fn decorate(&self, object: &mut Value) {
        if self.quiesced {
            object["metadata"]["annotations"] =
                json!({OPERATION_ANNOTATION: OPERATION_IGNORE, QUIESCED_BY_ANNOTATION: crate::TOOL_NAME});
        }
        for (key, value) in &self.labels {
            object["metadata"]["labels"][key] = json!(value);
        }
    }

    pub fn total(&self) -> usize {
        self.servers + self.bmcs + self.claims
    }

    pub fn server_name(&self, i: usize) -> String {
        format!("{}-server-{i:05}", self.name)
    }

    pub fn bmc_name(&self, i: usize) -> String {
        format!("{}-bmc-{i:05}", self.name)
    }

    pub fn claim_ref(&self, i: usize) -> (String, String) {
        (self.namespaces[i % self.namespaces.len()].clone(), format!("{}-claim-{i:05}", self.name))
    }

    /// Server `i` as (object without status, status).
    pub fn server(&self, i: usize) -> (Value, Value) {
        let h = mix(i as u64 ^ 0x5e4e_0000 ^ self.seed());
        let mut spec = json!({
            "systemUUID": uuid(h),
            "bmcRef": {"name": self.bmc_name(i % self.bmcs.max(1))},
            "power": if i < self.claims { "On" } else { "Off" },
        });
        if i < self.claims {
            let (ns, name) = self.claim_ref(i);
            spec["serverClaimRef"] = json!({"namespace": ns, "name": name});
        }
        let object = json!({
            "apiVersion": "metal.ironcore.dev/v1alpha1",
            "kind": "Server",
            "metadata": {"name": self.server_name(i), "labels": {FLEET_LABEL: self.name}},
            "spec": spec,
        });
        let state = if i < self.claims { "Reserved" } else { "Available" };
        (object, server_status(i, h, self.seed(), state))
    }

    pub fn bmc(&self, i: usize) -> (Value, Value) {
        let h = mix(i as u64 ^ 0xb3c0_0000 ^ self.seed());
        let mac = vendor_mac(BMC_OUI, self.seed().wrapping_add(i as u64), 0);
        let object = json!({
            "apiVersion": "metal.ironcore.dev/v1alpha1",
            "kind": "BMC",
            "metadata": {"name": self.bmc_name(i), "labels": {FLEET_LABEL: self.name}},
            "spec": {
                "access": {"macAddress": mac, "ip": bmc_ip(i)},
                "bmcSecretRef": {"name": format!("{}-bmc-secret", self.name)},
                "protocol": {"name": "Redfish", "port": 443, "scheme": "https"},
            },
        });
        let status = json!({
            "ip": bmc_ip(i),
            "macAddress": mac,
            "manufacturer": "Dell Inc.",
            "model": "iDRAC9",
            "sku": format!("SKU-{:04}", h % 10_000),
            "serialNumber": format!("BMC{:010}", h % 10_000_000_000),
            "firmwareVersion": "7.00.00.171",
            "state": "Enabled",
            "powerState": "On",
            "lastResetTime": "2026-11-01T00:00:00Z",
            "conditions": [condition("Ready", "True", "BMCReady")],
        });
        (object, status)
    }

    pub fn claim(&self, i: usize) -> (Value, Value) {
        let (ns, name) = self.claim_ref(i);
        let object = json!({
            "apiVersion": "metal.ironcore.dev/v1alpha1",
            "kind": "ServerClaim",
            "metadata": {"name": name, "namespace": ns, "labels": {FLEET_LABEL: self.name}},
            "spec": {
                "power": "On",
                "image": "ghcr.io/ironcore-dev/os-images/gardenlinux:1877.0",
                "serverRef": {"name": self.server_name(i)},
            },
        });
        (object, json!({"phase": "Bound"}))
    }
}

/// Servers per rack: NICs connect to the rack's two leaf switches, IPs follow rack subnets.
const RACK: usize = 40;

fn server_status(i: usize, h: u64, seed: u64, state: &str) -> Value {
    let (rack, slot) = (i / RACK, i % RACK);
    // Four dual-port cards: the two ports of a card have consecutive MACs, as on real NICs.
    let nics: Vec<Value> = (0..8u64)
        .map(|n| {
            let card = seed.wrapping_add(i as u64 * 4 + n / 2);
            let leaf = rack * 2 + (n as usize % 2);
            json!({
                "name": format!("eno{}np{}", n / 2 + 1, n % 2),
                "macAddress": vendor_mac(NIC_OUI, card, n % 2),
                "ip": format!("10.{}.{}.{}", rack % 256, n, slot + 10),
                "ips": [format!("10.{}.{}.{}", rack % 256, n, slot + 10), format!("fd00:{rack:x}:{n}::{:x}", slot + 10)],
                "carrierStatus": if n < 6 { "Up" } else { "Down" },
                "neighbors": [{
                    "macAddress": vendor_mac(SWITCH_OUI, leaf as u64, 0),
                    "portID": format!("Ethernet{}", slot * 4 + (n as usize / 2) + 1),
                    "portDescription": format!("rack-{rack:03} slot-{slot:02} {}", server_label(i)),
                    "systemName": format!("leaf-{leaf:04}.dc1"),
                    "systemDescription": "SONiC Software Version: SONiC.202405 - HwSku: Accton-AS7726-32X",
                }],
            })
        })
        .collect();
    let cpus: Vec<Value> = (0..2)
        .map(|n| {
            json!({
                "id": format!("CPU.Socket.{}", n + 1),
                "type": "CPU",
                "architecture": "x86",
                "instructionSet": "x86-64",
                "manufacturer": "Intel",
                "model": "Intel(R) Xeon(R) Gold 6348 CPU @ 2.60GHz",
                "maxSpeedMHz": 4000,
                "totalCores": 28,
                "totalThreads": 56,
            })
        })
        .collect();
    let drives: Vec<Value> = (0..4u64)
        .map(|n| {
            json!({
                "name": format!("Disk.Bay.{n}:Enclosure.Internal.0-1"),
                "model": if n < 2 { "MZ7L3480HCHQ" } else { "MZQL23T8HCLS" },
                "vendor": "Samsung",
                "mediaType": "SSD",
                "type": if n < 2 { "SATA" } else { "NVMe" },
                "capacity": if n < 2 { "480103981056" } else { "3840755982336" },
                "state": "Enabled",
            })
        })
        .collect();
    json!({
        "state": state,
        "powerState": if state == "Reserved" { "On" } else { "Off" },
        "indicatorLED": "Off",
        "manufacturer": "Dell Inc.",
        "model": "PowerEdge R650",
        "sku": format!("SKU{:07}", h % 10_000_000),
        "serialNumber": format!("SRV{:08X}", h as u32),
        "biosVersion": "1.14.1",
        "totalSystemMemory": "512Gi",
        "networkInterfaces": nics,
        "processors": cpus,
        "storages": [{
            "name": "RAID.SL.3-1",
            "state": "Enabled",
            "drives": drives,
            "volumes": [{"name": "Disk.Virtual.0", "capacity": "479559942144", "raidType": "RAID1", "state": "Enabled", "volumeUsage": "Data"}],
        }],
        "conditions": [condition("Ready", "True", "ServerReady")],
    })
}

fn server_label(i: usize) -> String {
    format!("server-{i:05}")
}

fn condition(kind: &str, status: &str, reason: &str) -> Value {
    json!({"type": kind, "status": status, "reason": reason, "message": "", "lastTransitionTime": "2026-11-01T00:00:00Z"})
}

/// splitmix64: a cheap, well-spread deterministic hash.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn uuid(h: u64) -> String {
    let l = mix(h);
    format!(
        "{:08X}-{:04X}-{:04X}-{:04X}-{:012X}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xffff,
        l >> 48,
        l & 0xffff_ffff_ffff
    )
}

/// A MAC with a vendor prefix and a device part unique to `device` (< 2^23, as real vendors
/// hand out each address once): an odd multiplier permutes the space, so neighbours in the
/// fleet do not get neighbouring addresses; `port` 0 or 1 selects a port of a dual-port card.
fn vendor_mac(oui: &str, device: u64, port: u64) -> String {
    let part = ((device.wrapping_mul(0x9E37_79B1) & 0x7f_ffff) << 1) | (port & 1);
    format!("{oui}:{:02x}:{:02x}:{:02x}", (part >> 16) & 0xff, (part >> 8) & 0xff, part & 0xff)
}

const NIC_OUI: &str = "b8:ce:f6";
const BMC_OUI: &str = "d0:94:66";
const SWITCH_OUI: &str = "0c:42:a1";

/// BMCs sit in a management subnet per rack.
fn bmc_ip(i: usize) -> String {
    format!("10.250.{}.{}", (i / RACK) % 256, i % RACK + 10)
}

/// Creates the fleet on a cluster: namespaces, objects, then their status through the status
/// subresource. `concurrency` requests are in flight at once. Objects that exist already keep
/// their spec and get the fleet's status again, so creating a fleet twice is harmless.
pub async fn create(client: &kube::Client, spec: &FleetSpec, concurrency: usize) -> Result<()> {
    create_kinds(client, spec, concurrency, true).await
}

/// [`create`], the Servers only if `servers` (false: they were loaded by [`etcd::load_servers`]).
pub async fn create_kinds(client: &kube::Client, spec: &FleetSpec, concurrency: usize, servers: bool) -> Result<()> {
    let profile = Profile::metal_operator();
    for ns in &spec.namespaces {
        ensure_namespace(client, ns).await?;
    }
    let kind = |name: &str| profile.kind(name).cloned().expect("built-in kind");
    let mut work: Vec<(KindProfile, Value, Value)> = Vec::with_capacity(spec.total());
    work.extend((0..spec.bmcs).map(|i| spec.bmc(i)).map(|(o, s)| (kind("BMC"), o, s)));
    if servers {
        work.extend((0..spec.servers).map(|i| spec.server(i)).map(|(o, s)| (kind("Server"), o, s)));
    }
    work.extend((0..spec.claims).map(|i| spec.claim(i)).map(|(o, s)| (kind("ServerClaim"), o, s)));
    for (_, object, _) in &mut work {
        spec.decorate(object);
    }
    stream::iter(work)
        .map(|(kind, object, status)| create_with_status(client, kind, object, spec.with_status.then_some(status)))
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

async fn create_with_status(
    client: &kube::Client,
    kind: KindProfile,
    object: Value,
    status: Option<Value>,
) -> Result<()> {
    let namespace = object["metadata"]["namespace"].as_str().map(str::to_string);
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let api = api_for(client, &kind, namespace.as_deref());
    let context = |what: &str| format!("{what} {} {name}", kind.kind);
    let object: DynamicObject = serde_json::from_value(object).map_err(|e| Error::InvalidObject {
        kind: kind.kind.clone(),
        name: name.clone(),
        reason: e.to_string(),
    })?;
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        // Creating a fleet twice converges: the object is kept, its status set again.
        Err(kube::Error::Api(s)) if s.is_already_exists() => {}
        Err(e) => return Err(Error::kube(context("create"), e)),
    }
    if let Some(status) = status {
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({ "status": status })))
            .await
            .map_err(|e| Error::kube(context("set status of"), e))?;
    }
    Ok(())
}

async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace literal");
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
        Err(e) => Err(Error::kube(format!("create namespace {name}"), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_have_realistic_unique_inventory() {
        let spec = FleetSpec::new("t", 10, 10, 4);
        let (a, sa) = spec.server(0);
        let (b, sb) = spec.server(7);
        assert_ne!(a["spec"]["systemUUID"], b["spec"]["systemUUID"]);
        assert_eq!(sa["networkInterfaces"].as_array().unwrap().len(), 8);
        assert!(sa["networkInterfaces"][0]["neighbors"][0]["systemName"].is_string());
        assert_eq!(sa["processors"].as_array().unwrap().len(), 2);
        assert_eq!(sa["storages"][0]["drives"].as_array().unwrap().len(), 4);
        assert_eq!(sa["state"], "Reserved");
        assert_eq!(sb["state"], "Available");
        assert_eq!(a["spec"]["serverClaimRef"]["name"], spec.claim_ref(0).1);
        let (claim, phase) = spec.claim(1);
        assert_eq!(claim["metadata"]["namespace"], "team-b");
        assert_eq!(claim["spec"]["serverRef"]["name"], spec.server_name(1));
        assert_eq!(phase["phase"], "Bound");
        let macs: std::collections::HashSet<String> =
            (0..5000).map(|i| spec.bmc(i).0["spec"]["access"]["macAddress"].as_str().unwrap().to_string()).collect();
        assert_eq!(macs.len(), 5000, "BMC MACs are identity keys: unique by construction");
        let other = FleetSpec::new("u", 10, 10, 4);
        assert_ne!(
            other.server(0).0["spec"]["systemUUID"],
            a["spec"]["systemUUID"],
            "fleets have their own identities"
        );
        assert_ne!(other.bmc(0).0["spec"]["access"]["macAddress"], spec.bmc(0).0["spec"]["access"]["macAddress"]);
        let bytes = serde_json::to_vec(&sa).unwrap().len();
        assert!((4_000..12_000).contains(&bytes), "server status is {bytes} bytes");
    }
}
