//! Which outcomes a `count_if` rule counts: response status codes, and
//! classes of them (`"4xx"`).

use std::fmt;

/// A set of HTTP status codes (100..=599), as `count_if: { status: [...] }`
/// writes it: codes such as `401`, classes such as `"4xx"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StatusSet {
    /// Bit `c` set: every code of class `c`xx (1..=5).
    classes: u8,
    /// Single codes, sorted.
    codes: Box<[u16]>,
}

/// Why an entry of `count_if.status` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`count_if.status` takes status codes from 100 to 599 or classes \"1xx\" to \"5xx\", got `{0}`"
)]
pub struct StatusError(pub String);

impl StatusSet {
    /// The set of `entries`, each a code (`"401"` or 401 written as text)
    /// or a class (`"4xx"`, `"4XX"`).
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<StatusSet, StatusError> {
        let mut classes = 0u8;
        let mut codes = Vec::new();
        for entry in entries {
            let bytes = entry.as_bytes();
            let class = match bytes {
                [c @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] => Some(c - b'0'),
                _ => None,
            };
            if let Some(class) = class {
                classes |= 1 << class;
                continue;
            }
            match entry.parse::<u16>() {
                Ok(code) if (100..=599).contains(&code) && bytes.len() == 3 => codes.push(code),
                _ => return Err(StatusError(entry.to_owned())),
            }
        }
        codes.sort_unstable();
        codes.dedup();
        Ok(StatusSet {
            classes,
            codes: codes.into(),
        })
    }

    /// Whether a response of `status` is counted.
    pub fn matches(&self, status: u16) -> bool {
        let class = status / 100;
        ((1..=5).contains(&class) && self.classes & (1 << class) != 0)
            || self.codes.binary_search(&status).is_ok()
    }
}

impl fmt::Display for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let classes = (1..=5u8)
            .filter(|c| self.classes & (1 << c) != 0)
            .map(|c| format!("{c}xx"));
        let codes = self.codes.iter().map(u16::to_string);
        let all: Vec<String> = classes.chain(codes).collect();
        write!(f, "[{}]", all.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_classes_match_what_they_name() {
        let set = StatusSet::parse(["401", "403", "5xx"]).unwrap();
        assert!(set.matches(401) && set.matches(403));
        assert!(set.matches(500) && set.matches(599));
        assert!(!set.matches(200) && !set.matches(404) && !set.matches(400));
        assert_eq!(set.to_string(), "[5xx, 401, 403]");
    }

    #[test]
    fn anything_else_is_refused_by_name() {
        for bad in ["99", "600", "4x", "6xx", "0401", "abc", ""] {
            let err = StatusSet::parse([bad]).unwrap_err().to_string();
            assert!(
                err.contains("count_if.status") && err.contains(bad),
                "{err}"
            );
        }
    }
}
