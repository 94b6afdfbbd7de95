//! One spelling per route.
//!
//! An exact limit on `POST /v1/invoices` must not be dodged by writing the
//! same request another way. Every interface (the HTTP API, forward-auth,
//! the tower layer) and every route pattern of the configuration go through
//! [`normalize`], so the spelling a client picks does not matter. The rule,
//! for a route of the form `METHOD /path` (anything else is left as it is):
//!
//! 1. the method is upper-cased (`post` → `POST`);
//! 2. an absolute URI loses its scheme and authority
//!    (`http://host/v1/x` → `/v1/x`);
//! 3. the query (`?…`) and the fragment (`#…`) are removed;
//! 4. path parameters (`;jsessionid=…`) are removed from every segment;
//! 5. percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are
//!    decoded (`%69` → `i`); other escapes keep their meaning, hex
//!    upper-cased (`%2f` → `%2F`);
//! 6. `.` and `..` segments are resolved (RFC 3986 §5.2.4: a `..` above the
//!    root stays at the root);
//! 7. repeated slashes collapse into one, and a trailing slash is dropped
//!    (`/v1//invoices/` → `/v1/invoices`; the root stays `/`).
//!
//! So `post //v1/./%69nvoices/;x=1?y#z` is `POST /v1/invoices`.

use std::borrow::Cow;

/// The route in its one spelling; see the module documentation.
pub fn normalize(route: &str) -> Cow<'_, str> {
    let Some((method, target)) = route.split_once(' ') else {
        return Cow::Borrowed(route);
    };
    let method_ok = !method.is_empty() && method.bytes().all(|b| b.is_ascii_alphabetic());
    let target = target.trim_start_matches(' ');
    if !method_ok || !(target.starts_with('/') || has_scheme(target)) {
        return Cow::Borrowed(route);
    }
    if method.bytes().all(|b| b.is_ascii_uppercase())
        && is_normal(target)
        && target.len() + 1 + method.len() == route.len()
    {
        return Cow::Borrowed(route);
    }
    Cow::Owned(from_parts(method, target))
}

/// `METHOD path` from a method and a request target (path, optional query,
/// or absolute URI), in the one spelling.
pub fn from_parts(method: &str, target: &str) -> String {
    let mut out = String::with_capacity(method.len() + 1 + target.len());
    out.extend(method.chars().map(|c| c.to_ascii_uppercase()));
    out.push(' ');
    if is_normal(target) {
        // The common case: already in its one spelling.
        out.push_str(target);
    } else {
        push_path(&mut out, target);
    }
    out
}

fn has_scheme(target: &str) -> bool {
    let lower = |p: &str| {
        target
            .get(..p.len())
            .is_some_and(|t| t.eq_ignore_ascii_case(p))
    };
    lower("http://") || lower("https://")
}

/// Whether `target` is a path already in the one spelling.
fn is_normal(target: &str) -> bool {
    let b = target.as_bytes();
    if b.first() != Some(&b'/') || (b.len() > 1 && b.ends_with(b"/")) {
        return false;
    }
    // One pass over the bytes (every request of both APIs comes here):
    // nothing to decode or cut, and every segment after a `/` neither empty
    // nor `.` nor `..`.
    let mut segment = 0..0;
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'%' | b';' | b'?' | b'#' => return false,
            b'/' => {
                if i > 0 && !is_segment(&b[segment.clone()]) {
                    return false;
                }
                segment = i + 1..i + 1;
            }
            _ => segment.end = i + 1,
        }
    }
    b.len() == 1 || is_segment(&b[segment])
}

/// A segment of a normal path: not empty, not `.` nor `..`.
fn is_segment(segment: &[u8]) -> bool {
    !matches!(segment, b"" | b"." | b"..")
}

/// Appends the path of `target`, normalised, to `out`.
fn push_path(out: &mut String, target: &str) {
    let mut path = target;
    if has_scheme(path) {
        let after = &path[path.find("//").map_or(0, |i| i + 2)..];
        path = after.find('/').map_or("/", |i| &after[i..]);
    }
    let end = path.find(['?', '#']).unwrap_or(path.len());
    let path = &path[..end];
    let start = out.len();
    // Segments on a stack: `..` pops, `.` and empty segments are skipped.
    let mut ends: Vec<usize> = Vec::new();
    for raw in path.split('/') {
        let raw = raw.split_once(';').map_or(raw, |(s, _)| s);
        let mut segment = String::with_capacity(raw.len());
        decode_unreserved(raw, &mut segment);
        match segment.as_str() {
            "" | "." => {}
            ".." => {
                if ends.pop().is_some() {
                    out.truncate(ends.last().copied().unwrap_or(start));
                }
            }
            _ => {
                out.push('/');
                out.push_str(&segment);
                ends.push(out.len());
            }
        }
    }
    if out.len() == start {
        out.push('/');
    }
}

