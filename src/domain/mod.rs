//! The pure domain: no I/O, no clients. Everything here is unit-tested without an API server.
//!
//! * [`object`]: a raw object as the API server sent it, read without parsing `status`;
//! * [`identity`]: profiles, kinds and the UID-independent keys of their objects;
//! * [`annotations`]: the annotations restatus reads and writes on other people's objects;
//! * [`pairing`]: metal-operator's claim/server invariant;
//! * [`capture`]: which objects become records and whether a capture is consistent;
//! * [`live`]: what restatus knows of a live object on the target;
//! * [`status`]: a status as JSON, compared per top-level field and merge-patched;
//! * [`compare`]: two snapshots compared object by object (`snapshots diff`).

pub mod annotations;
pub mod capture;
pub mod compare;
pub mod identity;
pub mod live;
pub mod object;
pub mod pairing;
pub mod status;
