//! Byte comparisons for short ids and route prefixes.
//!
//! The strings a decision compares (tenant and subject ids, route prefixes)
//! are a few dozen bytes at most, where libc's `memcmp`, which `==` on
//! slices calls, costs more in call and vector-unit set-up than the
//! comparison itself (measured: 40% of an embedded decision when keys were
//! compared with it, 9% when route prefixes were; see docs/BENCHMARKS.md).

/// Whether `a` and `b` hold the same bytes, compared eight at a time: the
/// whole words, then the last eight bytes (overlapping the words already
/// compared when the length is not a multiple of eight); shorter slices by
/// four-byte halves the same way, then byte by byte.
#[inline]
pub fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n >= 8 {
        let word =
            |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().expect("8 bytes"));
        let mut at = 0;
        while at + 8 < n {
            if word(a, at) != word(b, at) {
                return false;
            }
            at += 8;
        }
        return word(a, n - 8) == word(b, n - 8);
    }
    if n >= 4 {
        let half =
            |s: &[u8], at: usize| u32::from_ne_bytes(s[at..at + 4].try_into().expect("4 bytes"));
        return half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4);
    }
    a.iter().zip(b).all(|(x, y)| x == y)
}

/// Whether `text` begins with `prefix`, compared as [`same`] does.
#[inline]
pub fn starts_with(text: &[u8], prefix: &[u8]) -> bool {
    text.get(..prefix.len())
        .is_some_and(|head| same(head, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_slice_equality_at_every_length_and_difference() {
        let base: Vec<u8> = (0..40u8).collect();
        for len in 0..=base.len() {
            let a = &base[..len];
            assert!(same(a, a));
            assert!(starts_with(&base, a));
            for at in 0..len {
                let mut b = a.to_vec();
                b[at] ^= 0x80;
                assert!(!same(a, &b), "a difference at byte {at} of {len}");
                assert!(!starts_with(&base, &b), "prefix differing at {at} of {len}");
            }
            if len > 0 {
                assert!(!same(a, &a[..len - 1]), "lengths differ");
            }
        }
        assert!(
            !starts_with(b"GET /", b"GET /v1"),
            "a prefix longer than the text"
        );
        assert!(starts_with(b"GET /v1", b""));
    }
}
