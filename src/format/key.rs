//! Identity keys as a snapshot carries them: `field=value`, UID-independent, and their 64-bit
//! digests for compact indexes. Which fields form a kind's keys is the profile's business
//! ([`crate::domain::identity`]); the format only carries and compares them.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct IdentityKey {
    /// The field the value came from, e.g. `spec.systemUUID` or `namespace/name`.
    pub field: String,
    pub value: String,
}

/// A 64-bit digest of a kind and one of its keys, for compact indexes of many objects. Equal
/// keys of one kind have equal digests, so a lookup by digest finds every candidate; a
/// candidate is confirmed by comparing the keys themselves, so a collision never pairs two
/// objects.
pub type KeyDigest = u64;

impl IdentityKey {
    pub fn digest(&self, kind: &str) -> KeyDigest {
        Self::digest_of(kind, &self.field, &self.value)
    }

    /// The digest of the key `field=value` of `kind`, without making the key.
    pub fn digest_of(kind: &str, field: &str, value: &str) -> KeyDigest {
        digest((kind, field, value))
    }
}

/// A 64-bit digest of a value, for compact indexes (keys, names, uids): SipHash with fixed
/// keys, so the same value has the same digest within and across runs.
pub fn digest(value: impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut hasher = std::hash::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

impl fmt::Display for IdentityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.field, self.value)
    }
}
