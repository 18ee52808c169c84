//! The annotations restatus reads and writes on other people's objects, in one leaf module:
//! metal-operator's operation annotation, restatus's marks, and clusterctl's block-move.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// metal-operator's one annotation for requests to its controllers (v0.7.0: `ignore`,
/// `ignore-child`, `ignore-child-and-self`, `ignore-propagated`, `retry`, `retry-propagated`,
/// `park`, `unpark`, `rotate-credentials`, power resets, ...).
pub const OPERATION_ANNOTATION: &str = "metal.ironcore.dev/operation";
pub const OPERATION_IGNORE: &str = "ignore";
/// The values with which metal-operator leaves the object itself alone (its
/// `shouldIgnoreReconciliation`): restatus counts them as quiesced and never removes them.
pub const QUIESCING_OPERATIONS: &[&str] = &["ignore", "ignore-child-and-self", "ignore-propagated"];
/// Marks an `ignore` that restatus set, so that restatus never removes a user's own.
pub const QUIESCED_BY_ANNOTATION: &str = "restatus.ironcore.dev/quiesced-by";
/// The operation an object carried when restatus quiesced it (a pending `park`, `retry`, a
/// power reset, ...): put back exactly on release.
pub const OPERATION_WAS_ANNOTATION: &str = "restatus.ironcore.dev/operation-was";
/// Names the snapshot an object's status was restored from.
pub const RESTORED_FROM_ANNOTATION: &str = "restatus.ironcore.dev/restored-from";
/// Names the snapshot whose status for the object the target did not take whole (its schema
/// refused it, or pruned fields of it): the object was released, and is not written again
/// from that snapshot.
pub const NOT_RESTORED_ANNOTATION: &str = "restatus.ironcore.dev/not-restored-from";

/// Whether metal-operator leaves an object with these annotations alone.
pub fn is_quiesced(annotations: &BTreeMap<String, String>) -> bool {
    annotations.get(OPERATION_ANNOTATION).is_some_and(|v| QUIESCING_OPERATIONS.contains(&v.as_str()))
}

/// Whether the quiescing `ignore` on an object is restatus's own (and restatus may remove it).
pub fn quiesced_by_restatus(annotations: &BTreeMap<String, String>) -> bool {
    is_quiesced(annotations) && annotations.contains_key(QUIESCED_BY_ANNOTATION)
}

/// Whether restatus holds the object for a person: it restored its status (`restored-from`) and
/// kept its `ignore` (the object waits for a partner, or its status cannot be trusted, e.g. a
/// Server bound after the snapshot). Only a restore, a person or an explicit flag ends a hold.
pub fn held_by_restatus(annotations: &BTreeMap<String, String>) -> bool {
    quiesced_by_restatus(annotations) && annotations.contains_key(RESTORED_FROM_ANNOTATION)
}

/// The merge-patch annotations with which restatus quiesces an object that `annotations`
/// describe: metal-operator's `ignore`, marked as restatus's so that it is never mistaken for
/// a user's, and any other operation value the object carried, kept for the release (or none:
/// a stale `operation-was` is removed, so that the release puts back exactly what was there;
/// the admission policies allow nothing else).
pub fn quiesce_annotations(annotations: &BTreeMap<String, String>) -> Map<String, Value> {
    let mut changes = Map::new();
    changes.insert(OPERATION_ANNOTATION.into(), OPERATION_IGNORE.into());
    changes.insert(QUIESCED_BY_ANNOTATION.into(), crate::TOOL_NAME.into());
    let pending = annotations.get(OPERATION_ANNOTATION).map_or(Value::Null, |p| p.clone().into());
    if !pending.is_null() || annotations.contains_key(OPERATION_WAS_ANNOTATION) {
        changes.insert(OPERATION_WAS_ANNOTATION.into(), pending);
    }
    changes
}

/// The merge-patch annotations that remove restatus's `ignore` from an object that
/// `annotations` describe (null deletes a key), putting back the operation it replaced. When
/// the operation is no longer restatus's `ignore` (a person set `park`, or removed it), it is
/// left as it is and only restatus's marks go: restatus never overwrites what someone else set.
pub fn release_annotations(annotations: &BTreeMap<String, String>) -> Map<String, Value> {
    let mut changes = Map::new();
    if annotations.get(OPERATION_ANNOTATION).is_some_and(|v| v == OPERATION_IGNORE) {
        let operation = annotations.get(OPERATION_WAS_ANNOTATION).map_or(Value::Null, |v| v.clone().into());
        changes.insert(OPERATION_ANNOTATION.into(), operation);
    }
    changes.insert(QUIESCED_BY_ANNOTATION.into(), Value::Null);
    changes.insert(OPERATION_WAS_ANNOTATION.into(), Value::Null);
    changes
}

