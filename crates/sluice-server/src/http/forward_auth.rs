//! `/v1/forward-auth`: a decision from the headers a gateway forwards.
//!
//! Traefik ForwardAuth and Caddy `forward_auth` send the original request's
//! method and URI as `X-Forwarded-Method` and `X-Forwarded-Uri`; nginx
//! `auth_request` is configured to send `X-Original-Method` and
//! `X-Original-URI`. By default the first of those present counts, in that
//! order; `server.forward_auth.method_header` and `uri_header` name the
//! one header to read instead. The tenant (and optionally the subject and cost) come
//! from configurable headers. The route is `METHOD path` in its one
//! spelling ([`sluice_core::route`]: query, fragment, path parameters, dot
//! segments and extra slashes removed, unreserved escapes decoded).
//!
//! The answer is 200 (let the request through) or 429 (reject it, with
//! `Retry-After`), both with the `RateLimit` fields; the gateway relays a
//! 429 to the client as it is.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use sluice_core::{Request, route};

use super::respond::refusal;
use crate::app::App;
use sluice_tower::InvalidRequest;
use sluice_tower::extract::{header_cost, header_text};

pub(super) async fn forward_auth(
    State(app): State<Arc<App>>,
    peer: Option<axum::Extension<sluice_tower::Peer>>,
    headers: HeaderMap,
) -> Response {
    let config = &app.forward_auth;
    // The client's address, believed from forwarding headers only through
    // trusted proxies.
    let client_ip = if config.client_ip_subject {
        sluice_tower::client_ip(
            peer.map(|p| p.0.0.ip()),
            &headers,
            &config.trusted_proxies,
            config.client_ip_header,
        )
        .map(|ip| ip.to_string())
    } else {
        None
    };
    let parsed = (|| {
        let tenant = header_text(&headers, &config.tenant_header)?.ok_or_else(|| {
            InvalidRequest::new(
                config.tenant_header.as_str(),
                format!("header `{}` is required", config.tenant_header),
            )
        })?;
        let (method, _) = first_of(&headers, &config.method_headers)?;
        let (uri, uri_header) = first_of(&headers, &config.uri_headers)?;
        let subject = match &config.subject_header {
            Some(name) => header_text(&headers, name)?,
            None => client_ip.as_deref(),
        };
        let cost = match &config.cost_header {
            Some(name) => header_cost(&headers, name)?,
            None => 1,
        };
        let fingerprint = header_text(&headers, &config.fingerprint_header)?;
        Ok::<_, InvalidRequest>((
            tenant,
            route::from_parts(method, uri),
            subject,
            cost,
            fingerprint,
            uri_header,
        ))
    })();
    let (tenant, route, subject, cost, fingerprint, uri_header) = match parsed {
        Ok(parts) => parts,
        Err(problem) => return refusal(&problem),
    };
    let request = match Request::new(tenant, &route, subject, cost)
        .and_then(|r| r.with_fingerprint(fingerprint))
    {
        Ok(request) => request,
        Err(e) => {
            // The gateway sent headers, not fields: the problem names the
            // header that carried the field at fault.
            let header = match e.field {
                "tenant" => Some(config.tenant_header.as_str()),
                "route" => Some(uri_header),
                "subject" => config.subject_header.as_deref(),
                "cost" => config.cost_header.as_deref(),
                "fingerprint" => Some(config.fingerprint_header.as_str()),
                _ => None,
            };
            let problem = match header {
                Some(name) => InvalidRequest::new(name, format!("header `{name}`: {e}")),
                None => InvalidRequest::from(e),
            };
            return refusal(&problem);
        }
    };
    super::check::decided(&app, &request, super::check::Handed::Header).await
}

/// The first of `names` the gateway sent, with the header it came from:
/// the gateway's own header is listed first, so one it overwrote is never
/// passed over for one a client may have written.
fn first_of<'h>(
    headers: &'h HeaderMap,
    names: &'h [String],
) -> Result<(&'h str, &'h str), InvalidRequest> {
    for name in names {
        if let Some(value) = header_text(headers, name)? {
            return Ok((value, name));
        }
    }
    let first = names.first().map_or("", String::as_str);
    Err(InvalidRequest::new(
        first,
        format!(
            "forward-auth needs the original request's method and URI: one of the headers {} is required (server.forward_auth.method_header and uri_header)",
            names.join(", ")
        ),
    ))
}
