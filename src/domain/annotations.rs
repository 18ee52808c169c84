//! The annotations restatus reads and writes on other people's objects, in one leaf module:
//! metal-operator's operation annotation, restatus's marks, and clusterctl's block-move.

use serde_json::Value;

/// metal-operator's annotation that makes its controllers leave an object alone.
pub const OPERATION_ANNOTATION: &str = "metal.ironcore.dev/operation";
pub const OPERATION_IGNORE: &str = "ignore";
/// Marks an `ignore` that restatus set, so that restatus never removes a user's own.
pub const QUIESCED_BY_ANNOTATION: &str = "restatus.ironcore.dev/quiesced-by";
/// Names the snapshot an object's status was restored from.
pub const RESTORED_FROM_ANNOTATION: &str = "restatus.ironcore.dev/restored-from";

/// The annotations with which restatus quiesces an object: metal-operator's `ignore`, marked
/// as restatus's so that it is never mistaken for a user's.
pub fn quiesce_annotations() -> serde_json::Map<String, Value> {
    let mut annotations = serde_json::Map::new();
    annotations.insert(OPERATION_ANNOTATION.into(), OPERATION_IGNORE.into());
    annotations.insert(QUIESCED_BY_ANNOTATION.into(), crate::TOOL_NAME.into());
    annotations
}

/// The merge-patch annotations that remove restatus's `ignore` (null deletes a key).
pub fn release_annotations() -> serde_json::Map<String, Value> {
    [OPERATION_ANNOTATION, QUIESCED_BY_ANNOTATION].into_iter().map(|k| (k.to_string(), Value::Null)).collect()
}

/// clusterctl waits while any moved object carries it (the move handshake sets it on Clusters).
pub const BLOCK_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/block-move";
/// Cluster API's mark of a paused Cluster (besides `spec.paused`).
pub const CAPI_PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
