//! Listing, the Kubernetes edge every flow reads through: a kind page by page, objects left
//! as raw JSON text so that one page at a time is in memory and nothing is parsed twice.

use kube::api::ListParams;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::domain::identity::KindProfile;
use crate::domain::object::RawObject;
use tracing::warn;

use crate::{Error, Result};

/// Objects per LIST page unless a flag says otherwise.
pub const DEFAULT_PAGE_SIZE: u32 = 500;

/// One page of a LIST response, items left raw. With [`fetch_page`], the bare LIST that the
/// [`Pager`] is made of (and that benchmarks measure the flows against).
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

fn invalid_item(kind: &KindProfile, e: serde_json::Error) -> Error {
    Error::InvalidObject { kind: kind.qualified_kind(), name: "(list item)".into(), reason: e.to_string() }
}

/// Lists every object of `kind` page by page (through a [`Pager`]) and hands each to `visit`,
/// parsed as a [`RawObject`]. Returns false when the API server does not serve the kind.
pub async fn list_objects(
    client: &kube::Client,
    kind: &KindProfile,
    page: &PageRequest<'_>,
    mut visit: impl FnMut(&RawObject<'_>) -> Result<()>,
) -> Result<bool> {
    let mut pager = Pager::new(client, kind, page);
    while let Some(page) = pager.next().await? {
        for object in pager.objects(&page) {
            visit(&object?)?;
        }
    }
    Ok(pager.served())
}

/// Listings started again after their continue token expired, at most, per [`Pager`]; and
/// expired tokens in a row (no page in between) a listing resumes from with the token the API
/// server offers.
pub const LIST_RESTARTS: usize = 3;

/// The one way restatus pages through a kind. The next page is requested as soon as a page
/// arrives, so the API server prepares it while the caller works on this one. A listing that
/// outlives its continue token (410 Gone: the API server compacted its storage; a long
/// listing at scale, or one slowed down by the caller's writes) goes on from where it was with
/// the continue token the 410 carries (the rest of the listing at the current revision, as
/// client-go offers it), or, without one, starts again from the first page, at most
/// [`LIST_RESTARTS`] times; either way it hands out only the objects it has not handed out yet
/// (by uid): each object once, however long the listing takes.
pub struct Pager {
    client: kube::Client,
    kind: KindProfile,
    size: u32,
    selector: Option<String>,
    namespace: Option<String>,
    /// The page being fetched, if any.
    next: Option<tokio::task::JoinHandle<Result<Option<String>>>>,
    served: bool,
    restarts: usize,
    /// Expired tokens since the last page that arrived.
    expired_in_a_row: usize,
    handed: Handed,
}

/// One page of a [`Pager`]: the response as the API server sent it, and where its items are.
/// Its objects come out of [`Pager::objects`].
pub struct Page {
    body: String,
    items: Vec<std::ops::Range<usize>>,
}

impl Page {
    /// Objects on this page (some may have been handed out before a restart).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// The uids (their digests) a pager has handed out: appended as they go, and sorted for lookup
/// when a listing starts again. 8 bytes an object, nothing is looked up until a restart.
#[derive(Default)]
struct Handed {
    before_restart: Vec<u64>,
    since_restart: Vec<u64>,
}

impl Handed {
    /// Records `uid`; false when it was handed out before the last restart.
    fn first_time(&mut self, uid: Option<&str>) -> bool {
        let Some(uid) = uid else { return true };
        let digest = crate::format::digest(uid);
        if self.before_restart.binary_search(&digest).is_ok() {
            return false;
        }
        self.since_restart.push(digest);
        true
    }

    fn restart(&mut self) {
        self.before_restart.append(&mut self.since_restart);
        self.before_restart.sort_unstable();
        self.before_restart.dedup();
    }

    fn len(&self) -> usize {
        self.before_restart.len() + self.since_restart.len()
    }
}

impl Pager {
    /// Starts listing `kind`: its first page is requested at once.
    pub fn new(client: &kube::Client, kind: &KindProfile, page: &PageRequest<'_>) -> Self {
        let mut pager = Pager {
            client: client.clone(),
            kind: kind.clone(),
            size: page.size,
            selector: page.selector.map(str::to_string),
            namespace: page.namespace.map(str::to_string),
            next: None,
            served: true,
            restarts: 0,
            expired_in_a_row: 0,
            handed: Handed::default(),
        };
        pager.fetch(None);
        pager
    }

    /// Whether the API server serves the kind; known once [`Pager::next`] returned `None`.
    pub fn served(&self) -> bool {
        self.served
    }

    /// The next page, `None` once the listing is complete (or the kind is not served).
    pub async fn next(&mut self) -> Result<Option<Page>> {
        loop {
            let Some(fetch) = self.next.take() else { return Ok(None) };
            let fetched = fetch.await.map_err(|e| Error::io("LIST task", std::io::Error::other(e)))?;
            let body = match fetched {
                Ok(Some(body)) => body,
                Ok(None) => {
                    self.served = false;
                    return Ok(None);
                }
                Err(e) if e.is_expired_list() && self.expired_in_a_row < LIST_RESTARTS => {
                    self.expired_in_a_row += 1;
                    self.handed.restart();
                    if let Some(token) = e.expired_list_continue() {
                        warn!(kind = %self.kind.qualified_kind(), handed = self.handed.len(),
                            "listing outlived its continue token; going on from where it was with the token the API server offered (what changed meanwhile is listed as it is now)");
                        self.fetch(Some(token.to_string()));
                        continue;
                    }
                    if self.restarts < LIST_RESTARTS {
                        warn!(kind = %self.kind.qualified_kind(), error = %e, handed = self.handed.len(),
                            "listing outlived its continue token; listing again past the objects already handed out");
                        self.restarts += 1;
                        self.fetch(None);
                        continue;
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
            self.expired_in_a_row = 0;
            let (items, next) = {
                let list = ListPage::parse(&self.kind, &body)?;
                let start = body.as_ptr() as usize;
                let items = list
                    .items
                    .iter()
                    .map(|item| {
                        let at = item.get().as_ptr() as usize - start;
                        at..at + item.get().len()
                    })
                    .collect();
                (items, list.next().map(str::to_string))
            };
            if let Some(token) = next {
                self.fetch(Some(token));
            }
            return Ok(Some(Page { body, items }));
        }
    }

    /// The objects of `page` this pager has not handed out before, parsed.
    pub fn objects<'p>(&'p mut self, page: &'p Page) -> impl Iterator<Item = Result<RawObject<'p>>> + 'p {
        let kind = &self.kind;
        let handed = &mut self.handed;
        page.items
            .iter()
            .map(move |range| RawObject::parse(&page.body[range.clone()]).map_err(|e| invalid_item(kind, e)))
            .filter(move |object| match object {
                Ok(object) => handed.first_time(object.meta.uid.as_deref()),
                Err(_) => true,
            })
    }

    fn fetch(&mut self, token: Option<String>) {
        let (client, kind) = (self.client.clone(), self.kind.clone());
        let (size, selector, namespace) = (self.size, self.selector.clone(), self.namespace.clone());
        self.next = Some(tokio::spawn(async move {
            let page = PageRequest { size, selector: selector.as_deref(), namespace: namespace.as_deref() };
            fetch_page(&client, &kind, &page, token.as_deref()).await
        }));
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        if let Some(fetch) = self.next.take() {
            fetch.abort();
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

    use crate::fixtures::api::{self, answer, expired, list_with_an_expired_token, server_page};
    use http::StatusCode;
    use serde_json::{Value, json};

    fn servers() -> KindProfile {
        Profile::metal_operator().kind("Server").unwrap().clone()
    }

    /// Every object the pager hands out, by name, in order.
    async fn names(pager: &mut Pager) -> Result<Vec<String>> {
        let mut names = vec![];
        while let Some(page) = pager.next().await? {
            for object in pager.objects(&page) {
                names.push(object?.meta.name.to_string());
            }
        }
        Ok(names)
    }

    #[tokio::test]
    async fn a_listing_that_outlives_its_continue_token_hands_out_each_object_once() {
        let (client, handle) = api::client();
        let server = tokio::spawn(async move {
            let mut api = handle;
            list_with_an_expired_token(&mut api, None).await
        });
        let mut pager = Pager::new(&client, &servers(), &PageRequest { size: 2, ..Default::default() });
        assert_eq!(names(&mut pager).await.unwrap(), ["a", "b", "c"]);
        assert!(pager.served());
        server.await.unwrap();
    }

    /// A 410 that carries a continue token (the API server's offer to go on at its current
    /// revision): the listing goes on with it, not from the first page, and hands out each
    /// object once.
    #[tokio::test]
    async fn a_listing_goes_on_with_the_token_an_expiry_offers() {
        let (client, mut api) = api::client();
        let server = tokio::spawn(async move {
            answer(&mut api, StatusCode::OK, server_page(&["a", "b"], "t1", None)).await;
            let mut gone: Value = serde_json::from_str(&expired()).unwrap();
            gone["metadata"] = json!({"continue": "t-now"});
            answer(&mut api, StatusCode::GONE, gone.to_string()).await;
            let (request, send) = api.next_request().await.expect("a request");
            let query = request.uri().query().unwrap_or_default().to_string();
            let page = server_page(&["b", "c"], "", None);
            send.send_response(http::Response::builder().body(kube::client::Body::from(page.into_bytes())).unwrap());
            query
        });
        let mut pager = Pager::new(&client, &servers(), &PageRequest { size: 2, ..Default::default() });
        assert_eq!(names(&mut pager).await.unwrap(), ["a", "b", "c"]);
        let query = server.await.unwrap();
        assert!(query.contains("continue=t-now"), "resumed with the offered token: {query}");
    }

    #[tokio::test]
    async fn a_listing_whose_token_keeps_expiring_gives_up_after_its_restarts() {
        let (client, mut api) = api::client();
        let server = tokio::spawn(async move {
            for _ in 0..=LIST_RESTARTS {
                answer(&mut api, StatusCode::OK, server_page(&["a"], "t", None)).await;
                answer(&mut api, StatusCode::GONE, expired()).await;
            }
            // Nothing more is asked: the pager gave up (a request would wait here forever).
            api
        });
        let mut pager = Pager::new(&client, &servers(), &PageRequest { size: 1, ..Default::default() });
        let err = names(&mut pager).await.unwrap_err();
        assert!(err.is_expired_list(), "{err}");
        let mut api = server.await.unwrap();
        drop(pager);
        drop(client);
        assert!(api.next_request().await.is_none(), "no request after giving up");
    }

    #[tokio::test]
    async fn a_kind_the_api_server_does_not_serve_is_an_empty_listing_marked_not_served() {
        let (client, mut api) = api::client();
        let server = tokio::spawn(async move {
            let not_found = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
            answer(&mut api, StatusCode::NOT_FOUND, not_found.into()).await;
        });
        let mut pager = Pager::new(&client, &servers(), &PageRequest { size: 2, ..Default::default() });
        assert!(names(&mut pager).await.unwrap().is_empty());
        assert!(!pager.served());
        server.await.unwrap();
    }

    #[tokio::test]
    async fn the_next_page_is_requested_before_the_caller_asks_for_it() {
        let (client, mut api) = api::client();
        let (asked, mut told) = tokio::sync::mpsc::unbounded_channel();
        let server = tokio::spawn(async move {
            answer(&mut api, StatusCode::OK, server_page(&["a"], "t1", None)).await;
            // The second request arrives while the caller still holds the first page.
            let (_, path, _) = answer(&mut api, StatusCode::OK, server_page(&["b"], "", None)).await;
            asked.send(path).unwrap();
        });
        let mut pager = Pager::new(&client, &servers(), &PageRequest { size: 1, ..Default::default() });
        let first = pager.next().await.unwrap().unwrap();
        let asked = tokio::time::timeout(std::time::Duration::from_secs(10), told.recv()).await;
        assert!(asked.is_ok_and(|p| p.is_some()), "page 2 requested while page 1 is held");
        assert_eq!(first.len(), 1);
        drop(first);
        assert_eq!(names(&mut pager).await.unwrap(), ["b"]);
        server.await.unwrap();
    }
}
