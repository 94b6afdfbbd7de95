//! Numbers as error messages show them.

/// `value` as written for everyday values (`0.8`, `2500`), in exponent
/// form for huge or tiny ones (`1e308`, not 309 digits; `1e-9`).
pub fn shown(value: f64) -> String {
    if value != 0.0 && value.is_finite() && !(1e-6..1e16).contains(&value.abs()) {
        format!("{value:e}")
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn everyday_numbers_as_written_extreme_ones_in_exponent_form() {
        assert_eq!(shown(0.8), "0.8");
        assert_eq!(shown(2500.0), "2500");
        assert_eq!(shown(0.0), "0");
        assert_eq!(shown(-3.5), "-3.5");
        assert_eq!(shown(1e308), "1e308");
        assert_eq!(shown(-2.5e20), "-2.5e20");
        assert_eq!(shown(1e-9), "1e-9");
        assert_eq!(shown(f64::INFINITY), "inf");
    }
}
