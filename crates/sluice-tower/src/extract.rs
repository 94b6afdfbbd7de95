//! What a request is limited by: its tenant, route, subject and cost, read
//! from the request before the inner service sees it.

use http::HeaderName;
use sluice_core::request::check_cost_signed;

use crate::answer::InvalidRequest;

/// The keys of one request, owned (the request itself goes on to the inner
/// service).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// The tenant whose budgets apply.
    pub tenant: String,
    /// The route, `METHOD path`, matched against the plans' route patterns.
    pub route: String,
    /// The subject (user, API key) for subject-scope rules.
    pub subject: Option<String>,
    /// Units the request consumes (1 for most).
    pub cost: u64,
    /// What tells two submissions apart for a route's duplicate guard
    /// (an idempotency key); `None`: one per window per subject.
    pub fingerprint: Option<String>,
}

/// Reads a request's [`Keys`]; a refusal is answered 400 with the field at
/// fault, and the inner service is not called.
///
/// Closures `Fn(&http::Request<B>) -> Result<Keys, InvalidRequest>`
/// implement it, for keys that come from elsewhere (an authenticated
/// identity in the request's extensions, say).
pub trait Extract<B>: Clone + Send + Sync + 'static {
    /// The keys of `request`.
    fn extract(&self, request: &http::Request<B>) -> Result<Keys, InvalidRequest>;
}

impl<B, F> Extract<B> for F
where
    F: Fn(&http::Request<B>) -> Result<Keys, InvalidRequest> + Clone + Send + Sync + 'static,
{
    fn extract(&self, request: &http::Request<B>) -> Result<Keys, InvalidRequest> {
        self(request)
    }
}

/// Keys from headers: the tenant from one header (required), the subject
/// and cost from others (optional); the route is the request's own method
/// and path, without the query.
///
/// Put it behind whatever authenticates the tenant: a client that can set
/// the tenant header can spend any tenant's budget. A header it reads that
/// comes more than once is refused (see [`header_text`]).
#[derive(Debug, Clone)]
pub struct FromHeaders {
    /// `None`: every request is one tenant's (limits declared per route).
    tenant: Option<HeaderName>,
    subject: Option<HeaderName>,
    cost: Option<HeaderName>,
    fingerprint: HeaderName,
    /// The subject is the client's IP, behind these trusted proxies.
    client_ip: Option<Vec<ipnet::IpNet>>,
    client_ip_header: crate::ClientIpHeader,
}

impl FromHeaders {
    /// The tenant from `tenant`.
    pub fn new(tenant: HeaderName) -> FromHeaders {
        FromHeaders::optional_tenant(Some(tenant))
    }

    /// The tenant from `tenant`, or, when `None`, one tenant (`-`) for
    /// every request.
    pub fn optional_tenant(tenant: Option<HeaderName>) -> FromHeaders {
        FromHeaders {
            tenant,
            subject: None,
            cost: None,
            fingerprint: HeaderName::from_static("idempotency-key"),
            client_ip: None,
            client_ip_header: crate::ClientIpHeader::XForwardedFor,
        }
    }

    /// The subject is the client's IP address ([`crate::client_ip`]):
    /// the connection's peer, or behind `trusted` proxies the rightmost
    /// untrusted hop of the header they write (`X-Forwarded-For`, or see
    /// [`client_ip_header`](Self::client_ip_header)). The server puts
    /// the peer in the request's extensions as a [`crate::Peer`] (sluice
    /// does; an axum app maps its `ConnectInfo` to it). Without a peer the
    /// request has no subject.
    pub fn client_ip(mut self, trusted: Vec<ipnet::IpNet>) -> FromHeaders {
        self.client_ip = Some(trusted);
        self
    }

    /// The header the trusted proxies write the client's address in
    /// (default `X-Forwarded-For`); the other one is never read, since a
    /// proxy passes it along as the client wrote it.
    pub fn client_ip_header(mut self, header: crate::ClientIpHeader) -> FromHeaders {
        self.client_ip_header = header;
        self
    }