/// Decodes `%XX` escapes of unreserved characters; other escapes are kept,
/// hex upper-cased; a `%` not followed by two hex digits is kept as `%25`.
fn decode_unreserved(segment: &str, out: &mut String) {
    let bytes = segment.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| {
                let h = std::str::from_utf8(h).ok()?;
                u8::from_str_radix(h, 16).ok()
            });
            match hex {
                Some(v) if v.is_ascii_alphanumeric() || b"-._~".contains(&v) => {
                    out.push(char::from(v));
                }
                Some(v) => {
                    out.push('%');
                    out.push_str(&format!("{v:02X}"));
                }
                None => {
                    out.push_str("%25");
                    i += 1;
                    continue;
                }
            }
            i += 3;
        } else {
            // Copy the run up to the next escape as it is (keeps UTF-8 whole).
            let next = bytes[i..]
                .iter()
                .position(|&b| b == b'%')
                .map_or(bytes.len(), |p| i + p);
            out.push_str(&segment[i..next]);
            i = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `is_normal` as first written (three passes), the reference the
    /// one-pass version is held to.
    fn is_normal_reference(target: &str) -> bool {
        let b = target.as_bytes();
        if b.first() != Some(&b'/') || (b.len() > 1 && b.ends_with(b"/")) {
            return false;
        }
        if b.iter().any(|c| matches!(c, b'%' | b';' | b'?' | b'#')) {
            return false;
        }
        !target.contains("//") && !target.split('/').any(|s| s == "." || s == "..")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn is_normal_agrees_with_its_reference(
            target in prop_oneof!["[/.a]{0,10}", "[/.a%;?#]{0,10}"]
        ) {
            prop_assert_eq!(is_normal(&target), is_normal_reference(&target), "{:?}", target);
        }
    }

    #[test]
    fn is_normal_at_the_edges() {
        for (target, normal) in [
            ("/", true),
            ("", false),
            ("/a", true),
            ("/a/", false),
            ("//", false),
            ("/.", false),
            ("/..", false),
            ("/a/.", false),
            ("/.a", true),
            ("/a..", true),
            ("/...", true),
            ("/a//b", false),
            ("/a/./b", false),
            ("/a/..", false),
            ("/a/../b", false),
            ("/v1/things", true),
            ("/v1/things?x", false),
        ] {
            assert_eq!(is_normal(target), normal, "{target:?}");
            assert_eq!(is_normal_reference(target), normal, "{target:?}");
        }
    }

    #[test]
    fn every_spelling_of_a_route_is_one_route() {
        let table = [
            "POST /v1/invoices",
            "post /v1/invoices",
            "Post /v1/invoices",
            "POST /v1/invoices/",
            "POST //v1/invoices",
            "POST /v1//invoices//",
            "POST /v1/%69nvoices",
            "POST /v1/%69%6E%76oices",
            "POST /%76%31/invoices",
            "POST /v1/./invoices",
            "POST /v1/x/../invoices",
            "POST /../v1/invoices",
            "POST /v1/%2e/invoices",
            "POST /v1/x/%2E%2E/invoices",
            "POST /v1/invoices;jsessionid=1",
            "POST /v1;a=b/invoices",
            "POST /v1/invoices?x=1",
            "POST /v1/invoices#top",
            "POST /v1/invoices/?x=1#y",
            "POST http://api.example/v1/invoices?x",
            "POST HTTPS://api.example:443/v1/invoices",
            "POST  /v1/invoices",
        ];
        for spelling in table {
            assert_eq!(normalize(spelling), "POST /v1/invoices", "{spelling:?}");
        }
    }

    #[test]
    fn what_differs_stays_different() {
        for (route, expected) in [
            ("POST /v1/invoices%2Fx", "POST /v1/invoices%2Fx"),
            ("POST /v1/invoices%2fx", "POST /v1/invoices%2Fx"),
            ("POST /v1/in%20voices", "POST /v1/in%20voices"),
            ("POST /v1/100%", "POST /v1/100%25"),
            ("GET /", "GET /"),
            ("GET //", "GET /"),
            ("GET /..", "GET /"),
            ("GET /v1/ünïcode", "GET /v1/ünïcode"),
            ("invoices.create", "invoices.create"),
            ("rpc Method", "rpc Method"),
            ("*", "*"),
        ] {
            assert_eq!(normalize(route), expected, "{route:?}");
        }
    }

    #[test]
    fn a_normal_route_is_borrowed() {
        assert!(matches!(normalize("POST /v1/invoices"), Cow::Borrowed(_)));
        assert!(matches!(normalize("GET /"), Cow::Borrowed(_)));
        assert!(matches!(normalize("post /v1"), Cow::Owned(_)));
    }

    #[test]
    fn from_parts_joins_method_and_target() {
        assert_eq!(from_parts("get", "/v1/reports/42/?a"), "GET /v1/reports/42");
    }
}
