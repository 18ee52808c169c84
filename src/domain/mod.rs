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

/// The index of `name` in `names`, added at the end if it is not there: a few distinct
/// strings (kinds, key fields, states) held once, referred to by a small index.
pub fn intern(names: &mut Vec<String>, name: &str) -> u16 {
    let i = match names.iter().position(|n| n == name) {
        Some(i) => i,
        None => {
            names.push(name.to_string());
            names.len() - 1
        }
    };
    i as u16
}
