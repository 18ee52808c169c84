//! The pure domain: no I/O, no clients. Everything here is unit-tested without an API server.
//!
//! * [`object`]: a raw object as the API server sent it, read without parsing `status`;
//! * [`identity`]: profiles, kinds and the UID-independent keys of their objects;
//! * [`annotations`]: the annotations restatus reads and writes on other people's objects;
//! * [`pairing`]: metal-operator's claim/server invariant;
//! * [`capture`]: which objects become records and whether a capture is consistent;
//! * [`live`]: what restatus knows of a live object on the target.

pub mod annotations;
pub mod capture;
pub mod identity;
pub mod live;
pub mod object;
pub mod pairing;
