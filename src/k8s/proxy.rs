//! Which proxy, if any, the Kubernetes client reaches its API server through.
//!
//! A kubeconfig cluster's `proxy-url` is used as it is (as kubectl uses it: it overrides the
//! environment, and `NO_PROXY` does not apply to it). Otherwise the environment decides, by the
//! rules the S3 client (reqwest) applies to its own requests, from the same matcher: for an
//! `https://` API server `HTTPS_PROXY`, else `ALL_PROXY` (`http://`: `HTTP_PROXY`, else
//! `ALL_PROXY`), upper case before lower case, unless `NO_PROXY` covers the API server's host
//! (curl's rules: a host name and its subdomains, `.example.org`, an IP address or CIDR range,
//! `*` for every host). kube's own reading is not kept: it matches `NO_PROXY` against the
//! proxy's address instead of the API server's.
//!
//! A proxy URL may carry `user:password`: it is never put in an error or a log line, which name
//! the proxy by scheme, host and port only ([`redacted`]).

use http::Uri;

/// The proxy settings of the environment, read once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyEnv {
    pub https: Option<String>,
    pub http: Option<String>,
    pub all: Option<String>,
    pub no: Option<String>,
}

impl ProxyEnv {
    /// `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY`, each upper case before lower
    /// case; an empty value is unset.
    pub fn from_env() -> Self {
        let var = |names: [&str; 2]| {
            names.iter().find_map(|name| std::env::var(name).ok().filter(|value| !value.trim().is_empty()))
        };
        ProxyEnv {
            https: var(["HTTPS_PROXY", "https_proxy"]),
            http: var(["HTTP_PROXY", "http_proxy"]),
            all: var(["ALL_PROXY", "all_proxy"]),
            no: var(["NO_PROXY", "no_proxy"]),
        }
    }
}

/// A proxy chosen for the API server, and where it was configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy {
    /// As kube's connectors take it: `http`, `https` or `socks5`, with any `user:password`.
    pub url: Uri,
    /// `kubeconfig proxy-url`, `HTTPS_PROXY`, …
    pub source: &'static str,
}

/// The proxy the API server at `server` is reached through: `explicit` (the kubeconfig
/// cluster's `proxy-url`) if set, else what `env` says for it. `Err` names the problem with the
/// proxy redacted.
pub fn choose(server: &Uri, explicit: Option<&str>, env: &ProxyEnv) -> Result<Option<Proxy>, String> {
    if let Some(url) = explicit.filter(|url| !url.trim().is_empty()) {
        return parse(url, "kubeconfig proxy-url").map(Some);
    }
    let https = server.scheme_str() != Some("http");
    let (raw, source) = match (https, &env.https, &env.http, &env.all) {
        (true, Some(url), _, _) => (url, "HTTPS_PROXY"),
        (false, _, Some(url), _) => (url, "HTTP_PROXY"),
        (_, _, _, Some(url)) => (url, "ALL_PROXY"),
        _ => return Ok(None),
    };
    if excluded(server, env.no.as_deref()) {
        return Ok(None);
    }
    parse(raw, source).map(Some)
}

/// `NO_PROXY` covers the host of `server`: asked of the matcher reqwest (the S3 client) asks.
fn excluded(server: &Uri, no_proxy: Option<&str>) -> bool {
    let Some(no_proxy) = no_proxy else { return false };
    // Any proxy: only whether `no` lets it intercept `server` is asked.
    let matcher =
        hyper_util::client::proxy::matcher::Matcher::builder().all("http://proxy.invalid:3128").no(no_proxy).build();
    let target = match server.scheme_str() {
        Some("http") => server.clone(),
        // The matcher answers for http and https only; an API server is https.
        _ => {
            let mut parts = server.clone().into_parts();
            parts.scheme = Some(http::uri::Scheme::HTTPS);
            Uri::from_parts(parts).unwrap_or_else(|_| server.clone())
        }
    };
    matcher.intercept(&target).is_none()
}

/// A proxy URL kube can connect through: `http://` when it names no scheme (as curl and the S3
/// client read it); `socks5h://` as `socks5://` (kube's SOCKS5 connector lets the proxy resolve
/// names, which is what `socks5h` asks for); `http`, `https` or `socks5` only; no credentials in
/// a SOCKS5 URL (kube's SOCKS5 connector would not send them).
fn parse(raw: &str, source: &'static str) -> Result<Proxy, String> {
    let raw = raw.trim();
    let with_scheme = if raw.contains("://") { raw.to_string() } else { format!("http://{raw}") };
    let fail = |why: &str| Err(format!("proxy {} ({source}): {why}", redacted(&with_scheme)));
    let Ok(url) = with_scheme.parse::<Uri>() else { return fail("not a URL") };
    let Some(authority) = url.authority() else { return fail("no host") };
    if authority.host().is_empty() {
        return fail("no host");
    }
    let credentials = authority.as_str().contains('@');
    match url.scheme_str() {
        Some("http" | "https") => Ok(Proxy { url, source }),
        Some("socks5" | "socks5h") if credentials => {
            fail("a SOCKS5 proxy with a user name or password is not supported for the Kubernetes API")
        }
        Some("socks5" | "socks5h") => match format!("socks5://{authority}").parse::<Uri>() {
            Ok(url) => Ok(Proxy { url, source }),
            Err(_) => fail("not a URL"),
        },
        _ => fail("unsupported scheme; use http://, https:// or socks5://"),
    }
}

