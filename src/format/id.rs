use std::fmt;
use std::str::FromStr;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::Error;

/// A snapshot id: `YYYYMMDDTHHMMSS.mmmZ-xxxxxx`, the capture start in UTC to the millisecond
/// and six random hex digits. Ids sort by time as strings, so object-store listings come back
/// in snapshot order, also for two snapshots taken within one second.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SnapshotId(String);

impl SnapshotId {
    pub fn new(at: Timestamp) -> Self {
        let suffix: u32 = rand::random::<u32>() & 0x00ff_ffff;
        SnapshotId(format!("{}-{suffix:06x}", at.strftime("%Y%m%dT%H%M%S%.3fZ")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The capture time encoded in the id (millisecond precision).
    pub fn timestamp(&self) -> Option<Timestamp> {
        let stamp = self.0.get(..20)?;
        jiff::civil::DateTime::strptime("%Y%m%dT%H%M%S%.fZ", stamp)
            .ok()?
            .to_zoned(jiff::tz::TimeZone::UTC)
            .ok()
            .map(|z| z.timestamp())
    }
}

impl FromStr for SnapshotId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let b = s.as_bytes();
        let valid = s.len() == 27
            && b[8] == b'T'
            && b[15] == b'.'
            && b[19] == b'Z'
            && b[20] == b'-'
            && b[..8].iter().chain(&b[9..15]).chain(&b[16..19]).all(u8::is_ascii_digit)
            && b[21..].iter().all(u8::is_ascii_hexdigit);
        let id = SnapshotId(s.to_string());
        if valid && id.timestamp().is_some() { Ok(id) } else { Err(Error::InvalidSnapshotId(s.into())) }
    }
}

impl TryFrom<String> for SnapshotId {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        s.parse()
    }
}

impl From<SnapshotId> for String {
    fn from(id: SnapshotId) -> String {
        id.0
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_round_trips_and_sorts_by_time() {
        let early: Timestamp = "2026-11-30T09:00:00Z".parse().unwrap();
        let late: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        let a = SnapshotId::new(early);
        let b = SnapshotId::new(late);
        assert!(a < b);
        assert_eq!(a.as_str().parse::<SnapshotId>().unwrap(), a);
        assert_eq!(a.timestamp(), Some(early));
        assert!(a.as_str().starts_with("20261130T090000.000Z-"), "{a}");
        // Within one second, order still follows time, whatever the random suffix.
        for _ in 0..50 {
            let first = SnapshotId::new("2026-11-30T09:00:00.100Z".parse().unwrap());
            let second = SnapshotId::new("2026-11-30T09:00:00.101Z".parse().unwrap());
            assert!(first < second);
            assert_eq!(second.timestamp(), Some("2026-11-30T09:00:00.101Z".parse().unwrap()));
        }
    }

    #[test]
    fn rejects_malformed_ids() {
        for bad in [
            "",
            "latest",
            "20261130T090000.000Z",
            "20261130T090000.000Z-zzzzzz",
            "../../etc/passwd",
            "20261399T090000.000Z-000000",
            "20261130T090000Z-000000",
        ] {
            assert!(bad.parse::<SnapshotId>().is_err(), "{bad} accepted");
        }
    }
}