    /// The fingerprint of the duplicate guard from `header` (default
    /// `Idempotency-Key`, as forward-auth reads it); without the header,
    /// the digest of the body when a
    /// [`BodyDigestLayer`](crate::digest::BodyDigestLayer) runs first.
    pub fn fingerprint(mut self, header: HeaderName) -> FromHeaders {
        self.fingerprint = header;
        self
    }

    /// The subject from `header`, when the request has it.
    pub fn subject(mut self, header: HeaderName) -> FromHeaders {
        self.subject = Some(header);
        self
    }

    /// The cost from `header` (a whole number, 1 when absent).
    pub fn cost(mut self, header: HeaderName) -> FromHeaders {
        self.cost = Some(header);
        self
    }
}

/// The one value of header `name` as text, `None` when absent. Refused
/// when not visible ASCII, or when sent more than once: of two tenants (or
/// subjects, or costs) whichever a reader took first would be the one
/// whoever added a header chose. `name` a `&HeaderName` where one is at
/// hand: from a `&str` the name is parsed on every call.
pub fn header_text<K>(headers: &http::HeaderMap, name: K) -> Result<Option<&str>, InvalidRequest>
where
    K: http::header::AsHeaderName + std::fmt::Display + Copy,
{
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let more = values.count();
    if more > 0 {
        return Err(InvalidRequest::new(
            name.to_string(),
            format!("header `{name}` must be sent once, got {} values", more + 1),
        ));
    }
    value.to_str().map(Some).map_err(|_| {
        InvalidRequest::new(
            name.to_string(),
            format!("header `{name}` must be visible ASCII"),
        )
    })
}

/// The cost in header `name`: a whole number within the bounds of
/// [`check_cost_signed`], 1 when the header is absent.
pub fn header_cost<K>(headers: &http::HeaderMap, name: K) -> Result<u64, InvalidRequest>
where
    K: http::header::AsHeaderName + std::fmt::Display + Copy,
{
    let Some(text) = header_text(headers, name)? else {
        return Ok(1);
    };
    let number: i128 = text.trim().parse().map_err(|_| {
        InvalidRequest::new(
            name.to_string(),
            format!("header `{name}` must be a whole number, got `{text}`"),
        )
    })?;
    check_cost_signed(number).map_err(|e| InvalidRequest::new(name.to_string(), e.to_string()))
}

impl<B> Extract<B> for FromHeaders {
    fn extract(&self, request: &http::Request<B>) -> Result<Keys, InvalidRequest> {
        let headers = request.headers();
        let text = |name: &HeaderName| -> Result<Option<String>, InvalidRequest> {
            Ok(header_text(headers, name)?.map(str::to_owned))
        };
        let tenant = match &self.tenant {
            None => "-".to_owned(),
            Some(name) => text(name)?.ok_or_else(|| {
                InvalidRequest::new(name.as_str(), format!("header `{name}` is required"))
            })?,
        };
        let subject = match (&self.subject, &self.client_ip) {
            (Some(name), _) => text(name)?,
            (None, Some(trusted)) => {
                let peer = request.extensions().get::<crate::Peer>().map(|p| p.0.ip());
                crate::client_ip(peer, headers, trusted, self.client_ip_header)
                    .map(|ip| ip.to_string())
            }
            (None, None) => None,
        };
        let cost = match &self.cost {
            Some(name) => header_cost(headers, name)?,
            None => 1,
        };
        // The header, else the digest of the body when a `BodyDigestLayer`
        // took one.
        let fingerprint = match text(&self.fingerprint)? {
            Some(header) => Some(header),
            None => request
                .extensions()
                .get::<crate::digest::BodyDigest>()
                .map(|d| d.0.clone()),
        };
        Ok(Keys {
            fingerprint,
            tenant,
            route: sluice_core::route::from_parts(request.method().as_str(), request.uri().path()),
            subject,
            cost,
        })
    }
}