/// `scheme://host:port` of a proxy URL, without the user name, password, path or query that
/// it may carry; `(unreadable)` if it is not a URL.
pub fn redacted(raw: &str) -> String {
    let Ok(url) = raw.trim().parse::<Uri>() else { return "(unreadable)".into() };
    let Some(authority) = url.authority() else { return "(unreadable)".into() };
    let scheme = url.scheme_str().unwrap_or("http");
    match authority.port() {
        Some(port) => format!("{scheme}://{}:{port}", authority.host()),
        None => format!("{scheme}://{}", authority.host()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(https: Option<&str>, all: Option<&str>, no: Option<&str>) -> ProxyEnv {
        ProxyEnv { https: https.map(Into::into), http: None, all: all.map(Into::into), no: no.map(Into::into) }
    }

    fn chosen(server: &str, explicit: Option<&str>, env: &ProxyEnv) -> Option<String> {
        choose(&server.parse().unwrap(), explicit, env).unwrap().map(|p| format!("{} {}", p.source, p.url))
    }

    #[test]
    fn https_proxy_then_all_proxy_for_an_https_api_server() {
        let server = "https://10.0.0.1:6443";
        assert_eq!(chosen(server, None, &ProxyEnv::default()), None);
        let both = env(Some("http://proxy:3128"), Some("socks5://socks:1080"), None);
        assert_eq!(chosen(server, None, &both).as_deref(), Some("HTTPS_PROXY http://proxy:3128/"));
        let all = env(None, Some("socks5h://socks:1080"), None);
        assert_eq!(chosen(server, None, &all).as_deref(), Some("ALL_PROXY socks5://socks:1080/"));
        let http_only = ProxyEnv { http: Some("http://proxy:3128".into()), ..Default::default() };
        assert_eq!(chosen(server, None, &http_only), None, "HTTP_PROXY is for http:// servers");
        assert_eq!(chosen("http://10.0.0.1:8080", None, &http_only).as_deref(), Some("HTTP_PROXY http://proxy:3128/"));
    }

    /// `NO_PROXY` is matched against the API server, by curl's rules, never against the proxy:
    /// the usual laptop setting (a local proxy, `NO_PROXY=localhost,127.0.0.1`) still proxies
    /// a remote API server.
    #[test]
    fn no_proxy_is_matched_against_the_api_server() {
        let proxy = Some("http://127.0.0.1:3128");
        let cases = [
            ("https://10.1.2.3:6443", "localhost,127.0.0.1", false),
            ("https://127.0.0.1:6443", "localhost,127.0.0.1", true),
            ("https://10.1.2.3:6443", "10.0.0.0/8", true),
            ("https://api.mgmt.example.org:6443", ".example.org", true),
            ("https://api.mgmt.example.org:6443", "example.org", true),
            ("https://api.mgmt.example.org:6443", "*.example.org", false),
            ("https://api.mgmt.example.org:6443", "mgmt.example.com,", false),
            ("https://api.mgmt.example.org:6443", " , api.mgmt.example.org ,", true),
            ("https://[fd00::1]:6443", "fd00::/8", true),
            ("https://anything:6443", "*", true),
        ];
        for (server, no, bypass) in cases {
            let got = chosen(server, None, &env(proxy, None, Some(no)));
            assert_eq!(got.is_none(), bypass, "{server} with NO_PROXY={no:?}: {got:?}");
        }
    }

    #[test]
    fn the_kubeconfigs_proxy_url_overrides_the_environment_and_no_proxy() {
        let e = env(Some("http://env-proxy:3128"), None, Some("*"));
        let got = chosen("https://10.0.0.1:6443", Some("http://kubeconfig-proxy:8080"), &e);
        assert_eq!(got.as_deref(), Some("kubeconfig proxy-url http://kubeconfig-proxy:8080/"));
        assert_eq!(chosen("https://10.0.0.1:6443", Some(" "), &env(None, None, None)), None);
    }

    #[test]
    fn a_proxy_without_a_scheme_is_http_and_keeps_its_credentials_for_the_tunnel() {
        let e = env(Some("user:p%40ss@proxy.corp:3128"), None, None);
        let proxy = choose(&"https://10.0.0.1:6443".parse().unwrap(), None, &e).unwrap().unwrap();
        assert_eq!(proxy.url.to_string(), "http://user:p%40ss@proxy.corp:3128/");
    }

    /// Errors name the proxy by scheme, host and port: a password in it reaches no message.
    #[test]
    fn errors_never_show_the_proxys_credentials() {
        let server: Uri = "https://10.0.0.1:6443".parse().unwrap();
        for (raw, why) in [
            ("socks4://user:secret-pw@proxy:1080", "unsupported scheme"),
            ("socks5://user:secret-pw@proxy:1080", "SOCKS5 proxy with a user name or password"),
            ("ftp://user:secret-pw@proxy:21", "unsupported scheme"),
            ("http://user:secret-pw@", "not a URL"),
            ("http://user:secret-pw@proxy:3128/ bad", "not a URL"),
        ] {
            let err = choose(&server, Some(raw), &ProxyEnv::default()).unwrap_err();
            assert!(err.contains(why), "{raw}: {err}");
            assert!(!err.contains("secret-pw") && !err.contains("user:"), "{raw}: {err}");
            assert!(err.contains("kubeconfig proxy-url"), "{err}");
        }
        let err = choose(&server, None, &env(Some("socks4://u:secret-pw@proxy:1080"), None, None)).unwrap_err();
        assert_eq!(
            err,
            "proxy socks4://proxy:1080 (HTTPS_PROXY): unsupported scheme; use http://, https:// or socks5://"
        );
        assert_eq!(redacted("http://u:p@proxy:3128/path?token=x"), "http://proxy:3128");
        assert_eq!(redacted("not a url at all"), "(unreadable)");
    }
}
