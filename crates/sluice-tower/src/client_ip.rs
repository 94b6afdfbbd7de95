//! The client's IP address, believed only from trusted proxies.
//!
//! The address of the peer that connected is the client's, unless that
//! peer is a trusted proxy: then the forwarding header those proxies
//! write says who came before it. It is read from the right (the hop
//! nearest to us) and the first address that is not a trusted proxy is the
//! client: anything to its left was written by the client itself and could
//! be spoofed. Only the header the proxies write is read
//! ([`ClientIpHeader`]: `X-Forwarded-For` unless told `Forwarded`): a
//! proxy passes the other one along as the client wrote it. A request
//! without a known peer (in-process tests, unix sockets) believes no
//! header.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use ipnet::IpNet;
pub use sluice_core::config::ClientIpHeader;

/// The peer of a connection, as the server puts it in a request's
/// extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub SocketAddr);

/// The client's address: see the module documentation.
pub fn client_ip(
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    trusted: &[IpNet],
    header: ClientIpHeader,
) -> Option<IpAddr> {
    let peer = peer?;
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return Some(peer);
    }
    let hops = forwarded_for(headers, header);
    let mut client = peer;
    for hop in hops.iter().rev() {
        client = *hop;
        if !is_trusted(hop) {
            break;
        }
    }
    Some(client)
}

/// The addresses of `header` (`X-Forwarded-For`, or `Forwarded: for=…`),
/// in order; an unreadable entry ends the list there (nothing to its left
/// is believed).
fn forwarded_for(headers: &HeaderMap, header: ClientIpHeader) -> Vec<IpAddr> {
    let entries: Vec<&str> = match header {
        ClientIpHeader::Forwarded => headers
            .get_all(http::header::FORWARDED)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|element| {
                element.split(';').find_map(|pair| {
                    let (name, value) = pair.trim().split_once('=')?;
                    name.eq_ignore_ascii_case("for").then_some(value.trim())
                })
            })
            .collect(),
        ClientIpHeader::XForwardedFor => headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect(),
    };
    let mut out = Vec::new();
    // Read from the right; stop at the first entry that is no address.
    for entry in entries.iter().rev() {
        match parse(entry) {
            Some(ip) => out.push(ip),
            None => break,
        }
    }
    out.reverse();
    out
}

/// An address as forwarding headers write it: `1.2.3.4`, `1.2.3.4:80`,
/// `"[2001:db8::1]:443"`, `2001:db8::1`.
fn parse(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim_matches('"');
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = entry.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    entry
        .strip_prefix('[')
        .and_then(|e| e.split_once(']'))
        .and_then(|(ip, _)| ip.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let via = |pairs: &[(&str, &str)], header| {
            client_ip(Some(ip("10.0.0.2")), &headers(pairs), &trusted, header)
        };
        // The client wrote a spoofed address first; the proxies appended
        // the real one.
        assert_eq!(
            via(
                &[("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.0.0.5")],
                ClientIpHeader::XForwardedFor
            ),
            Some(ip("203.0.113.7"))
        );
        assert_eq!(
            via(
                &[(
                    "forwarded",
                    "for=6.6.6.6, for=\"[2001:db8::7]:443\";proto=https"
                )],
                ClientIpHeader::Forwarded
            ),
            Some(ip("2001:db8::7"))
        );
        assert_eq!(
            via(&[], ClientIpHeader::XForwardedFor),
            Some(ip("10.0.0.2")),
            "no header: the proxy itself"
        );
        assert_eq!(
            via(
                &[("x-forwarded-for", "10.0.0.9")],
                ClientIpHeader::XForwardedFor
            ),
            Some(ip("10.0.0.9")),
            "every hop trusted: the leftmost"
        );
        assert_eq!(
            via(
                &[("x-forwarded-for", "6.6.6.6, garbage, 203.0.113.9")],
                ClientIpHeader::XForwardedFor
            ),
            Some(ip("203.0.113.9"))
        );
    }

    #[test]
    fn a_forwarded_header_the_client_wrote_is_not_believed_behind_an_x_forwarded_for_proxy() {
        // nginx, HAProxy, Traefik, Caddy and Envoy append the client to
        // `X-Forwarded-For` and pass any `Forwarded` the client sent along
        // untouched: reading it would let a client pick its own address
        // (a fresh per-IP budget for every request).
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let sent = headers(&[
            ("forwarded", "for=6.6.6.6"),
            ("x-forwarded-for", "203.0.113.7"),
        ]);
        let peer = Some(ip("10.0.0.2"));
        assert_eq!(
            client_ip(peer, &sent, &trusted, ClientIpHeader::XForwardedFor),
            Some(ip("203.0.113.7"))
        );
        // Behind a proxy that writes `Forwarded`, the other way round.
        let sent = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("forwarded", "for=203.0.113.7"),
        ]);
        assert_eq!(
            client_ip(peer, &sent, &trusted, ClientIpHeader::Forwarded),
            Some(ip("203.0.113.7"))
        );
        assert_eq!(ClientIpHeader::default(), ClientIpHeader::XForwardedFor);
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let spoofed = headers(&[("x-forwarded-for", "1.2.3.4"), ("forwarded", "for=1.2.3.4")]);
        assert_eq!(
            client_ip(
                Some(ip("198.51.100.1")),
                &spoofed,
                &trusted,
                ClientIpHeader::Forwarded
            ),
            Some(ip("198.51.100.1"))
        );
        assert_eq!(
            client_ip(None, &spoofed, &trusted, ClientIpHeader::XForwardedFor),
            None
        );
    }
}