/// clusterctl waits while any moved object carries it (the move handshake sets it on Clusters).
pub const BLOCK_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/block-move";
/// On a Cluster whose move restatus let go: the final snapshot taken for it. It carries the
/// move handshake's phase across a change of leader.
pub const FINAL_SNAPSHOT_ANNOTATION: &str = "restatus.ironcore.dev/final-snapshot";
/// On a paused Cluster whose move restatus holds because `clusterctl move` would leave objects
/// of the profile behind: why, and the label commands that fix it. Removed when the Clusters
/// are unpaused (the move aborted).
pub const MOVE_BLOCKED_ANNOTATION: &str = "restatus.ironcore.dev/move-blocked";
/// Cluster API's mark of a paused Cluster (besides `spec.paused`).
pub const CAPI_PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_operators_own_ignore_values_count_as_quiesced() {
        for value in QUIESCING_OPERATIONS {
            assert!(is_quiesced(&annotations(&[(OPERATION_ANNOTATION, value)])), "{value}");
        }
        for value in ["ignore-child", "retry", "park", "unpark", "rotate-credentials", "ForceOff"] {
            assert!(!is_quiesced(&annotations(&[(OPERATION_ANNOTATION, value)])), "{value}");
        }
        let users = annotations(&[(OPERATION_ANNOTATION, "ignore-child-and-self")]);
        assert!(!quiesced_by_restatus(&users), "a user's ignore is never restatus's");
    }

    #[test]
    fn a_pending_operation_is_kept_across_quiesce_and_release() {
        let parked = annotations(&[(OPERATION_ANNOTATION, "park")]);
        let quiesce = Value::Object(quiesce_annotations(&parked));
        assert_eq!(
            quiesce,
            json!({OPERATION_ANNOTATION: "ignore", QUIESCED_BY_ANNOTATION: "restatus", OPERATION_WAS_ANNOTATION: "park"})
        );
        let quiesced = annotations(&[
            (OPERATION_ANNOTATION, "ignore"),
            (QUIESCED_BY_ANNOTATION, "restatus"),
            (OPERATION_WAS_ANNOTATION, "park"),
        ]);
        let release = Value::Object(release_annotations(&quiesced));
        assert_eq!(
            release,
            json!({OPERATION_ANNOTATION: "park", QUIESCED_BY_ANNOTATION: null, OPERATION_WAS_ANNOTATION: null})
        );
    }

    #[test]
    fn an_object_without_an_operation_is_released_bare() {
        assert_eq!(
            Value::Object(quiesce_annotations(&BTreeMap::new())),
            json!({OPERATION_ANNOTATION: "ignore", QUIESCED_BY_ANNOTATION: "restatus"})
        );
        let ours = annotations(&[(OPERATION_ANNOTATION, "ignore"), (QUIESCED_BY_ANNOTATION, "restatus")]);
        assert_eq!(
            Value::Object(release_annotations(&ours)),
            json!({OPERATION_ANNOTATION: null, QUIESCED_BY_ANNOTATION: null, OPERATION_WAS_ANNOTATION: null})
        );
    }

    #[test]
    fn an_operation_someone_set_after_the_quiesce_is_left_on_release() {
        for (now, what) in [(Some("park"), "a park"), (Some("ForceReset"), "a reset"), (None, "no operation")] {
            let mut seen = annotations(&[(QUIESCED_BY_ANNOTATION, "restatus"), (OPERATION_WAS_ANNOTATION, "retry")]);
            if let Some(now) = now {
                seen.insert(OPERATION_ANNOTATION.into(), now.into());
            }
            assert_eq!(
                Value::Object(release_annotations(&seen)),
                json!({QUIESCED_BY_ANNOTATION: null, OPERATION_WAS_ANNOTATION: null}),
                "{what} set by a person stays as it is; only restatus's marks go"
            );
        }
    }

    #[test]
    fn a_stale_operation_was_is_cleared_by_the_quiesce() {
        let stale = annotations(&[(OPERATION_WAS_ANNOTATION, "ForceReset")]);
        assert_eq!(
            Value::Object(quiesce_annotations(&stale)),
            json!({OPERATION_ANNOTATION: "ignore", QUIESCED_BY_ANNOTATION: "restatus", OPERATION_WAS_ANNOTATION: null}),
            "the release must not put back an operation nobody had set"
        );
    }
}
