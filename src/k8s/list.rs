//! Listing, the Kubernetes edge every flow reads through: a kind page by page, objects left
//! as raw JSON text so that one page at a time is in memory and nothing is parsed twice.

use kube::api::ListParams;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::domain::identity::KindProfile;
use crate::domain::object::RawObject;
use crate::{Error, Result};

/// Objects per LIST page unless a flag says otherwise.
pub const DEFAULT_PAGE_SIZE: u32 = 500;

/// One page of a LIST response, items left raw.
#[derive(Deserialize)]
pub struct ListPage<'a> {
    #[serde(default)]
    pub metadata: ListMeta,
    #[serde(borrow, default)]
    pub items: Vec<&'a RawValue>,
}

#[derive(Deserialize, Default)]
pub struct ListMeta {
    #[serde(rename = "continue", default)]
    pub continue_token: Option<String>,
    #[serde(rename = "resourceVersion", default)]
    pub resource_version: Option<String>,
}

impl<'a> ListPage<'a> {
    pub fn parse(kind: &KindProfile, body: &'a str) -> Result<Self> {
        serde_json::from_str(body).map_err(|e| Error::InvalidObject {
            kind: kind.qualified_kind(),
            name: "(list)".into(),
            reason: format!("LIST response is not a list: {e}"),
        })
    }

    pub fn next(&self) -> Option<&str> {
        self.metadata.continue_token.as_deref().filter(|t| !t.is_empty())
    }
}

/// How to page through a kind: page size, an optional label selector, and optionally one
/// namespace (default: all namespaces).
#[derive(Debug, Clone, Copy, Default)]
pub struct PageRequest<'a> {
    pub size: u32,
    pub selector: Option<&'a str>,
    pub namespace: Option<&'a str>,
}

/// Fetches one page of `kind` across all namespaces, continuing after `continue_token`.
/// `None` when the API server does not serve the kind (no CRD): reported, not an error.
pub async fn fetch_page(
    client: &kube::Client,
    kind: &KindProfile,
    page: &PageRequest<'_>,
    continue_token: Option<&str>,
) -> Result<Option<String>> {
    let context = || format!("list {}", kind.qualified_kind());
    let mut params = ListParams::default().limit(page.size);
    if let Some(selector) = page.selector {
        params = params.labels(selector);
    }
    if let Some(token) = continue_token {
        params = params.continue_token(token);
    }
    let request = kube::core::Request::new(kind.list_path_in(page.namespace))
        .list(&params)
        .map_err(|e| Error::kube(context(), kube::Error::BuildRequest(e)))?;
    match client.request_text(request).await {
        Ok(body) => Ok(Some(body)),
        Err(kube::Error::Api(status)) if status.is_not_found() && continue_token.is_none() => Ok(None),
        Err(e) => Err(Error::kube(context(), e)),
    }
}

/// One item of a LIST response as a [`RawObject`], or an error naming its kind.
pub fn parse_item<'a>(kind: &KindProfile, item: &'a RawValue) -> Result<RawObject<'a>> {
    RawObject::parse(item.get()).map_err(|e| Error::InvalidObject {
        kind: kind.qualified_kind(),
        name: "(list item)".into(),
        reason: e.to_string(),
    })
}

/// Lists every object of `kind` page by page and hands each to `visit`, parsed as a
/// [`RawObject`]. Returns false when the API server does not serve the kind.
pub async fn list_objects(
    client: &kube::Client,
    kind: &KindProfile,
    page: &PageRequest<'_>,
    mut visit: impl FnMut(&RawObject<'_>) -> Result<()>,
) -> Result<bool> {
    let mut token: Option<String> = None;
    loop {
        let Some(body) = fetch_page(client, kind, page, token.as_deref()).await? else { return Ok(false) };
        let list = ListPage::parse(kind, &body)?;
        for item in &list.items {
            visit(&parse_item(kind, item)?)?;
        }
        match list.next() {
            Some(next) => token = Some(next.to_string()),
            None => return Ok(true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::identity::Profile;

    #[test]
    fn list_page_exposes_items_and_continue_token() {
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let body =
            r#"{"kind":"ServerList","metadata":{"continue":"abc","resourceVersion":"9"},"items":[{"a":1},{"b":2}]}"#;
        let page = ListPage::parse(kind, body).unwrap();
        assert_eq!(page.items.len(), 2);
        assert_eq!(page.next(), Some("abc"));
        let last = ListPage::parse(kind, r#"{"metadata":{"continue":""},"items":[]}"#).unwrap();
        assert_eq!(last.next(), None);
        let err = ListPage::parse(kind, "<html>").err().unwrap().to_string();
        assert!(err.contains("Server.metal.ironcore.dev") && err.contains("not a list"), "{err}");
    }
}
