//! Byte comparisons for short ids and route prefixes.
//!
//! The strings a decision compares (tenant and subject ids, route prefixes)
//! are a few dozen bytes at most, where libc's `memcmp`, which `==` on
//! slices calls, costs more in call and vector-unit set-up than the
//! comparison itself (measured: 40% of an embedded decision when keys were
//! compared with it, 9% when route prefixes were; see docs/BENCHMARKS.md).

/// Whether `a` and `b` hold the same bytes, compared eight at a time.
#[inline]
pub fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut a_words = a.chunks_exact(8);
    let mut b_words = b.chunks_exact(8);
    let words_equal = a_words.by_ref().zip(b_words.by_ref()).all(|(x, y)| {
        u64::from_ne_bytes(x.try_into().expect("8 bytes"))
            == u64::from_ne_bytes(y.try_into().expect("8 bytes"))
    });
    words_equal
        && a_words
            .remainder()
            .iter()
            .zip(b_words.remainder())
            .fold(0u8, |diff, (x, y)| diff | (x ^ y))
            == 0
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
