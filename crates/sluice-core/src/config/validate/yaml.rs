//! serde-saphyr's errors in the file's own words.

use serde_saphyr::Location;

/// serde-saphyr's message without its source snippet or position (we print
/// the position ourselves, as `file:line:column`); a value of the wrong type
/// is reported with its field's name and what the field takes (never with
/// the value, which may be a secret such as a URL with a password).
pub(in crate::config) fn yaml_message(
    error: &serde_saphyr::Error,
    text: &str,
    at: Location,
) -> String {
    // (serde-saphyr's own words advise a setting of its API.)
    if let serde_saphyr::Error::DuplicateMappingKey { key, .. } = error.without_snippet() {
        return match key {
            Some(key) => format!("`{key}` is given twice in one mapping: give each key once"),
            None => "a key is given twice in one mapping: give each key once".to_owned(),
        };
    }
    let full = error.without_snippet().to_string();
    let first = full.lines().next().unwrap_or("invalid YAML").trim();
    let message = match first.rfind(" at line ") {
        Some(at) => &first[..at],
        None => first,
    };
    let expected = match message {
        "invalid i64" | "invalid u64" | "invalid i32" | "invalid u32" => "a whole number",
        "invalid boolean" => "true or false",
        "invalid floating point" => "a number (e.g. 0.8)",
        "expected string scalar" => "one value (text), not a list or a map",
        "expected sequence start" => "a list (`[a, b]`, or one `- ` item per line)",
        "expected mapping start" => "a map (`key: value` pairs, or `{ key: value }`)",
        _ => return message.to_owned(),
    };
    match field_at(text, at) {
        Some(field) => format!("`{field}` must be {expected}"),
        None => format!("expected {expected} here"),
    }
}

/// The name of the key whose value starts at `at`, on the same line
/// (`name: value`, in block or flow style).
fn field_at(text: &str, at: Location) -> Option<String> {
    let line = text
        .lines()
        .nth(usize::try_from(at.line()).ok()?.checked_sub(1)?)?;
    let before: String = line
        .chars()
        .take(usize::try_from(at.column()).ok()?.saturating_sub(1))
        .collect();
    let head = before[..before.rfind(':')?].trim_end();
    let name: String = head
        .chars()
        .rev()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '-')
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    (!name.is_empty()).then_some(name)
}
